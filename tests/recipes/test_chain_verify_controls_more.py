"""chain_verify's sampling controls, the paths of the launch: the candidate path (top_k
at most `_controls_core.CAP`) at its edges and its overflow fallback, the threshold
path beside it, and the configs of the search space giving the same bits."""
import importlib
import random

import pytest
import torch
import triton
import triton.language as tl

import recipes
from tests.helpers import ON_GPU, assert_equal
from tests.recipes.test_chain_verify_controls import SMALL, case, check, ctl, run

CV = importlib.import_module("recipes.chain_verify")
CC = importlib.import_module("recipes._controls_core")
AC = importlib.import_module("recipes._argmax_core")


def test_top_k_at_the_candidate_cap(device):
    """top_k = CAP - 1 and CAP (candidate path), CAP + 1 (threshold path), alone and
    with top_p / min_p, over rows cut into several chunks."""
    B, K, V = 6, 1, 5000
    x, d, kw = case(B, K, V, device, seed=11)
    cap = CC.CAP
    c = ctl(device, top_k=[cap - 1, cap, cap + 1, cap, cap + 1, cap - 1],
            top_p=[1.0, 0.9, 0.9, 0.3, 0.3, 0.6], min_p=[0.0, 0.0, 0.0, 0.02, 0.02, 0.0])
    cfgs = (None, {**SMALL, "SPLIT": 8}, {**SMALL, "BLOCK_V": 2048, "SPLIT": 1})
    run(x, d, {**kw, **c}, cfgs=cfgs)


def test_candidates_merged_over_many_chunks(device):
    """A row in more chunk lists than one sort of MN entries holds: the merge sorts the
    entries at or above the row cut."""
    V = (2 * CC.MN // CC.CAP + 3) * 1024
    x, d, kw = case(2, 0, V, device, seed=17)
    cfg = {**SMALL, "SPLIT": 64}
    assert AC.split_plan(V, 1024, 64)[0] * CC.CAP > CC.MN
    run(x, d, {**kw, **ctl(device, top_k=[20, 32], top_p=[0.9, 0.5])}, cfgs=(cfg,))


def test_threshold_programs_in_chunks_of_their_own(device):
    """Where the scan's chunks are many programs an SM, the threshold programs take
    fewer, longer chunks (`threshold_plan`, here more than one a row); the rows that
    search a threshold (top_p alone, top_k above CAP, min_p) give the same bits as with
    the scan's chunks."""
    gpu = device.type == "cuda"
    B, K, V, n = (8, 1, 70000, 64) if gpu else (2, 1, 16000, 16)
    x, d, kw = case(B, K, V, device, seed=23)
    few, many = {**SMALL, "SPLIT": 4}, {**SMALL, "SPLIT": n}
    for cfg in (few, many):
        split, tiles = AC.split_plan(V, 1024, cfg["SPLIT"])
        t_split = CV.threshold_plan(V, 1024, split, tiles, B * (K + 1),
                                    CV.C.sm_count(x.device))[0]
        assert (t_split < split) == (cfg is many) and t_split > 1
    h = B // 2
    for c in (ctl(device, top_p=[0.9, 0.3] * h), ctl(device, top_k=[40, 0] * h,
                                                       top_p=[1.0, 0.8] * h),
              ctl(device, top_k=[0, 60] * h, min_p=[0.05, 0.2] * h)):
        run(x, d, {**kw, **c}, cfgs=(few, many))
    # rows of zeros whose 40 largest sit in the last chunk: a threshold that missed
    # part of the row would keep zeros, which then outnumber them
    x = torch.zeros_like(x)
    x[:, V - 50:V - 10] = 1.0
    run(x, d, {**kw, **ctl(device, top_k=[40, 0] * h, min_p=[0.0, 0.5] * h)},
        cfgs=(few, many))


def test_candidates_when_V_is_below_the_cap(device):
    """V < CAP: the candidate lists are padded; top_k < V keeps the candidate path."""
    B, K, V = 4, 2, 20
    x, d, kw = case(B, K, V, device, seed=12, dtype=torch.float32)
    run(x, d, {**kw, **ctl(device, top_k=[5, 19, 1, 7], top_p=[0.8, 1.0, 0.5, 0.1],
                           min_p=[0.0, 0.3, 0.0, 0.0])})


def test_candidate_overflow_fallback(device):
    """More than NC ids at or above a chunk's lane-max cut (the largest ids all in a few
    lanes of the steps): the chunk's CAP-th largest pk is then found by bisection
    before compaction; the outputs are the reference's."""
    one = {"BLOCK_V": 1024, "SPLIT": 1, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
           "EXACT": 0}
    V = 20 * 1024
    sub = CC.SUB
    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, V, generator=g) * 0.1
    lanes = torch.arange(V) % sub
    x[:, lanes < 8] = 5.0 + torch.randn(2, int((lanes < 8).sum()), generator=g) * 0.01
    # the cut: the CAP-th largest lane max; the ids reaching it overflow NC
    lane_max = x.view(2, -1, sub).max(dim=1).values
    cut = lane_max.topk(CC.CAP, dim=1).values[:, -1:]
    assert ((x >= cut).sum(1) > CC.NC).all()
    x = x.to(device)
    d = torch.empty(2, 0, dtype=torch.int64, device=device)
    kw = {"temperature": torch.tensor([0.7, 1.3], device=device),
          "seeds": torch.tensor([5, 6], device=device),
          "positions": torch.tensor([10, 20], device=device)}
    run(x, d, {**kw, **ctl(device, top_k=[20, 32], top_p=[0.9, 1.0])}, cfgs=(one,))


