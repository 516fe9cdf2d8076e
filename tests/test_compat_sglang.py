"""recipes.compat.sglang against a torch model of SGLang's top-1 helpers' outputs, and
against the compositions its one-launch helpers replace.

The model (`sglang_*` below) restates what SGLang's kernels compute, independently of our
kernels: the argmax with NaN read as -1e30 in float32 (SGLang's reduction), and the
verifier's walk along `retrieve_next_token` from node 0 with `retrieve_index` giving the
global rows (SGLang's finalize kernel), request by request in plain Python. On NaN-free
logits ours must equal the model bit for bit; with NaN the documented difference holds.

The compositions (`composed_*`) are what the helpers computed in several launches before
they were one: `recipes.chain_verify` followed by SGLang's layout in torch, and
`draft_tail` followed by relay_gather's rule for the DSA rows. On the hard inputs (ties,
NaN, all -inf rows, drafts outside the vocabulary) the one launch must equal them bit
for bit, for every config, with every output poisoned beforehand.
"""
import importlib
import inspect

import pytest
import torch
import triton
from helpers import (
    ON_GPU,
    assert_equal,
    bad,
    bad_inputs_test,
    drafts_around,
    hard_logits,
    sample_configs,
)

import recipes
from recipes import _common as C
from recipes.compat import sglang as S

CV = importlib.import_module("recipes.chain_verify")
DT = importlib.import_module("recipes.draft_tail")
RELAY = importlib.import_module("recipes.relay")


# --- the model ---------------------------------------------------------------------------
def sglang_argmax(logits: torch.Tensor) -> torch.Tensor:
    x = logits.float()
    return torch.argmax(torch.where(torch.isnan(x), torch.full_like(x, -1e30), x), dim=-1)


def sglang_target_verify(logits, candidates, retrieve_index, retrieve_next_token, seq_lens):
    B, N = candidates.shape
    dev = candidates.device
    t = sglang_argmax(logits.reshape(B * N, -1)).view(B, N).cpu()
    cand, ridx, rnext = candidates.cpu(), retrieve_index.cpu(), retrieve_next_token.cpu()
    predict = torch.zeros(B * N, dtype=torch.int32)
    accept_index = torch.full((B, N), -1, dtype=torch.int32)
    ncorrect = torch.zeros(B, dtype=torch.int32)
    bonus = torch.zeros(B, dtype=torch.int32)
    select = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        base = b * N
        last = int(ridx[b, 0])
        accept_index[b, 0] = last
        node, accepted = 0, 0
        for _ in range(1, N):
            nxt = int(rnext[b, node])
            if not 0 <= nxt < N:
                break
            target = int(t[b, last - base])
            if int(cand[b, nxt]) != target:
                break
            predict[last] = target
            accepted += 1
            accept_index[b, accepted] = int(ridx[b, nxt])
            node, last = nxt, int(ridx[b, nxt])
        bonus[b] = int(t[b, last - base])
        predict[last] = bonus[b]
        ncorrect[b] = accepted
        select[b] = base + accepted
    accept_lens = ncorrect + 1
    return S.TargetVerifyTopk1Output(
        predict.to(dev), ncorrect.to(dev), accept_lens.to(dev), accept_index.to(dev),
        bonus.to(dev), seq_lens + accept_lens.to(dev).to(seq_lens.dtype), select.to(dev),
        predict.to(torch.int64).to(dev))


def sglang_draft(logits, positions, draft_tokens=None, column=0):
    idx = sglang_argmax(logits)
    positions += 1
    if draft_tokens is not None:
        draft_tokens[:, column] = idx
    return torch.ones(idx.shape[0], 1, dtype=torch.float32, device=logits.device), idx[:, None]


def sglang_draft_extend(logits, rows, hidden=None, dsa=None):
    idx = sglang_argmax(logits[rows])
    ones = torch.ones(idx.shape[0], 1, dtype=torch.float32, device=logits.device)
    return (ones, idx[:, None], None if hidden is None else hidden[rows].clone(),
            None if dsa is None else dsa[rows].clone())


# --- helpers -----------------------------------------------------------------------------
def chain_layout(B, N, device):
    ridx = torch.arange(B * N, dtype=torch.int64, device=device).view(B, N)
    rnext = torch.arange(1, N + 1, dtype=torch.int64, device=device).repeat(B, 1)
    rnext[:, -1] = -1
    return ridx, rnext


def unique_max_logits(rows, V, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V, generator=g)
    top = torch.randint(0, V, (rows,), generator=g)
    x[torch.arange(rows), top] = 50.0
    return x.to(dtype).to(device), top


def candidates_accepting(top, B, N, accepted, V):
    """candidates[b, 0] = some committed token; drafts accept `accepted[b]` then miss."""
    t = top.view(B, N)
    cand = torch.zeros(B, N, dtype=torch.int64)
    cand[:, 1:] = (t[:, :-1] + 1) % V
    for b, a in enumerate(accepted):
        cand[b, 1:a + 1] = t[b, :a]
    cand[:, 0] = 12345 % V
    return cand


def assert_outputs(got, want, what):
    assert type(got) is type(want)
    for name, g, w in zip(type(want)._fields, got, want, strict=False):
        assert_equal(g, w, f"{what}.{name}")


