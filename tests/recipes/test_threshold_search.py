"""The phased threshold search of chain_verify's controls (`recipes._threshold_core`):
the P it publishes is, bit for bit, `_controls_core.threshold_in`'s (the one-program
bisections that define it), whatever the number of phases or programs a row, on the hard
rows (ties at the cut, flat, peaked, few distinct values, +-inf, NaN), and it leaves its
state at rest. chain_verify's own tests check the tokens against the reference."""
import importlib

import pytest
import torch
import triton
import triton.language as tl

from tests.helpers import ON_GPU, assert_equal

CC = importlib.import_module("recipes._controls_core")
TC = importlib.import_module("recipes._threshold_core")
EMPTY = tl.constexpr(-(2**63))


@triton.jit
def _p_kernel(x_ptr, stride, V, T, k_ptr, p_ptr, m_ptr, acc_ptr, rcnt_ptr, st_ptr, thr_ptr,
              out_ptr, IDB, n_split, chunk, PHASES: tl.constexpr, LB: tl.constexpr,
              BLOCK: tl.constexpr):
    """chain_verify's threshold programs for R rows (phases 0 .. PHASES, n_split chunks a
    row), then a program a row that waits for P, stores it and puts thr back to rest."""
    pid = tl.program_id(0)
    R = tl.num_programs(0) // ((2 + PHASES) * n_split)
    f = pid // (R * n_split)
    q = pid - f * R * n_split
    r = q // n_split
    c = q - r * n_split
    if f <= PHASES:
        k = tl.load(k_ptr + r).to(tl.int64)
        p = tl.load(p_ptr + r)
        mp = tl.load(m_ptr + r)
        lo = c * chunk
        TC.threshold_program(f, st_ptr + r.to(tl.int64) * TC.ROW, thr_ptr + r,
                             rcnt_ptr + r, acc_ptr + r, acc_ptr + R + r,
                             x_ptr + r.to(tl.int64) * stride, lo, tl.minimum(lo + chunk, V),
                             V, T, k, p, mp, IDB, n_split, acc_ptr, acc_ptr, c, 0, 0, 0,
                             PHASES, LB, BLOCK, False, 4)
    elif c == 0:
        P = tl.atomic_max(thr_ptr + r, EMPTY, sem="acquire")
        while P == EMPTY:
            P = tl.atomic_max(thr_ptr + r, EMPTY, sem="acquire")
        tl.store(out_ptr + r, P)
        tl.atomic_xchg(thr_ptr + r, EMPTY, sem="relaxed")


def thresholds(x, T, k, p, mp, phases, n_split, state=None):
    """P of each row of x (float [R, V]) by `_p_kernel`; `state`: the scratch to reuse."""
    R, V = x.shape
    dev = x.device
    if state is None:
        state = (torch.full((2 * R,), EMPTY.value, dtype=torch.int64, device=dev),
                 torch.zeros(R, dtype=torch.int32, device=dev),
                 torch.zeros(max(1, TC.state_size(R, phases)), dtype=torch.int64, device=dev),
                 torch.full((R,), EMPTY.value, dtype=torch.int64, device=dev))
    acc, rcnt, st, thr = state
    out = torch.empty(R, dtype=torch.int64, device=dev)
    chunk = triton.cdiv(V, n_split)
    _p_kernel[((2 + phases) * R * n_split,)](
        x, x.stride(0), V, T, k, p, mp, acc, rcnt, st, thr, out, CC.id_bits(V), n_split, chunk,
        PHASES=phases, LB=128, BLOCK=1024, num_warps=4)
    return out, state


