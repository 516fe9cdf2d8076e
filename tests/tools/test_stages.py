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