# --- target verify -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("B,N,V", [(4, 6, 5000), (3, 1, 700), (5, 4, 8193)])
def test_target_verify_matches_model(device, dtype, B, N, V):
    x, top = unique_max_logits(B * N, V, dtype, device, seed=B * N + V)
    accepted = [(b * 3) % N for b in range(B)]
    accepted[-1] = N - 1                                         # one accepts every draft
    cand = candidates_accepting(top, B, N, accepted, V).to(device)
    ridx, rnext = chain_layout(B, N, device)
    for seq_dtype in (torch.int64, torch.int32):
        seq = torch.arange(100, 100 + B, dtype=seq_dtype, device=device)
        got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
        want = sglang_target_verify(x, cand, ridx, rnext, seq)
        assert_outputs(got, want, f"verify {seq_dtype}")
        assert got.num_correct_drafts.tolist() == accepted
        assert got.draft_input_ids is got.draft_tokens


def test_target_verify_ties_all_neg_inf_strided_and_padding(device):
    """SGLang's own edge cases: lowest index on ties, an all -inf row gives 0, row-strided
    logits; plus -1 padded drafts and ids outside the vocabulary."""
    N, V = 3, 8193
    backing = torch.full((2 * N, V + 17), 2000.0, device=device)
    x = backing[:, :V]
    x.fill_(float("-inf"))
    x[0, 7] = 1.0
    x[0, 8192] = 1.0
    x[2, 8191] = 1.0
    x[2, 8192] = 1.0            # row 1 stays all -inf
    x[3:, 5] = 3.0
    cand = torch.tensor([[0, 7, 0], [9, -1, -1]], device=device)
    ridx, rnext = chain_layout(2, N, device)
    seq = torch.tensor([41, 7], dtype=torch.int32, device=device)
    got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
    assert_outputs(got, sglang_target_verify(x, cand, ridx, rnext, seq), "edges")
    assert got.predict.tolist() == [7, 0, 8191, 5, 0, 0]
    assert got.accept_index.tolist() == [[0, 1, 2], [3, -1, -1]]


def test_target_verify_3d_logits_and_int32_candidates(device):
    B, N, V = 3, 4, 3000
    x, top = unique_max_logits(B * N, V, torch.bfloat16, device, seed=9)
    cand = candidates_accepting(top, B, N, [0, 2, 3], V).to(device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.arange(B, dtype=torch.int64, device=device)
    want = sglang_target_verify(x, cand, ridx, rnext, seq)
    got = S.target_verify_topk1_postprocess(x.view(B, N, V), cand.to(torch.int32), ridx,
                                            rnext, seq)
    assert_outputs(got, want, "3-D")


def test_target_verify_real_vocab(device):
    B, N, V = 2, 4, 151936
    x, top = unique_max_logits(B * N, V, torch.bfloat16, device, seed=3)
    cand = candidates_accepting(top, B, N, [1, 3], V).to(device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.tensor([5, 6], device=device)
    assert_outputs(S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq),
                   sglang_target_verify(x, cand, ridx, rnext, seq), "V=151936")


def test_target_verify_empty_batch(device):
    x = torch.empty(0, 100, device=device)
    cand = torch.empty(0, 4, dtype=torch.int64, device=device)
    ridx, rnext = chain_layout(0, 4, device)
    got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext,
                                            torch.empty(0, dtype=torch.int32, device=device))
    assert got.predict.shape == (0,) and got.accept_index.shape == (0, 4)
    assert got.new_seq_lens.dtype == torch.int32


def test_nan_semantics_differ_as_documented(device):
    """Ours: torch.argmax (the first NaN wins). SGLang: NaN reads as -1e30. Sanitising in
    float32 first reproduces SGLang."""
    B, N, V = 1, 2, 300
    x = torch.zeros(B * N, V, device=device)
    x[0, 10] = float("nan")
    x[0, 20] = 1.0
    x[1, 30] = float("nan")                       # the rest of row 1 is 0.0 > -1e30
    cand = torch.tensor([[0, 10]], device=device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.tensor([0], device=device)
    ours = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
    theirs = sglang_target_verify(x, cand, ridx, rnext, seq)
    assert ours.predict.tolist() == [10, 30] and ours.num_correct_drafts.tolist() == [1]
    assert theirs.predict.tolist() == [20, 0] and theirs.num_correct_drafts.tolist() == [0]
    clean = torch.where(x.isnan(), torch.full_like(x, -1e30), x.float())
    assert_outputs(S.target_verify_topk1_postprocess(clean, cand, ridx, rnext, seq), theirs,
                   "sanitised")


def test_target_verify_errors(device):
    x = torch.zeros(6, 10, device=device)
    cand = torch.zeros(2, 3, dtype=torch.int64, device=device)
    ridx, rnext = chain_layout(2, 3, device)
    seq = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="retrieve_index"):
        S.target_verify_topk1_postprocess(x, cand, ridx[:, :2], rnext, seq)
    with pytest.raises(ValueError, match="seq_lens"):
        S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq[:1])
    with pytest.raises(ValueError, match="logits"):
        S.target_verify_topk1_postprocess(x[:5], cand, ridx, rnext, seq)
    with pytest.raises(TypeError, match="candidates"):
        S.target_verify_topk1_postprocess(x, cand.float(), ridx, rnext, seq)
    with pytest.raises(NotImplementedError, match="simulated"):
        S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq,
                                          num_simulated_accept_tokens=2)
    assert S.target_verify_topk1_is_supported(x, cand, ridx, rnext, seq)
    assert not S.target_verify_topk1_is_supported(x[:5], cand, ridx, rnext, seq)


