"""recipes.compat.sglang against a torch model of SGLang's top-1 helpers' outputs; its bad
inputs and signatures. (Against the compositions its one-launch helpers replace:
test_compat_sglang_composed.py; its tables and tuning: test_compat_sglang_tuning.py.)

The model (`sglang_*` below) restates what SGLang's kernels compute, independently of our
kernels: the argmax with NaN read as -1e30 in float32 (SGLang's reduction), and the
verifier's walk along `retrieve_next_token` from node 0 with `retrieve_index` giving the
global rows (SGLang's finalize kernel), request by request in plain Python. On NaN-free
logits ours must equal the model bit for bit; with NaN the documented difference holds.
"""
import inspect

import pytest
import torch

from recipes.compat import sglang as S
from tests.helpers import ON_GPU, assert_equal, bad, bad_inputs_test


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