def hard_rows(V, device, seed=0):
    """(x float32 [R, V], k int64 [R], p float32 [R], min_p float32 [R]): rows with
    controls and distributions that stress the search."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randn(V, generator=g)
    rows, ctl = [], []
    dists = {
        "normal": n,
        "wide": n * 12,
        "narrow": n * 0.3,
        "flat": torch.zeros(V),
        "steps": torch.round(n * 2) / 2,              # few distinct values: ties
        "peaked": torch.where(torch.arange(V) == 7, 40.0, n),
        "inf": torch.where(torch.arange(V) % 97 == 3, float("inf"), n),
        "neginf": torch.where(torch.arange(V) % 3 == 0, float("-inf"), n),
        "allneginf": torch.full((V,), float("-inf")),
        "nan": torch.where(torch.arange(V) == V // 2, float("nan"), n),
        "bf16": n.to(torch.bfloat16).float() * 3,
    }
    controls = [(0, 0.9, 0.0), (0, 0.5, 0.0), (0, 0.999, 0.0), (0, 1 - 1e-7, 0.0),
                (0, 1e-6, 0.0), (50, 1.0, 0.0), (1000, 0.95, 0.0), (V - 1, 0.9, 0.05),
                (33, 0.95, 0.0), (0, 0.9, 0.05), (200, 1.0, 0.9), (3, 0.8, 0.0),
                (0, 0.0, 0.0)]
    for i, (name, d) in enumerate(dists.items()):
        for j, c in enumerate(controls):
            if (i + j) % 4 == 0 or name in ("flat", "steps"):
                rows.append(d)
                ctl.append(c)
    x = torch.stack(rows).to(device)
    k, p, mp = (torch.tensor(v, device=device) for v in zip(*ctl, strict=True))
    return x, k.to(torch.int64), p.to(torch.float32), mp.to(torch.float32)


SHAPES = [(1200, 3, (1, TC.NPH))]
if ON_GPU:      # more ids than a level's bins and the compaction hold, a real vocabulary
    SHAPES += [(1100, 7, (TC.NPH,)), (40000, 5, (1, 2, TC.NPH)), (4096, 1, (TC.NPH,)),
               (151936, 16, (TC.NPH,))]


@pytest.mark.parametrize("V,n_split,counts", SHAPES)
def test_phased_search_is_threshold_in(device, V, n_split, counts):
    """Fewer phases than the search needs end in `threshold_in` (the last program)."""
    x, k, p, mp = hard_rows(V, device)
    want, _ = thresholds(x, 0.7, k, p, mp, 0, n_split)
    for phases in counts:
        got, (acc, rcnt, st, thr) = thresholds(x, 0.7, k, p, mp, phases, n_split)
        assert_equal(got, want, f"phases={phases}")
        # at rest: the phase word, buffer offset, exit counter, accumulators and row
        # counters 0, the folds and thr empty (the window words are written before use)
        st = st.reshape(-1, TC.ROW.value)
        rest = [TC.PHASE.value, TC.OFF.value, TC.EXIT.value, *range(TC.ACC.value, TC.ST.value)]
        assert (st[:, rest] == 0).all() and (rcnt == 0).all()
        assert (acc == EMPTY.value).all() and (thr == EMPTY.value).all()


def test_search_state_reused_across_calls(device):
    """The same scratch serves calls with other rows and controls (rest values hold)."""
    x, k, p, mp = hard_rows(600, device, seed=1)
    want, _ = thresholds(x, 1.3, k, p, mp, 0, 2)
    _, state = thresholds(x.flip(1), 0.5, k.flip(0), p, mp, TC.NPH, 2)
    got, _ = thresholds(x, 1.3, k, p, mp, TC.NPH, 2, state)
    assert_equal(got, want)


def test_ties_in_one_z_key_are_split_by_id(device):
    """A window of few z keys and many ids is split in pk (by id): two z keys, 1000 tied
    ids on top, P inside them or below."""
    x = torch.zeros(1, 5000, device=device)
    x[0, 4000:] = 1.0
    k = torch.tensor([0], device=device)
    m0 = torch.zeros(1, device=device)
    for p in (0.2, 0.5, 0.9):
        pt = torch.tensor([p], dtype=torch.float32, device=device)
        want, _ = thresholds(x, 1.0, k, pt, m0, 0, 3)
        got, _ = thresholds(x, 1.0, k, pt, m0, TC.NPH, 3)
        assert_equal(got, want, f"p={p}")