# --- draft --------------------------------------------------------------------------------
@pytest.mark.parametrize("B,V,dtype", [(1, 127, torch.float32), (4, 8192, torch.float16),
                                       (7, 8193, torch.bfloat16), (3, 50000, torch.float32)])
def test_draft_matches_model(device, B, V, dtype):
    x, _ = unique_max_logits(B, V, dtype, device, seed=V)
    pos = torch.arange(B, dtype=torch.int64, device=device)
    pos_m = pos.clone()
    p, i = S.draft_topk1_postprocess(x, pos)
    pm, im = sglang_draft(x, pos_m)
    assert_equal(p, pm, "topk_p")
    assert_equal(i, im, "topk_index")
    assert_equal(pos, pos_m, "positions")


def test_draft_writes_one_column_of_a_strided_view(device):
    B, V = 17, 50000
    x, top = unique_max_logits(B, V, torch.float32, device, seed=0)
    backing = torch.full((B, 5), -1, dtype=torch.int64, device=device)
    view = backing[:, 1:4]
    pos = torch.zeros(B, dtype=torch.int64, device=device)
    p, i = S.draft_topk1_postprocess(x, pos, view, draft_token_column=2)
    want = torch.full_like(backing, -1)
    want[:, 3] = top.to(device)
    assert_equal(backing, want, "backing")
    assert_equal(i[:, 0], top.to(device), "topk_index")
    assert_equal(pos, torch.ones_like(pos), "positions")
    assert p.shape == (B, 1) and bool((p == 1).all())


def test_draft_row_strided_and_empty(device):
    B, V = 5, 8193
    backing = torch.full((B, V + 64), 2000.0, device=device)
    x, top = unique_max_logits(B, V, torch.float32, device, seed=1)
    backing[:, :V] = x
    pos = torch.zeros(B, dtype=torch.int64, device=device)
    _, i = S.draft_topk1_postprocess(backing[:, :V], pos)
    assert_equal(i[:, 0], top.to(device), "strided rows")
    empty = torch.empty(0, 1024, device=device)
    p, i = S.draft_topk1_postprocess(empty, torch.empty(0, dtype=torch.int64, device=device),
                                     torch.empty(0, 3, dtype=torch.int64, device=device), 1)
    assert p.shape == (0, 1) and i.shape == (0, 1)


# --- draft extend ------------------------------------------------------------------------
def test_draft_extend_matches_model(device):
    R, V, H, D = 6, 20000, 96, 40
    x, _ = unique_max_logits(R, V, torch.float32, device, seed=4)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(R + 3, H, generator=g).to(torch.bfloat16).to(device)  # extra rows
    dsa = torch.randint(0, 32000, (720, D), generator=g, dtype=torch.int32).to(device)
    rows = torch.tensor([0, 5, 2, 2], dtype=torch.int64, device=device)
    got = S.draft_extend_topk1_postprocess(x, rows, hidden_states=hidden,
                                           dsa_topk_indices=dsa)
    want = sglang_draft_extend(x, rows, hidden, dsa)
    for name, g_, w in zip(("topk_p", "topk_index", "hidden", "dsa"), got, want, strict=False):
        assert_equal(g_, w, name)
    # positional form (older SGLang) and no side tensors
    got = S.draft_extend_topk1_postprocess(x, rows, None, None)
    assert got[2] is None and got[3] is None
    assert_equal(got[1], want[1], "topk_index without side tensors")
    got = S.draft_extend_topk1_postprocess(x, rows, hidden[:R])
    assert_equal(got[2], want[2], "hidden only")
    # out-of-range rows: the nearest logits/hidden row, zeros for DSA (even where the DSA
    # tensor has a row at that index)
    bad = torch.tensor([-1, R, R + 2], dtype=torch.int64, device=device)
    got = S.draft_extend_topk1_postprocess(x, bad, hidden_states=hidden,
                                           dsa_topk_indices=dsa)
    near = torch.tensor([0, R - 1, R - 1], device=device)
    assert_equal(got[2], hidden[near], "hidden, rows out of range")
    assert_equal(got[3], torch.zeros(3, D, dtype=dsa.dtype, device=device),
                 "dsa, rows out of range")
    with pytest.raises(ValueError, match="dsa_topk_indices.*at least 6 rows"):
        S.draft_extend_topk1_postprocess(x, rows, dsa_topk_indices=dsa[:5])


def test_draft_extend_empty(device):
    x = torch.zeros(4, 100, device=device)
    rows = torch.empty(0, dtype=torch.int64, device=device)
    p, i, h, d = S.draft_extend_topk1_postprocess(
        x, rows, hidden_states=torch.zeros(4, 8, device=device),
        dsa_topk_indices=torch.zeros(4, 3, dtype=torch.int32, device=device))
    assert p.shape == (0, 1) and i.shape == (0, 1) and h.shape == (0, 8) and d.shape == (0, 3)


# --- bad inputs ---------------------------------------------------------------------------
def _verify_args(dev):
    x = torch.zeros(6, 10, device=dev)
    cand = torch.zeros(2, 3, dtype=torch.int64, device=dev)
    ridx, rnext = chain_layout(2, 3, dev)
    return x, cand, ridx, rnext, torch.zeros(2, dtype=torch.int64, device=dev)


def _on_meta(args, i):
    return args[:i] + (args[i].to("meta"),) + args[i + 1:]


