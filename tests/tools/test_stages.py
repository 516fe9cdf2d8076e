"""The stage pricings (tools/stages.py, tools/sampled_stages.py) check each stage's
outputs before timing it; here on small shapes, so the scripts keep working."""
import torch


def test_stage_pricing_kernels_compute_their_stage(device):
    """tools/stages.py (chain_verify and the SGLang adapter priced stage by stage at small
    batches) checks each stage's outputs before timing it; here on a small shape, so the
    script keeps working."""
    from tools import stages

    shape = stages.Shape(1, 4, 3000, torch.bfloat16, device, sets=1)
    configs = stages.configs_for(shape)
    assert {label for label, _ in configs} >= {"heuristic"}
    for _, cfg in configs[:2]:
        shape.check(cfg)
    shape.only = ["read", "chain_verify"]        # --stages: only these are timed
    assert set(shape.timed_calls(configs[0][1])) == {"read", "chain_verify"}


def test_sampled_stage_pricing_kernels_compute_their_stage(device):
    """tools/sampled_stages.py (the sampled verify priced stage by stage) checks each
    stage's outputs before timing it; here on a small shape, so the script keeps working."""
    from tools import sampled_stages as SS

    shape = SS.SampledShape(1, 4, 3000, torch.bfloat16, device, sets=1)
    configs = shape.configs()
    assert {label for label, _ in configs} >= {"heuristic", "1024/4w"}
    assert set(shape.calls(configs[0][1])) == set(SS.STAGES)
    for _, cfg in configs[:2]:
        shape.check(cfg)



def test_controls_stage_kernels_run_the_recipe_pieces(device):
    """tools/controls_stages.py runs each piece of the controls paths alone: every stage
    launches on a small row set, and the chunk-top stage leaves each chunk's 32 largest
    ids (by logit, distinct float32 values) in its lists."""
    from recipes import _controls_core as CC
    from tools import controls_stages as CS

    R, V, cfg = 2, 5000, {"BLOCK_V": 1024, "SPLIT": 3, "num_warps": 4}
    split, tiles = 3, 2
    x = torch.randn(R, V, generator=torch.Generator().manual_seed(3)).to(device)
    n = R * split
    scratch = (torch.zeros(n, dtype=torch.int64, device=device),
               torch.full((n * CC.NC,), CS.EMPTY, dtype=torch.int64, device=device),
               torch.full((n * CC.CAP,), CS.EMPTY, dtype=torch.int64, device=device))
    CS.stage_call(CS.CHUNK_TOP, x, cfg, scratch)(None)
    idb = CC.id_bits(V)
    ids = (2**idb - 1) - (scratch[2].view(R, split, CC.CAP).cpu() & (2**idb - 1))
    for r in range(R):
        for c in range(split):
            lo = c * tiles * 1024
            want = torch.topk(x[r, lo:lo + tiles * 1024].cpu(), CC.CAP).indices + lo
            assert torch.equal(ids[r, c], want)
    assert (scratch[1] == CS.EMPTY).all()          # the compaction slots back at rest
    for stage in range(7):
        CS.stage_call(stage, x, cfg, scratch)(None)
