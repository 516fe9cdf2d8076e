"""recipes.compat.sglang's one-launch helpers against the compositions they replace.

The compositions (`composed_*`) are what the helpers computed in several launches before
they were one: `recipes.chain_verify` followed by SGLang's layout in torch, and
`draft_tail` followed by relay_gather's rule for the DSA rows. On the hard inputs (ties,
NaN, all -inf rows, drafts outside the vocabulary) the one launch must equal them bit
for bit, for every config, with every output poisoned beforehand. Each helper is one
launch, and with out= its capture allocates nothing.
"""
import importlib

import pytest
import torch
import triton

import recipes
from recipes import _common as C
from recipes.compat import sglang as S
from tests.helpers import ON_GPU, assert_equal, drafts_around, hard_logits, sample_configs
from tests.recipes.test_compat_sglang import assert_outputs, chain_layout

CV = importlib.import_module("recipes.chain_verify")
DT = importlib.import_module("recipes.draft_tail")
RELAY = importlib.import_module("recipes.relay")


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
    from torch.profiler import ProfilerActivity, profile

    from tests.helpers import capture

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