def _draft(dev):
    """draft_topk1 with positions the very column of draft_tokens it writes."""
    x = torch.randn(4, 10, device=dev)
    dt = torch.zeros(4, 3, dtype=torch.int64, device=dev)
    return S.draft_topk1_postprocess(x, dt[:, 1], dt, 1)


def _extend(dev, which):
    """draft_extend with one of row_indices/hidden_states/dsa_topk_indices on meta."""
    args = [torch.randn(4, 10, device=dev), torch.tensor([0, 2], device=dev),
            torch.zeros(4, 8, device=dev), torch.zeros(4, 3, dtype=torch.int32, device=dev)]
    args[which] = args[which].to("meta")
    return S.draft_extend_topk1_postprocess(*args)


FIRST = r"expected a tensor on .* \(the device of the first tensor argument\), got one on meta"
BAD = [
    bad("candidates device",
        lambda d: S.target_verify_topk1_postprocess(*_on_meta(_verify_args(d), 1)),
        ValueError, "candidates: " + FIRST),
    bad("seq_lens device",
        lambda d: S.target_verify_topk1_postprocess(*_on_meta(_verify_args(d), 4)),
        ValueError, "seq_lens: " + FIRST),
    bad("row_indices device", lambda d: _extend(d, 1), ValueError, "row_indices: " + FIRST),
    bad("hidden_states device", lambda d: _extend(d, 2), ValueError,
        "hidden_states: " + FIRST),
    bad("dsa_topk_indices device", lambda d: _extend(d, 3), ValueError,
        "dsa_topk_indices: " + FIRST),
    bad("draft logits dtype", lambda d: S.draft_topk1_postprocess(
        torch.zeros(4, 10, dtype=torch.int64, device=d), torch.zeros(4, dtype=torch.int64,
                                                                    device=d)),
        TypeError, "next_token_logits: expected dtype float16/bfloat16/float32"),
    bad("positions the written column", _draft, ValueError,
        "draft_tokens: expected a tensor that shares no memory with positions"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_draft_column_without_draft_tokens_is_sglangs(device):
    """SGLang's EAGLE worker passes the step's column also when it keeps no chain buffer
    (draft_tokens None): the column is then unused, as in SGLang."""
    x, top = unique_max_logits(3, 700, torch.float32, device, seed=2)
    pos = torch.zeros(3, dtype=torch.int64, device=device)
    p, i = S.draft_topk1_postprocess(x, pos, None, 3)
    assert_equal(i[:, 0], top.to(device), "topk_index")
    assert_equal(pos, torch.ones_like(pos), "positions")


# --- the signatures are SGLang's ----------------------------------------------------------
def test_signatures():
    """SGLang's positional parameters, in order; ours beyond them are keyword-only."""
    def params(fn):
        ps = inspect.signature(fn).parameters.values()
        extra = [p.name for p in ps if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert {"out", "config"} <= set(extra)
        return [p.name for p in ps if p.kind is not inspect.Parameter.KEYWORD_ONLY]

    assert params(S.target_verify_topk1_postprocess)[:5] == [
        "next_token_logits", "candidates", "retrieve_index", "retrieve_next_token",
        "seq_lens"]
    assert params(S.draft_topk1_postprocess) == [
        "next_token_logits", "positions", "draft_tokens", "draft_token_column"]
    assert params(S.draft_extend_topk1_postprocess) == [
        "next_token_logits", "row_indices", "hidden_states", "dsa_topk_indices"]
    assert S.TargetVerifyTopk1Output._fields == (
        "predict", "num_correct_drafts", "accept_lens", "accept_index", "bonus_tokens",
        "new_seq_lens", "select_index", "draft_tokens")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_verify_is_graph_capturable(device):
    B, N, V = 8, 4, 151936
    x, top = unique_max_logits(B * N, V, torch.bfloat16, device, seed=5)
    cand = candidates_accepting(top, B, N, [b % N for b in range(B)], V).to(device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.arange(B, dtype=torch.int64, device=device)
    S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)      # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
    graph.replay()
    assert_outputs(out, sglang_target_verify(x, cand, ridx, rnext, seq), "graph")


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


# --- one launch, equal to the compositions it replaces -------------------------------------
VERIFY_SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "num_stages": 1, "UNROLL": 2}
TAIL_SMALL = {"BLOCK_V": 512, "SPLIT": 4, "UNROLL": 1, "BLOCK_H": 2048, "num_warps": 4,
              "num_stages": 1, "FUSE_H": 0}


def composed_verify(x, cand, seq, **sampling):
    """chain_verify, then SGLang's layout of its answer in torch (the two launches the
    helper was)."""
    B, N = cand.shape
    r = recipes.chain_verify(x, cand[:, 1:], **sampling)
    keep = torch.arange(N, device=cand.device)[None, :] <= r.accept_len[:, None]
    predict = torch.where(keep, r.tokens, 0).reshape(B * N)
    flat = torch.arange(B * N, device=cand.device).view(B, N)
    lens = r.accept_len + 1
    return S.TargetVerifyTopk1Output(
        predict, r.accept_len, lens, torch.where(keep, flat, -1).to(torch.int32), r.bonus,
        seq + lens.to(seq.dtype), r.select_index, predict.to(torch.int64))


def poisoned_verify_out(B, N, seq_dtype, device):
    def full(shape, dtype):
        return torch.full(shape, -77, dtype=dtype, device=device)

    i32, i64 = torch.int32, torch.int64
    return S.TargetVerifyTopk1Output(full((B * N,), i32), full((B,), i32), full((B,), i32),
                                     full((B, N), i32), full((B,), i32),
                                     full((B,), seq_dtype), full((B,), i64),
                                     full((B * N,), i64))


def check_verify(x, cand, seq, cfgs=(None,)):
    """The helper, with poisoned out= buffers, equals the composition for each config;
    the out= tensors are the ones returned; without out= (allocated) and
    `target_verify_reference` the same."""
    B, N = cand.shape
    want = composed_verify(x, cand, seq)
    ridx, rnext = chain_layout(B, N, x.device)
    for cfg in cfgs:
        out = poisoned_verify_out(B, N, seq.dtype, x.device)
        got = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq, out=out,
                                                config=cfg)
        assert all(g is o for g, o in zip(got, out, strict=True)), "out= not returned"
        assert_outputs(got, want, f"cfg={cfg}")
    assert_outputs(S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq), want,
                   "allocated")
    # the tuner's plain-torch reference (`TUNING`) says the same
    assert_outputs(S.target_verify_reference(x, cand, ridx, rnext, seq), want, "reference")
    return want