def row_cut(lists: torch.Tensor) -> torch.Tensor:
    """`_controls_core._row_cut` in torch: lists [n, CAP], each descending."""
    cut = torch.tensor(float("-inf"))
    for e in range(CC.CAP.bit_length()):
        col = lists[:, (1 << e) - 1].sort(descending=True).values
        r = CC.CAP >> e
        if len(col) >= r:
            cut = torch.maximum(cut, col[r - 1])
    return cut


@triton.jit
def _row_top_kernel(cand_ptr, n_chunks, buf_ptr, out_ptr, CAPK: tl.constexpr,
                    MN: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, CAPK), CC.row_top(cand_ptr, n_chunks, buf_ptr, CAPK, MN))


def merged(lists: torch.Tensor) -> torch.Tensor:
    """`_controls_core.row_top` of packed lists [n, CAP] (each descending); checks that
    the lists and the scratch are back at rest."""
    n = lists.shape[0]
    empty = -2**63
    cand = lists.reshape(-1).clone()
    buf = torch.full((max(n * CC.NC, CC.MN),), empty, dtype=torch.int64, device=lists.device)
    out = torch.empty(CC.CAP, dtype=torch.int64, device=lists.device)
    _row_top_kernel[(1,)](cand, n, buf, out, CAPK=CC.CAP, MN=CC.MN)
    assert (cand == empty).all() and (buf == empty).all()
    return out


def packed_lists(x: torch.Tensor, n: int) -> torch.Tensor:
    """The chunks' lists of a float row x cut into n chunks: the CAP largest distinct
    int64 keys (the float's order, then the id) of each chunk, descending."""
    key = x.double().argsort().argsort() * x.numel() + torch.arange(x.numel())
    return key.view(n, -1).topk(CC.CAP, dim=1).values


@pytest.mark.parametrize("n", [1, 8, 9, 35, 128])
def test_row_merge_keeps_the_rows_largest(n, device):
    """The row merge returns the CAP largest entries of the chunk lists: one sort where
    they fit MN, else the sort of the entries at the row cut; random rows, a flat row
    (its largest all in the first chunk) and rows whose largest alternate over the
    chunks."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(n * 64, generator=g), torch.zeros(n * 64),
            -(torch.arange(n * 64).view(64, n).t().reshape(-1)).float()]
    for x in rows:
        lists = packed_lists(x, n)
        want = lists.reshape(-1).topk(CC.CAP).values
        assert_equal(merged(lists.to(device)).cpu(), want)


def test_candidate_merge_at_a_crowded_cut(device):
    """Many list entries at the row cut: the largest ids laid out so that each bound of
    the cut falls just short (one list holds 31 of them, two 15, four 7, eight 3, 17
    one each, the smallest in a list of one), 130 entries reach it, more than NC; the
    merge's sort of MN holds them (at most CAP * log2(CAP) + 1 can reach it). The second
    row is an ordinary one."""
    n, V = 35, 35 * 1024
    one = {"BLOCK_V": 1024, "SPLIT": 64, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
           "EXACT": 0}
    assert AC.split_plan(V, 1024, 64)[0] == n
    g = torch.Generator().manual_seed(19)
    x = torch.randn(2, V, generator=g) * 0.1 - 10.0
    held = [31] + [15] * 2 + [7] * 4 + [3] * 8 + [1] * 17
    rank = 0
    for c, m in enumerate(held):
        for i in range(m):
            x[0, c * 1024 + 31 * i + 5] = -0.01 * rank
            rank += 1
    lists = x[0].view(n, 1024).topk(CC.CAP, dim=1).values
    keys = packed_lists(x[0], n)
    # lists in reverse, so the list of 31 comes last: a sort short of the crowd drops some
    assert_equal(merged(keys.flip(0).contiguous().to(device)).cpu(),
                 keys.reshape(-1).topk(CC.CAP).values)
    crowd = int((lists >= row_cut(lists)).sum())
    assert CC.NC < crowd == sum(held) <= CC.MN
    x[1] = torch.randn(V, generator=g)
    x = x.to(device)
    d = torch.empty(2, 0, dtype=torch.int64, device=device)
    kw = {"temperature": torch.tensor([1.0, 0.8], device=device),
          "seeds": torch.tensor([7, 8], device=device),
          "positions": torch.tensor([3, 4], device=device)}
    for c in (ctl(device, top_k=[32, 20], top_p=[1.0, 0.9]),
              ctl(device, top_k=[20, 32], top_p=[0.5, 1.0])):
        run(x, d, {**kw, **c}, cfgs=(one,))


def space_configs(V: int):
    """Every config of chain_verify's space that `split_constraint` admits at V."""
    keys = sorted(CV.SPACE)
    out = [{}]
    for k in keys:
        out = [{**c, k: v} for c in out for v in CV.SPACE[k]]
    return [c for c in out if AC.split_constraint(c, V)]


