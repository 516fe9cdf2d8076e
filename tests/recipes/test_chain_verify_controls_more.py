"""chain_verify's sampling controls, the paths of the launch: the candidate path (top_k
at most `_controls_core.CAP`) at its edges and its overflow fallback, the threshold
path beside it, and the configs of the search space giving the same bits."""
import importlib
import random

import pytest
import torch

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
    """A row in more chunks than one merge step takes (GROUP - 1 lists): the lists are
    merged in turns into the running CAP largest."""
    V = (2 * CC.GROUP + 3) * 1024
    x, d, kw = case(2, 0, V, device, seed=17)
    cfg = {**SMALL, "SPLIT": 64}
    assert AC.split_plan(V, 1024, 64)[0] > 2 * (CC.GROUP - 1)
    run(x, d, {**kw, **ctl(device, top_k=[20, 32], top_p=[0.9, 0.5])}, cfgs=(cfg,))


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


def test_candidate_merge_fallback(device):
    """The row merge reads the entries of every chunk list at or above L, the largest
    list's last entry; where more than NC reach it (the row's largest interleaved over
    the chunks: chunk j holds ranks j, j + n, ...), the lists are merged in turns
    instead. The second row is a plain one (the sort of the entries at or above L)."""
    n, V = 8, 8 * 1024
    one = {"BLOCK_V": 1024, "SPLIT": n, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
           "EXACT": 0}
    g = torch.Generator().manual_seed(19)
    x = torch.randn(2, V, generator=g) - 10.0
    rank = torch.arange(CC.CAP * n)
    x[0, (rank % n) * 1024 + rank // n] = -0.01 * rank.float()
    lists = x[0].view(n, 1024).topk(CC.CAP, dim=1).values
    assert (lists >= lists[:, -1].max()).sum() > CC.NC
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