def hard_candidates(x, B, N, seed, dtype):
    """candidates [B, N]: a committed token, then drafts around the target tokens that
    accept a random prefix and miss with a wrong id, -1 padding, V or V + 7."""
    t = torch.argmax(x.reshape(B, N, -1).cpu(), dim=-1)
    d = drafts_around(t, x.shape[-1], seed, dtype, x.device)
    return torch.cat([torch.full((B, 1), 3, dtype=dtype, device=x.device), d], dim=1)


I32, I64 = torch.int32, torch.int64


@pytest.mark.parametrize("dtype,B,N,V,cand_dtype,seq_dtype", [
    (torch.bfloat16, 3, 3, 2500, I64, I32), (torch.float32, 1, 4, 3000, I32, I64),
    (torch.float16, 5, 2, 513, I64, I64), (torch.bfloat16, 2, 1, 700, I32, I32)])
def test_verify_equals_composition_hard_inputs(device, dtype, B, N, V, cand_dtype,
                                               seq_dtype):
    """Ties inside and across chunks, NaN, all -inf rows, -0.0 (`hard_logits`), drafts
    outside the vocabulary, strided seq_lens, odd B, K = 0."""
    x = hard_logits(B * N, V, dtype, device, seed=B * 10 + N + V)
    cand = hard_candidates(x, B, N, seed=V, dtype=cand_dtype)
    seq = torch.arange(7, 7 + 2 * B, dtype=seq_dtype, device=device)[::2]
    want = check_verify(x, cand, seq, cfgs=(None, VERIFY_SMALL))
    if B > 1 and N > 1:
        assert int(want.num_correct_drafts.min()) < N - 1     # a miss: -1 / 0 fill seen


def test_verify_equals_composition_3d_strided_and_edges(device):
    """3-D and row-strided logits; every draft accepted, none accepted; seq_lens at the
    int32 limit (new_seq_lens wraps as torch's int32 addition does) and past it."""
    B, N, V = 3, 4, 1500
    base = hard_logits(B * N, V + 200, torch.bfloat16, device, seed=7)
    x3 = base.view(B, N, V + 200)[:, :, 100:100 + V]
    t = torch.argmax(x3.float().cpu(), dim=-1)
    all_in = torch.cat([t[:, :1], t[:, :N - 1]], dim=1).to(device)
    none_in = torch.cat([t[:, :1], (t[:, :N - 1] + 1) % V], dim=1).to(device)
    want = check_verify(x3, all_in, torch.tensor([0, 2**31 - 2, 5], dtype=I32,
                                                 device=device))
    assert want.num_correct_drafts.tolist() == [N - 1] * B
    want = check_verify(base[:, 100:100 + V], none_in.to(I32),
                        torch.tensor([2**40, 0, 1], dtype=I64, device=device))
    assert want.num_correct_drafts.tolist() == [0] * B


def test_verify_every_config(device):
    B, N, V = 3, 3, 2100
    x = hard_logits(B * N, V, torch.bfloat16, device, seed=4)
    cand = hard_candidates(x, B, N, seed=4, dtype=torch.int64)
    seq = torch.arange(B, dtype=torch.int64, device=device)
    configs = CV.TUNING.configs(CV.tune_key(torch.bfloat16, V, B, N - 1))
    check_verify(x, cand, seq, cfgs=sample_configs(configs, 6))


def test_sglang_epilogue_on_sampled_rows(device):
    """The epilogue lives in the finish that greedy and sampled rows share: launched with
    sampling (chain_verify's launcher), it lays out the sampled answer the same way."""
    B, N, V = 4, 3, 1100
    x = hard_logits(B * N, V, torch.float32, device, seed=8)
    x[:8] = torch.randn(8, V, generator=torch.Generator().manual_seed(1)).to(device)
    sampling = {"temperature": torch.tensor([0.7, 0.0, 1.3, float("nan")], device=device),
                "seeds": torch.tensor([1, 2, -3, 2**40], device=device),
                "positions": torch.tensor([0, 5, 77, 2**20], device=device)}
    cand = hard_candidates(x, B, N, seed=3, dtype=torch.int64)
    want = composed_verify(x, cand, torch.arange(B, device=device), **sampling)
    cand[:, 1:] = torch.where(torch.arange(N - 1, device=device) == 0,
                              want.predict.view(B, N)[:, :1], cand[:, 1:])  # accept some
    seq = torch.arange(B, device=device)
    want = composed_verify(x, cand, seq, **sampling)
    for cfg in (VERIFY_SMALL, {**VERIFY_SMALL, "SPLIT": 1, "UNROLL": 1}):
        got = poisoned_verify_out(B, N, seq.dtype, device)
        CV.launch_verify(x, cand[:, 1:], CV.VerifyResult(got.predict, got.num_correct_drafts,
                                                         got.bonus_tokens, got.select_index),
                         {**CV.heuristic(CV.tune_key(x.dtype, V, B, N - 1), device), **cfg},
                         B, N - 1, V, N * x.stride(0), x.stride(0),
                         sampling=tuple(sampling.values()),
                         sglang=(seq, got.draft_tokens, got.accept_index, got.accept_lens,
                                 got.new_seq_lens))
        assert_outputs(got, want, f"sampled {cfg}")
    assert int(want.num_correct_drafts.sum()) > 0


