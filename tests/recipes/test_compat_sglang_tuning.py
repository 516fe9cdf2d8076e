"""recipes.compat.sglang's dispatch and tuning: each helper asks its own table (timed with
its own launch), the tuner's declarations of those launches give SGLang's answers and
the compositions', and the verify launch keeps the plain kernel's registers.
"""
import importlib

import pytest
import torch

from recipes.compat import sglang as S
from tests.recipes.test_compat_sglang import (
    _verify_args,
    assert_outputs,
    sglang_target_verify,
    unique_max_logits,
)
from tests.recipes.test_compat_sglang_composed import TAIL_SMALL

CV = importlib.import_module("recipes.chain_verify")


def test_verify_dispatches_on_its_own_table(device):
    """With config=None the adapter asks its own table (`sglang_target_verify`, timed
    with SGLang's epilogue) with chain_verify's key for the shape, never chain_verify's
    table; without an entry it runs chain_verify's heuristic."""
    from recipes._configs import trace_configs
    from recipes.chain_verify import heuristic, tune_key

    x, cand, ridx, rnext, seq = _verify_args(device)
    B, N = cand.shape
    with trace_configs() as trace:
        S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
        CV.chain_verify(x, cand[:, 1:])
    key = tune_key(x.dtype, x.shape[-1], B, N - 1)
    assert [(r, k) for r, k, _ in trace] == [(S.VERIFY_TABLE, key), ("chain_verify", key)]
    if device.type != "cuda":
        assert trace[0][2] is None                       # no tables off the GPU
    got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq,
                                            config=heuristic(key, device))
    assert_outputs(got, sglang_target_verify(x, cand, ridx, rnext, seq), "heuristic")


@pytest.mark.parametrize("cfg", [
    None,
    {"BLOCK_V": 2048, "SPLIT": 1, "num_warps": 16, "UNROLL": 2},
    {"BLOCK_V": 1024, "SPLIT": 1, "num_warps": 8, "UNROLL": 1},
    {"BLOCK_V": 1024, "SPLIT": 32, "num_warps": 4, "UNROLL": 1},
])
def test_verify_epilogue_keeps_the_plain_kernels_registers(device, monkeypatch, cfg):
    """chain_verify's tables time the kernel without SGLang's epilogue; the adapter's
    launch is held to that kernel's registers (`recipes._registers.matching_cap`), so a
    tuned config keeps its programs an SM (the epilogue once took 2048/16-warp and
    1024/8-warp tiles from 32 to 38 registers). On the GPU: the capped variant uses no
    more registers than the plain one and does not spill; outputs stay exact."""
    seen = []
    real = CV.matching_cap

    def spy(kernel, args, meta, plain, dev):
        cap = real(kernel, args, meta, plain, dev)
        seen.append((args, dict(meta), plain, cap))
        return cap

    monkeypatch.setattr(CV, "matching_cap", spy)
    x, cand, ridx, rnext, seq = _verify_args(device)
    got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq, config=cfg)
    assert_outputs(got, sglang_target_verify(x, cand, ridx, rnext, seq), f"config {cfg}")
    assert len(seen) == 1 and seen[0][1]["SGLANG"] is True
    args, meta, plain, cap = seen[0]
    if device.type != "cuda":
        assert cap is None
        return
    kern = CV._verify_kernel
    base = kern.warmup(*args, **{**meta, **plain}, grid=(1,))
    ours = kern.warmup(*args, **meta, **({} if cap is None else {"maxnreg": cap}),
                       grid=(1,))
    base._init_handles()
    ours._init_handles()
    assert ours.n_regs <= base.n_regs, (cfg, ours.n_regs, base.n_regs)
    assert ours.n_spills == 0, (cfg, ours.n_spills)


class _FakeKernel:
    """A kernel whose `warmup` gives binaries of the register counts named by `regs`
    (keyed by SGLANG and maxnreg), or None where `regs` is None (a probe skipped it)."""

    def __init__(self, regs, spills=0):
        self.regs, self.spills, self.calls = regs, spills, []

    def warmup(self, *args, grid, **meta):
        self.calls.append(meta)
        if self.regs is None:
            return None
        n = self.regs[(meta["SGLANG"], meta.get("maxnreg"))]
        return type("Bin", (), {"n_regs": n, "n_spills": self.spills if "maxnreg" in meta
                                else 0, "_init_handles": lambda self: None})()


def test_register_cap_rules():
    """`register_cap`: the plain variant's registers where the epilogue takes more and
    the capped compile does not spill; no cap where it takes no more or the cap spills;
    PROBED (nothing known, nothing cached) where a compile probe skipped the compile."""
    from recipes._registers import PROBED, register_cap

    meta, plain = {"SGLANG": True, "BLOCK_V": 1024}, {"SGLANG": False}
    regs = {(False, None): 32, (True, None): 38, (True, 32): 32}
    assert register_cap(_FakeKernel(regs), (1,), meta, plain) == 32
    assert register_cap(_FakeKernel(regs, spills=4), (1,), meta, plain) is None
    same = {(False, None): 32, (True, None): 32}
    k = _FakeKernel(same)
    assert register_cap(k, (1,), meta, plain) is None and len(k.calls) == 2
    probed = _FakeKernel(None)
    assert register_cap(probed, (1,), meta, plain) is PROBED
    assert [c["SGLANG"] for c in probed.calls] == [False, True]


def test_draft_extend_dispatches_on_its_own_table(device):
    """draft_tail's tables time its launch with token map, positions and column; the
    draft_extend adapter's launch has none of them, so with config=None it asks its own
    table (`sglang_draft_extend`) with draft_tail's key, and with DSA rows (copy programs
    its table was not timed with) no table; draft_topk1's launch has no row indices, map
    or hidden rows: it asks its own (`sglang_draft_topk1`) with H = 0, and an explicit
    config asks none."""
    from recipes._configs import trace_configs
    from recipes.draft_tail import tune_key

    x, _ = unique_max_logits(6, 3000, torch.bfloat16, device, seed=5)
    hidden = torch.randn(6, 64, device=device).to(torch.bfloat16)
    rows = torch.tensor([4, 1], dtype=torch.int64, device=device)
    dsa = torch.zeros(6, 3, dtype=torch.int32, device=device)
    with trace_configs() as trace:
        S.draft_extend_topk1_postprocess(x, rows, hidden_states=hidden)
        S.draft_extend_topk1_postprocess(x, rows, hidden_states=hidden, dsa_topk_indices=dsa)
    assert [(r, k) for r, k, _ in trace] == [
        (S.EXTEND_TABLE, tune_key(torch.bfloat16, 3000, 2, 64))]
    pos = torch.zeros(6, dtype=torch.int64, device=device)
    with trace_configs() as trace:
        S.draft_topk1_postprocess(x, pos)
        S.draft_topk1_postprocess(x, pos, config=TAIL_SMALL)
        S.draft_topk1_postprocess(x[:0], pos[:0])
    assert [(r, k) for r, k, _ in trace] == [
        (S.TOPK1_TABLE, tune_key(torch.bfloat16, 3000, 6, 0))]
    with pytest.raises(ValueError, match="draft_tail search space"):
        S.draft_topk1_postprocess(x, pos, config={**TAIL_SMALL, "SPLIT": 3})