def test_every_config_gives_the_same_bits(device):
    """Candidate, threshold and plain rows in one call under configs of the search
    space: the same outputs (a seeded sample: 3 on the CPU, 8 on the GPU)."""
    B, K, V = 4, 1, 3000
    x, d, kw = case(B, K, V, device, seed=14)
    kw["temperature"][3] = 0.0
    c = ctl(device, top_k=[20, 100, 0, 5], top_p=[0.9, 1.0, 0.8, 0.7],
            min_p=[0.0, 0.05, 0.0, 0.1])
    cfgs = space_configs(V)
    random.Random(0).shuffle(cfgs)
    want = recipes.chain_verify(x, d, **kw, **c)
    check(x, d, {**kw, **c}, want)
    for cfg in cfgs[:8 if ON_GPU else 3]:
        got = recipes.chain_verify(x, d, **kw, **c, config=cfg)
        for a, b in zip(got, want, strict=True):
            assert_equal(a, b, f"cfg={cfg}")


def test_out_and_workspace_rest(device):
    """The scratch is left at rest: a second call into out=, and a plain sampled call
    after them, give the outputs of the first calls."""
    B, K, V = 3, 2, 700
    x, d, kw = case(B, K, V, device, seed=15)
    plain = recipes.chain_verify(x, d, **kw)
    c = ctl(device, top_k=[3, 50, 0], top_p=[0.9, 0.9, 0.5])
    first = recipes.chain_verify(x, d, **kw, **c)
    out = CV.VerifyResult(*(torch.full_like(t, 7) for t in first))
    again = recipes.chain_verify(x, d, **kw, **c, out=out)
    assert all(a.data_ptr() == o.data_ptr() for a, o in zip(again, out, strict=True))
    for a, b in zip(out, first, strict=True):
        assert_equal(a, b)
    for a, b in zip(recipes.chain_verify(x, d, **kw), plain, strict=True):
        assert_equal(a, b)


@pytest.mark.skipif(not ON_GPU, reason="CUDA-graph capture needs a GPU")
def test_controls_in_a_cuda_graph(device):
    B, K, V = 4, 3, 4096
    x, d, kw = case(B, K, V, device, seed=16)
    c = ctl(device, top_k=[20, 0, 100, 3], top_p=[0.95, 0.9, 1.0, 1.0],
            min_p=[0.0, 0.0, 0.05, 0.0])
    want = recipes.chain_verify(x, d, **kw, **c)
    out = CV.VerifyResult(*(torch.empty_like(t) for t in want))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        recipes.chain_verify(x, d, **kw, **c, out=out)
    for _ in range(3):
        g.replay()
        for a, b in zip(out, want, strict=True):
            assert_equal(a, b)


def test_controls_key_is_its_own_mode():
    """Calls with the controls dispatch on mode "controls", whose heuristic and
    register limit are the sampled ones."""
    dev = torch.device("cpu")
    for B in (1, 8, 64):
        ck = CV.tune_key(torch.bfloat16, 151936, B, 3, True, True)
        sk = CV.tune_key(torch.bfloat16, 151936, B, 3, True)
        assert ck["mode"] == "controls" and sk["mode"] == "sampled"
        assert CV.heuristic(ck, dev) == CV.heuristic(sk, dev)
        big = {**SMALL, "BLOCK_V": 8192, "SPLIT": 8}
        assert CV.constraint(big, ck) == CV.constraint(big, sk)
    assert CV.tune_key(torch.bfloat16, 5, 1, 1, False, True)["mode"] == "greedy"