def test_verify_out_errors(device):
    B, N, V = 2, 3, 50
    x = torch.zeros(B * N, V, device=device)
    cand = torch.zeros(B, N, dtype=torch.int64, device=device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.zeros(B, dtype=torch.int32, device=device)
    good = poisoned_verify_out(B, N, torch.int32, device)

    def call(out):
        return S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq, out=out)

    with pytest.raises(ValueError, match=r"out.predict: expected shape \(6,\), got \(5,\)"):
        call(good._replace(predict=good.predict[:5]))
    with pytest.raises(TypeError, match="out.new_seq_lens: expected dtype int32, got int64"):
        call(good._replace(new_seq_lens=good.new_seq_lens.long()))
    with pytest.raises(ValueError, match="out.accept_index: expected a contiguous tensor"):
        call(good._replace(accept_index=torch.zeros(N, B, dtype=torch.int32,
                                                    device=device).t()))
    with pytest.raises(ValueError, match="out.select_index: expected a tensor on"):
        call(good._replace(select_index=good.select_index.to("meta")))
    with pytest.raises(TypeError, match="out: expected a TargetVerifyTopk1Output.*length 7"):
        call(tuple(good)[:7])
    with pytest.raises(TypeError, match="out: expected a TargetVerifyTopk1Output.*Tensor"):
        call(good.predict)
    # a plain tuple with None fields: given ones are filled, the others allocated
    partial = (good.predict, *([None] * 7))
    got = call(partial)
    assert got.predict is good.predict and isinstance(got, S.TargetVerifyTopk1Output)
    assert_outputs(got, composed_verify(x, cand, seq), "partial out=")


# --- draft and draft extend ------------------------------------------------------------
def test_draft_out_and_config(device):
    B, V = 5, 3001
    x = hard_logits(B, V, torch.bfloat16, device, seed=6)
    pos = torch.arange(B, dtype=torch.int64, device=device)
    dt = torch.full((B, 3), -1, dtype=torch.int64, device=device)
    p = torch.full((B, 1), float("nan"), device=device)
    i = torch.full((B, 1), -5, dtype=torch.int64, device=device)
    got = S.draft_topk1_postprocess(x, pos, dt, -1, out=(p, i), config=TAIL_SMALL)
    assert got[0] is p and got[1] is i
    want = torch.argmax(x, dim=1)
    assert_equal(i[:, 0], want, "topk_index")
    assert_equal(p, torch.ones(B, 1, device=device), "topk_p")
    assert_equal(dt[:, 2], want, "draft_tokens column")
    assert_equal(pos, torch.arange(1, B + 1, device=device), "positions")
    with pytest.raises(ValueError, match=r"out.topk_index: expected shape \(5, 1\)"):
        S.draft_topk1_postprocess(x, pos, out=(p, i[:, 0]))
    with pytest.raises(TypeError, match="out.topk_p: expected dtype float32, got float16"):
        S.draft_topk1_postprocess(x, pos, out=(p.half(), i))


def composed_extend(x, rows, hidden, dsa):
    """draft_tail's reference on the first R hidden rows, then relay_gather's rule for the
    DSA rows: what the helper computed in two launches."""
    R = x.shape[0]
    r = DT.reference(x, rows, None if hidden is None else hidden[:R])
    d = None
    if dsa is not None:
        d = torch.empty(rows.shape[0], dsa.shape[1], dtype=dsa.dtype, device=x.device)
        RELAY.reference_gather(rows, [(dsa[:R], d)])
    return r.probs[:, None], r.tokens[:, None], r.hidden, d


def check_extend(x, rows, hidden, dsa, cfgs=(None,)):
    B = rows.shape[0]
    want = composed_extend(x, rows, hidden, dsa)
    for cfg in cfgs:
        out = (torch.full((B, 1), float("nan"), device=x.device),
               torch.full((B, 1), -7, dtype=torch.int64, device=x.device),
               None if hidden is None else torch.full((B, hidden.shape[1]), 9,
                                                      dtype=hidden.dtype, device=x.device),
               None if dsa is None else torch.full((B, dsa.shape[1]), 9, dtype=dsa.dtype,
                                                   device=x.device))
        got = S.draft_extend_topk1_postprocess(x, rows, hidden, dsa, out=out, config=cfg)
        assert all(g is o for g, o in zip(got, out, strict=True)), "out= not returned"
        for name, g, w in zip(("topk_p", "topk_index", "hidden", "dsa"), got, want,
                              strict=True):
            if w is None:
                assert g is None, name
            else:
                assert_equal(g, w, f"{name} cfg={cfg}")


