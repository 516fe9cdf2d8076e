"""relay: its errors, each naming the argument or config key, and the configs and buffer
layouts its checks must let through."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import bad, bad_inputs_test
from tests.recipes.test_relay import check, hard, poison, slots

R = importlib.import_module("recipes.relay")


# --- errors ------------------------------------------------------------------------------
def test_errors(device):
    idx = torch.tensor([0, 1], device=device)
    a = torch.zeros(2, 4, device=device)
    p = torch.zeros(5, 4, device=device)
    sc = recipes.relay_scatter
    with pytest.raises(ValueError, match="fields.*1 to 8.*got 0"):
        sc(idx, [])
    with pytest.raises(ValueError, match="fields.*1 to 8.*got 9"):
        sc(idx, [(a, p)] * 9)
    with pytest.raises(TypeError, match="fields.*list or tuple.*Tensor"):
        sc(idx, a)
    with pytest.raises(TypeError, match=r"fields\[0\].*\(src, dst\) pair.*length 3"):
        sc(idx, [(a, p, p)])
    with pytest.raises(ValueError, match=r"fields\[0\].*same trailing shape.*\(2, 4\).*\(5, 3\)"):
        sc(idx, [(a, torch.zeros(5, 3, device=device))])
    with pytest.raises(ValueError, match=r"fields\[0\] src.*2 rows.*\(3, 4\)"):
        sc(idx, [(torch.zeros(3, 4, device=device), p)])
    with pytest.raises(ValueError, match=r"fields\[0\] dst.*2 rows.*\(5, 4\)"):
        recipes.relay_gather(idx, [(p, p)])
    with pytest.raises(ValueError, match=r"fields\[1\] dst.*contiguous rows.*strides"):
        sc(idx, [(a, p), (torch.zeros(2, 3, device=device),
                          torch.zeros(3, 5, device=device).t())])
    with pytest.raises(ValueError, match=r"fields\[0\] dst.*overlap"):
        sc(idx, [(a, torch.zeros(1, 4, device=device).expand(5, 4))])
    with pytest.raises(TypeError, match=r"fields\[0\].*cannot cast src float32 to dst int64"):
        sc(idx, [(a, p.long())])
    with pytest.raises(TypeError, match=r"fields\[0\].*cannot cast src int32 to dst bfloat16"):
        recipes.relay_gather(idx, [(p.int(), a.bfloat16())])
    with pytest.raises(TypeError, match=r"fields\[0\].*cannot cast src float64 to dst float32"):
        sc(idx, [(a.double(), p)])
    with pytest.raises(TypeError, match=r"fields\[0\] src.*dtype.*complex64"):
        sc(idx, [(a.to(torch.complex64), p)])
    with pytest.raises(TypeError, match="index.*int32/int64.*float32"):
        sc(idx.float(), [(a, p)])
    with pytest.raises(TypeError, match="index.*int32/int64.*int16"):
        sc(idx.short(), [(a, p)])
    with pytest.raises(ValueError, match="index.*1-D.*got shape \\(1, 2\\)"):
        sc(idx[None], [(a, p)])
    with pytest.raises(ValueError, match=r"fields\[0\] src.*at least 1 dim"):
        sc(idx, [(torch.tensor(1.0, device=device), p)])
    with pytest.raises(ValueError, match=r"fields\[0\] dst.*expected a tensor on .*meta"):
        sc(idx, [(a, p.to("meta"))])
    with pytest.raises(ValueError, match="config.*unknown keys.*BLOCK_V"):
        sc(idx, [(a, p)], config={"BLOCK_V": 128})
    with pytest.raises(ValueError, match="mode.*scatter.*gather"):
        R.reference(idx, [(a, p)], "scatterr")


def _rl(build, gather=False):
    """A call on index [2] (slots 0, 1), a batch [2, 4] and a pool [5, 4]:
    build(idx, a, p) -> (fields, config)."""
    def call(dev):
        idx = torch.tensor([0, 1], device=dev)
        a, p = torch.zeros(2, 4, device=dev), torch.zeros(5, 4, device=dev)
        fields, cfg = build(idx, a, p)
        fn = recipes.relay_gather if gather else recipes.relay_scatter
        return fn(idx, fields, config=cfg)
    return call


BAD = [
    bad("BLOCK=100", _rl(lambda i, a, p: ([(a, p)], {"BLOCK": 100})), ValueError,
        r"config\['BLOCK'\]: expected one of \(128, 256, .*8192\).*got 100"),
    bad("ROWS=3", _rl(lambda i, a, p: ([(a, p)], {"ROWS": 3})), ValueError,
        r"config\['ROWS'\].*\(1, 2, 4, 8, 16\).*got 3"),
    bad("num_warps=16", _rl(lambda i, a, p: ([(a, p)], {"num_warps": 16})), ValueError,
        r"config\['num_warps'\].*got 16"),
    bad("SINGLE=2", _rl(lambda i, a, p: ([(a, p)], {"SINGLE": 2})), ValueError,
        r"config\['SINGLE'\].*\(0, 1\).*got 2"),
    bad("one dst in two fields", _rl(lambda i, a, p: ([(a, p), (a.clone(), p)], None)),
        ValueError, r"fields\[[01]\] dst: expected a tensor that shares no memory with "
        r"fields\[[01]\] dst"),
    bad("gather dst inside its src", _rl(lambda i, a, p: ([(p, p[:2])], None), gather=True),
        ValueError, r"fields\[0\] dst: expected a tensor that shares no memory with "
        r"fields\[0\] src"),
    bad("dst over another field's src",
        _rl(lambda i, a, p: ([(a, p), (p[:2], torch.zeros_like(p))], None)), ValueError,
        r"fields\[0\] dst: expected a tensor that shares no memory with fields\[1\] src"),
    bad("dst over the index", lambda dev: (lambda pool: recipes.relay_scatter(
        pool[:2], [(torch.zeros(2, dtype=torch.int64, device=dev), pool)]))(
        torch.zeros(5, dtype=torch.int64, device=dev)), ValueError,
        r"fields\[0\] dst: expected a tensor that shares no memory with index"),
]


test_bad_inputs = bad_inputs_test(BAD)


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_pruned_config_shared_src_and_adjacent_dsts(device, mode):
    """The constraint only prunes the tuner's search: SINGLE=1 at B > 1, ROWS past the
    batch and 1-element-a-thread tiles give the same bits. One src read by two fields,
    and two dsts side by side in one allocation, are no overlap."""
    B, P, W = 3, 5, 6
    index = slots(B, P, torch.int64, device, seed=2)
    cfg = {"BLOCK": 8192, "ROWS": 16, "num_warps": 8, "SINGLE": 1}
    assert not R.constraint(cfg, R.tune_key(mode, B, W, 2))
    n_src, n_dst = (B, P) if mode == "scatter" else (P, B)
    src = hard((n_src, W), torch.float32, 5).to(device)
    both = poison((2 * n_dst, W), torch.float32, device)
    check(mode, index, [(src, both[:n_dst]), (src, both[n_dst:])], config=cfg,
          what="shared src, adjacent dsts")


def test_validation_cache_never_hides_errors(device):
    """Validation results are cached per argument signature; a call that differs in
    anything validated (strides, device, dtype, pair shape) is checked again."""
    idx = torch.tensor([1, 0], device=device)
    a, p = torch.zeros(2, 3, 4, device=device), torch.zeros(5, 3, 4, device=device)
    recipes.relay_scatter(idx, [(a, p)])
    recipes.relay_scatter(idx, [(a, p)])                      # cached
    with pytest.raises(ValueError, match="contiguous rows"):
        recipes.relay_scatter(idx, [(a, torch.zeros(5, 4, 3, device=device).transpose(1, 2))])
    with pytest.raises(ValueError, match="expected a tensor on"):
        recipes.relay_scatter(idx, [(a, p.to("meta"))])
    with pytest.raises(TypeError, match="cannot cast"):
        recipes.relay_scatter(idx, [(a, p.long())])
    with pytest.raises(TypeError, match=r"\(src, dst\) pair"):
        recipes.relay_scatter(idx, [[a, p, p]])
    with pytest.raises(TypeError, match=r"\(src, dst\) pair"):
        recipes.relay_scatter(idx, [torch.stack([a, a])])