def dsa_rows(P, D, dtype, device, seed=0):
    """DSA-like rows of any dtype, with bit patterns a float copy could change (NaN
    payloads, -0.0) where the dtype has them."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-2**15, 2**15, (P, D), generator=g, dtype=torch.int64)
    if dtype == torch.bool:
        return (raw > 0).to(device)
    if dtype.is_floating_point:
        t = raw.to(dtype)
        t[:, 0] = -0.0
        t.view(torch.int16 if dtype.itemsize == 2 else torch.int32)[:, -1] = -1   # a NaN
        return t.to(device)
    return raw.to(dtype).to(device)


def test_extend_equals_composition(device):
    """Hidden and DSA rows gathered in the argmax's launch: rows repeated, out of order
    and out of range (int32 and int64 rows), DSA rows with a row stride and a width that
    is not a power of two; copy programs and the fused hidden copy; D = 0."""
    R, V, H, D = 6, 2500, 40, 37
    x = hard_logits(R, V, torch.float32, device, seed=9)
    hidden = torch.randn(R + 2, H, generator=torch.Generator().manual_seed(2)).to(device)
    backing = dsa_rows(R + 3, D + 5, torch.int32, device, seed=3)
    dsa = backing[:, 2:2 + D]                                       # row stride D + 5
    check_extend(x, torch.tensor([5, 0, 3, 3, -1, 6, 7], device=device), hidden, dsa,
                 cfgs=(TAIL_SMALL, {**TAIL_SMALL, "FUSE_H": 1}))
    rows = torch.tensor([2, 2**31 - 1, 1], dtype=torch.int32, device=device)
    check_extend(x, rows, hidden, dsa, cfgs=({**TAIL_SMALL, "SPLIT": 1, "num_warps": 1},))
    check_extend(x, rows, None, dsa, cfgs=(None,))
    check_extend(x, rows, hidden, None, cfgs=(TAIL_SMALL,))
    check_extend(x, rows, None, dsa[:, :0], cfgs=(TAIL_SMALL,))      # D = 0


def test_extend_dsa_dtypes(device):
    """The DSA rows move as raw bits whatever their dtype (NaN payloads, -0.0, bool)."""
    R, V = 3, 700
    x = hard_logits(R, V, torch.bfloat16, device, seed=4)
    rows = torch.tensor([2, -5, 0], device=device)
    for dtype in (torch.int64, torch.float16, torch.float32, torch.bool, torch.uint8):
        check_extend(x, rows, None, dsa_rows(R, 9, dtype, device, seed=1),
                     cfgs=(TAIL_SMALL,))


def test_extend_wide_rows_and_every_config(device, monkeypatch):
    """At DSA's and a hidden row's real widths (2048 top-k indices + 3: a tile and more;
    H = 7168), with the spin and the counter finishers (the copy programs count in the
    grid that decides between them), over a sample of the configs."""
    R, V, H, D = 5, 3000, 7168, 2048 + 3
    x = hard_logits(R, V, torch.bfloat16, device, seed=1)
    hidden = torch.randn(R, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    dsa = dsa_rows(R, D, torch.int32, device, seed=8)
    rows = torch.tensor([4, 1, 9], device=device)
    configs = DT.TUNING.configs(DT.tune_key(torch.bfloat16, V, 3, H))
    for sms in (1, 4096):
        monkeypatch.setattr(C, "sm_count", lambda d, n=sms: n)
        check_extend(x, rows, hidden.to(device), dsa, cfgs=sample_configs(configs, 4, seed=sms))


def test_extend_out_errors(device):
    R, V = 4, 100
    x = torch.zeros(R, V, device=device)
    rows = torch.tensor([0, 3], device=device)
    h = torch.zeros(R, 8, device=device)
    dsa = torch.zeros(R, 5, dtype=torch.int32, device=device)
    ok = [torch.empty(2, 1, device=device), torch.empty(2, 1, dtype=torch.int64, device=device),
          torch.empty(2, 8, device=device), torch.empty(2, 5, dtype=torch.int32, device=device)]
    with pytest.raises(ValueError, match="out.hidden_states: expected None .hidden_states "
                                         "is None., got a tensor"):
        S.draft_extend_topk1_postprocess(x, rows, None, dsa, out=ok)
    with pytest.raises(TypeError, match="out.dsa_topk_indices: expected dtype int32, got "
                                        "int64"):
        S.draft_extend_topk1_postprocess(x, rows, h, dsa, out=ok[:3] + [ok[3].long()])
    with pytest.raises(ValueError, match=r"out.hidden_states: expected shape \(2, 8\)"):
        S.draft_extend_topk1_postprocess(x, rows, h, dsa, out=[ok[0], ok[1], h, ok[3]])
    with pytest.raises(TypeError, match="out: expected a .topk_p, topk_index, hidden_states, "
                                        "dsa_topk_indices. tuple.*length 2"):
        S.draft_extend_topk1_postprocess(x, rows, h, dsa, out=ok[:2])
    with pytest.raises(ValueError, match="dsa_topk_indices: expected the last dim to be "
                                         "contiguous"):
        S.draft_extend_topk1_postprocess(x, rows, h, torch.zeros(5, R, dtype=torch.int32,
                                                                 device=device).t())
    with pytest.raises(TypeError, match="dsa_topk_indices: expected dtype"):
        S.draft_extend_topk1_postprocess(x, rows, h, dsa.to(torch.complex64))
    with pytest.raises(TypeError, match="hidden_states: expected dtype float16/bfloat16/"
                                        "float32, got int32"):
        S.draft_extend_topk1_postprocess(x, rows, dsa)
    with pytest.raises(ValueError, match="next_token_logits: expected at least one row"):
        S.draft_extend_topk1_postprocess(x[:0], rows)
    got = S.draft_extend_topk1_postprocess(x, rows, h, dsa, out=ok)
    assert all(g is o for g, o in zip(got, ok, strict=True))


# --- one launch each, nothing allocated with out= -------------------------------------------
class TritonLaunches:
    """Counts every Triton kernel launch (`kernel[grid](...)`, compiled or interpreted)."""

    def __init__(self, monkeypatch):
        self.names = []
        orig = triton.runtime.jit.KernelInterface.__getitem__

        def counted(kernel, grid):
            self.names.append(getattr(kernel, "fn", kernel).__name__)
            return orig(kernel, grid)

        monkeypatch.setattr(triton.runtime.jit.KernelInterface, "__getitem__", counted)

    def take(self):
        names, self.names = self.names, []
        return names


def one_call_each(device, B=3, with_out=False):
    """(name, thunk) for a call of each helper (every side input given)."""
    N, V, H, D = 3, 1100, 16, 12
    x = hard_logits(B * N, V, torch.bfloat16, device, seed=2)
    cand = hard_candidates(x, B, N, seed=1, dtype=torch.int64) if B else \
        torch.zeros(0, N, dtype=torch.int64, device=device)
    ridx, rnext = chain_layout(B, N, device)
    seq = torch.arange(B, device=device)
    out_v = poisoned_verify_out(B, N, seq.dtype, device) if with_out else None
    xd = x[:max(B, 1)]
    pos = torch.zeros(B, dtype=torch.int64, device=device)
    dt = torch.zeros(B, 2, dtype=torch.int64, device=device)
    out_d = (torch.empty(B, 1, device=device),
             torch.empty(B, 1, dtype=torch.int64, device=device)) if with_out else None
    rows = torch.arange(B, device=device).flip(0)
    h = torch.zeros(xd.shape[0], H, device=device)
    dsa = torch.zeros(xd.shape[0], D, dtype=torch.int32, device=device)
    out_e = (*out_d, torch.empty(B, H, device=device),
             torch.empty(B, D, dtype=torch.int32, device=device)) if with_out else None
    return [
        ("verify", lambda: S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq,
                                                             out=out_v)),
        ("draft", lambda: S.draft_topk1_postprocess(x[:B], pos, dt, 1, out=out_d)),
        ("extend", lambda: S.draft_extend_topk1_postprocess(xd, rows, h, dsa, out=out_e)),
        ("extend, dsa only", lambda: S.draft_extend_topk1_postprocess(
            xd, rows, None, dsa, out=None if out_e is None else (*out_d, None, out_e[3]))),
    ]


def test_one_launch_per_call(device, monkeypatch):
    launches = TritonLaunches(monkeypatch)
    kernel = {"verify": ["_verify_kernel"]}
    for with_out in (False, True):
        for name, call in one_call_each(device, with_out=with_out):
            call()
            assert launches.take() == kernel.get(name, ["_draft_tail_kernel"]), name
    for name, call in one_call_each(device, B=0):
        call()
        assert launches.take() == [], f"{name}, B=0"


@pytest.mark.skipif(not ON_GPU, reason="counts CUDA kernels and graph memory on a GPU")
def test_one_cuda_kernel_and_no_allocation_with_out(device):
    """On the GPU, each call is one CUDA kernel in all (no torch op beside it), and with
    out= its capture allocates nothing."""
    from helpers import capture
    from torch.profiler import ProfilerActivity, profile

    for name, call in one_call_each(device, B=5, with_out=True):
        call()                                       # compile, grow the workspace
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        assert len(kernels) == 1, f"{name}: {kernels}"
        graph, allocated = capture(call)
        graph.replay()
        assert allocated <= 0, f"{name}: the capture allocated {allocated} bytes"


def test_stage_pricing_kernels_compute_their_stage(device):
    """autotune.stages (the small-batch stage pricing of this launch) checks each stage's
    outputs before timing it; here on a small shape, so the script keeps working."""
    from autotune import stages

    shape = stages.Shape(1, 4, 3000, torch.bfloat16, device, sets=1)
    configs = stages.configs_for(shape)
    assert {label for label, _ in configs} >= {"heuristic"}
    for _, cfg in configs[:2]:
        shape.check(cfg)
    shape.only = ["read", "chain_verify"]        # --stages: only these are timed
    assert set(shape.timed_calls(configs[0][1])) == {"read", "chain_verify"}


def test_extend_reference_on_odd_rows(device):
    """`draft_extend_reference` equals draft_tail's and relay's composition on
    out-of-range row indices and with DSA rows."""
    x, _ = unique_max_logits(6, 3000, torch.bfloat16, device, seed=7)
    hidden = torch.randn(6, 64, device=device).to(torch.bfloat16)
    R = x.shape[0]
    odd = torch.tensor([R - 1, -3, R + 4, 0], device=device)
    dsa = dsa_rows(R, 5, torch.int32, device, seed=2)
    for name, g, w in zip(("topk_p", "topk_index", "hidden", "dsa"),
                          S.draft_extend_reference(x, odd, hidden, dsa),
                          composed_extend(x, odd, hidden, dsa), strict=True):
        assert_equal(g, w, f"{name}, out-of-range rows")
