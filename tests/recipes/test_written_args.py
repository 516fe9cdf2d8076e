"""Written arguments: every out= buffer and in-place argument of every recipe and adapter
refuses an expanded (stride-0) or otherwise self-overlapping view with a ValueError
naming it (several programs would write one address), and an out= buffer that shares
memory with an input or another output raises ValueError too. Host checks of shapes,
strides and address ranges (`_common.check_written`, `_common.check_no_overlap`)."""
import importlib
import re
import types

import pytest
import torch

import recipes
from recipes import VerifyResult, tp
from recipes import _common as C
from recipes.compat import sglang
from recipes.compat.vllm import mrv2, v1
from tests.helpers import assert_equal, bad, bad_inputs_test, int64_alias

DT = importlib.import_module("recipes.draft_tail")
VM = importlib.import_module("recipes.verify_metadata")
SELF = "expected a tensor whose dims do not overlap in memory"
STRIDE0 = SELF + r".*stride 0 \(an expanded view\)"
SHARED = "expected a tensor that shares no memory with"
B, K, V = 3, 2, 40
i32, i64, f32 = torch.int32, torch.int64, torch.float32


# --- the check itself ------------------------------------------------------------------
ACCEPTED = {
    "contiguous": lambda: torch.zeros(3, 4),
    "transposed": lambda: torch.zeros(3, 4).t(),
    "every other": lambda: torch.zeros(8)[::2],
    "a column": lambda: torch.zeros(4, 3)[:, 1],
    "a sliced block": lambda: torch.zeros(6, 8)[1:5:2, ::3],
    "size-1 dim expanded": lambda: torch.zeros(1, 4).expand(1, 4),
    "empty, expanded": lambda: torch.zeros(1, 0).expand(5, 0),
    "one element": lambda: torch.zeros(1).expand(1),
}
REFUSED = {
    "expanded rows": (lambda: torch.zeros(1, 4).expand(3, 4), "dim 0 has stride 0"),
    "expanded scalar": (lambda: torch.zeros(()).expand(5), "dim 0 has stride 0"),
    "sliding windows": (lambda: torch.zeros(10).unfold(0, 3, 1),
                        r"dim 0 \(stride 1\) steps inside the span"),
    "interleaved dims": (lambda: torch.zeros(10).as_strided((3, 2), (2, 3)),
                         r"dim 1 \(stride 3\) steps inside the span .*5 elements"),
}


@pytest.mark.parametrize("make", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_check_written_accepts_distinct_elements(make):
    C.check_written("x", make())


@pytest.mark.parametrize("make,why", REFUSED.values(), ids=REFUSED.keys())
def test_check_written_refuses_shared_elements(make, why):
    t = make()
    shape = re.escape(str(tuple(t.shape)))
    with pytest.raises(ValueError, match=rf"^x: {SELF}.*got shape {shape}.*{why}"):
        C.check_written("x", t)


# --- every recipe and adapter ------------------------------------------------------------
def zeros(dev, *shape, dtype=i64):
    return torch.zeros(shape, dtype=dtype, device=dev)


def expanded(dev, *shape, dtype=i64):
    """A [shape] view of one row (dim 0 stride 0)."""
    return zeros(dev, 1, *shape[1:], dtype=dtype).expand(*shape)


def logits(dev, rows=B * (K + 1)):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, V, generator=g).to(dev)


def verify_out(dev, **over):
    o = dict(tokens=zeros(dev, B, K + 1, dtype=i32), accept_len=zeros(dev, B, dtype=i32),
             bonus=zeros(dev, B, dtype=i32), select_index=zeros(dev, B))
    return VerifyResult(**{**o, **{k: v(dev) for k, v in over.items()}})


def chain(dev, **over):
    return recipes.chain_verify(logits(dev), zeros(dev, B, K), out=verify_out(dev, **over))


def tail(dev, positions=None, draft_tokens=None, out=None):
    return recipes.draft_tail(logits(dev, B), positions=positions, draft_tokens=draft_tokens,
                              column=0 if draft_tokens is not None else DT.COLUMN_DEFAULT,
                              out=out)


def metadata(dev, **out):
    """B=2 requests, N=2: out fields from out[name](device, the [4] buffer whose first
    half is seq_lens)."""
    r2t = torch.arange(2 * 16, dtype=i32, device=dev).view(2, 16)
    buf = torch.tensor([3, 5, 0, 0], device=dev)
    return recipes.verify_metadata(torch.tensor([0, 1], device=dev), buf[:2], r2t, 2,
                                   out=VM.VerifyMetadata(**{k: v(dev, buf)
                                                            for k, v in out.items()}))


def sg_verify(dev, **over):
    cand = zeros(dev, B, K + 1)
    chain_ = torch.arange(B * (K + 1), device=dev).view(B, K + 1)
    names = sglang.TargetVerifyTopk1Output._fields
    out = [None] * len(names)
    for k, v in over.items():
        out[names.index(k)] = v(dev)
    return sglang.target_verify_topk1_postprocess(logits(dev), cand, chain_, chain_,
                                                  zeros(dev, B), out=tuple(out))


def sg_topk1(dev, positions=None, draft_tokens=None, out=None):
    return sglang.draft_topk1_postprocess(
        logits(dev, B), zeros(dev, B) if positions is None else positions, draft_tokens, 0,
        out=out)


def sg_extend(dev, out):
    hidden = torch.zeros(B + 1, 8, device=dev)
    return sglang.draft_extend_topk1_postprocess(
        logits(dev, B + 1), torch.arange(B, device=dev), hidden, out=out(dev, hidden))


def greedy_meta():
    return types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                                 top_k=None, top_p=None, generators={})


def vllm_v1(dev, out):
    return v1.rejection_sample(zeros(dev, B * K), [K] * B, K,
                               torch.arange(1, B + 1, device=dev) * K, None,
                               logits(dev, B * K), zeros(dev, B, 1, dtype=i32), greedy_meta(),
                               out=out(dev))


def vllm_mrv2(dev, out):
    N = B * (K + 1)
    pos, x = torch.arange(N, device=dev), logits(dev)
    return mrv2.rejection_sample(x, None, zeros(dev, N),
                                 torch.arange(B + 1, device=dev) * (K + 1), pos,
                                 torch.arange(B, device=dev), zeros(dev, N), pos,
                                 torch.zeros(B, device=dev), zeros(dev, B), K, out=out(dev, x))


def tp_keys(dev, out, temperature=False):
    x = logits(dev)
    kw = {}
    if temperature:
        kw = dict(temperature=torch.ones(B, device=dev), seeds=zeros(dev, B),
                  positions=zeros(dev, B))
    return tp.local_keys(x, vocab_start=0, vocab_size=V, out=out(dev, x, kw), **kw)


def _relay_over_index(dev):
    buf = zeros(dev, B * 4)
    index = buf[-B:]                                 # slots 0: valid
    return recipes.relay_gather(index, [(zeros(dev, 5, 4), buf.view(B, 4))])


def _keys_over_seeds(dev):
    keys = zeros(dev, B * (K + 1))
    return tp.local_keys(logits(dev), vocab_start=0, vocab_size=V,
                         temperature=torch.ones(B, device=dev), seeds=keys[-B:],
                         positions=zeros(dev, B), out=keys)


def _relay(dev, gather, dst):
    index = torch.tensor([0, 2, 1], device=dev)
    src = zeros(dev, 5 if gather else B, 4)
    return (recipes.relay_gather if gather else recipes.relay_scatter)(
        index, [(src, dst(dev, index, src))])


WRITTEN = [
    # out= buffers, expanded
    bad("argmax out", lambda d: recipes.argmax(logits(d), out=expanded(d, B * (K + 1))),
        ValueError, f"^out: {STRIDE0}"),
    bad("chain_verify out.tokens",
        lambda d: chain(d, tokens=lambda d: expanded(d, B, K + 1, dtype=i32)), ValueError,
        f"^out.tokens: {STRIDE0}"),
    bad("chain_verify out.select_index",
        lambda d: chain(d, select_index=lambda d: expanded(d, B)), ValueError,
        f"^out.select_index: {STRIDE0}"),
    bad("draft_tail out.probs",
        lambda d: tail(d, out=DT.DraftTail(None, expanded(d, B, dtype=f32), None)),
        ValueError, f"^out.probs: {STRIDE0}"),
    bad("verify_metadata out.page_table",
        lambda d: metadata(d, page_table=lambda d, buf: expanded(d, 2, 16, dtype=i32)),
        ValueError, f"^out.page_table: {STRIDE0}"),
    bad("tp.argmax out", lambda d: tp.argmax(logits(d), vocab_start=0, vocab_size=V,
                                             out=expanded(d, B * (K + 1))),
        ValueError, f"^out: {STRIDE0}"),
    bad("tp.local_keys out", lambda d: tp_keys(d, lambda d, x, kw: expanded(d, B * (K + 1))),
        ValueError, f"^out: {STRIDE0}"),
    bad("tp.finish_argmax out", lambda d: tp.finish_argmax(zeros(d, 4), out=expanded(d, 4)),
        ValueError, f"^out: {STRIDE0}"),
    bad("tp.finish_verify out.bonus",
        lambda d: tp.finish_verify(zeros(d, B * (K + 1)), zeros(d, B, K), out=verify_out(
            d, bonus=lambda d: expanded(d, B, dtype=i32))), ValueError,
        f"^out.bonus: {STRIDE0}"),
    bad("sglang target_verify out.accept_index",
        lambda d: sg_verify(d, accept_index=lambda d: expanded(d, B, K + 1, dtype=i32)),
        ValueError, f"^out.accept_index: {STRIDE0}"),
    bad("sglang draft_topk1 out.topk_p",
        lambda d: sg_topk1(d, out=(expanded(d, B, 1, dtype=f32), None)), ValueError,
        f"^out.topk_p: {STRIDE0}"),
    bad("sglang draft_extend out.hidden_states",
        lambda d: sg_extend(d, lambda d, h: (None, None, expanded(d, B, 8, dtype=f32), None)),
        ValueError, f"^out.hidden_states: {STRIDE0}"),
    bad("vllm v1 out", lambda d: vllm_v1(d, lambda d: expanded(d, B, K + 1, dtype=i32)),
        ValueError, f"^out: {STRIDE0}"),
    bad("vllm mrv2 out.sampled",
        lambda d: vllm_mrv2(d, lambda d, x: (expanded(d, B, K + 1), zeros(d, B, dtype=i32))),
        ValueError, f"^out.sampled: {STRIDE0}"),
    # in-place arguments and destinations
    bad("draft_tail positions", lambda d: tail(d, positions=expanded(d, B)), ValueError,
        f"^positions: {STRIDE0}"),
    bad("draft_tail draft_tokens", lambda d: tail(d, draft_tokens=expanded(d, B, K)),
        ValueError, f"^draft_tokens: {STRIDE0}"),
    bad("draft_tail draft_tokens windows",
        lambda d: tail(d, draft_tokens=zeros(d, B + K).unfold(0, K, 1)[:B]), ValueError,
        f"^draft_tokens: {SELF}.*steps inside the span"),
    bad("sglang draft_topk1 positions", lambda d: sg_topk1(d, positions=expanded(d, B)),
        ValueError, f"^positions: {STRIDE0}"),
    bad("sglang draft_topk1 draft_tokens",
        lambda d: sg_topk1(d, draft_tokens=expanded(d, B, K)), ValueError,
        f"^draft_tokens: {STRIDE0}"),
    bad("relay_scatter dst", lambda d: _relay(d, False, lambda d, i, s: expanded(d, 5, 4)),
        ValueError, rf"^fields\[0\] dst: {STRIDE0}"),
    bad("relay_gather dst", lambda d: _relay(d, True, lambda d, i, s: expanded(d, B, 4)),
        ValueError, rf"^fields\[0\] dst: {STRIDE0}"),
    bad("copy_inputs dst", lambda d: recipes.copy_inputs(src=[zeros(d, 4), zeros(d, 4)],
                                                         dst=[zeros(d, 4), expanded(d, 4)]),
        ValueError, rf"^dst\[1\]: {STRIDE0}"),
]
test_written_views = bad_inputs_test(WRITTEN)


OVERLAP = [
    bad("argmax out in logits", lambda d: (lambda x: recipes.argmax(
        x, out=int64_alias(x, B * (K + 1))))(logits(d)), ValueError, f"^out: {SHARED} logits"),
    bad("chain_verify out.bonus is out.accept_len",
        lambda d: (lambda a: chain(d, accept_len=lambda d: a, bonus=lambda d: a))(
            zeros(d, B, dtype=i32)), ValueError, f"out.(accept_len|bonus): {SHARED} out."),
    bad("draft_tail out.tokens over positions",
        lambda d: (lambda p: tail(d, positions=p, out=DT.DraftTail(p, None, None)))(
            zeros(d, B)), ValueError, f"(out.tokens|positions): {SHARED}"),
    bad("verify_metadata out.positions over seq_lens",
        lambda d: metadata(d, positions=lambda d, buf: buf), ValueError,
        f"^out.positions: {SHARED} seq_lens"),
    bad("relay_gather dst over index", lambda d: _relay_over_index(d), ValueError,
        rf"^fields\[0\] dst: {SHARED} index"),
    bad("copy_inputs dst over src", lambda d: (lambda b: recipes.copy_inputs(
        src=[b[:4]], dst=[b[2:6]]))(zeros(d, 8)), ValueError, rf"dst\[0\]: {SHARED} src\[0\]"),
    bad("tp.local_keys out in local_logits",
        lambda d: tp_keys(d, lambda d, x, kw: int64_alias(x, B * (K + 1))), ValueError,
        f"^out: {SHARED} local_logits"),
    bad("tp.local_keys out over seeds", lambda d: _keys_over_seeds(d), ValueError,
        f"^out: {SHARED} seeds"),
    bad("tp.finish_argmax out half over keys",
        lambda d: (lambda k: tp.finish_argmax(k[:4], out=k[2:]))(zeros(d, 6)), ValueError,
        f"^out: {SHARED} keys"),
    bad("tp.finish_verify out.select_index in keys",
        lambda d: (lambda k: tp.finish_verify(k, zeros(d, B, K), out=verify_out(
            d, select_index=lambda d: k[:B])))(zeros(d, B * (K + 1))), ValueError,
        f"^out.select_index: {SHARED} keys"),
    bad("sglang target_verify out.new_seq_lens is out.select_index",
        lambda d: (lambda a: sg_verify(d, new_seq_lens=lambda d: a, select_index=lambda d: a))(
            zeros(d, B)), ValueError, f"out.(new_seq_lens|select_index): {SHARED} out."),
    bad("sglang draft_topk1 out.topk_index over positions",
        lambda d: (lambda p: sg_topk1(d, positions=p, out=(None, p.view(B, 1))))(zeros(d, B)),
        ValueError, f"(out.topk_index|positions): {SHARED}"),
    bad("vllm mrv2 out.num_sampled in target_logits", lambda d: vllm_mrv2(
        d, lambda d, x: (zeros(d, B, K + 1), x.view(i32).view(-1)[:B])), ValueError,
        f"^out.num_sampled: {SHARED} target_logits"),
]
test_out_overlap = bad_inputs_test(OVERLAP)


# --- strided, non-overlapping written arguments stay accepted and exact -------------------
def test_strided_in_place_arguments_are_exact(device):
    x = logits(device, B)
    pos_buf = torch.arange(2 * B, device=device) * 10
    dt_buf = torch.full((K + 1, B), -1, dtype=i64, device=device)
    positions, draft_tokens = pos_buf[::2], dt_buf.t()           # strides (2,) and (1, B)
    want_pos, want_dt = positions.clone(), draft_tokens.clone()
    want = DT.reference(x, positions=want_pos, draft_tokens=want_dt, column=1)
    got = recipes.draft_tail(x, positions=positions, draft_tokens=draft_tokens, column=1)
    assert_equal(got.tokens, want.tokens, "tokens")
    assert_equal(positions, want_pos, "positions")
    assert_equal(draft_tokens, want_dt, "draft_tokens")
    assert_equal(pos_buf[1::2], torch.arange(B, device=device) * 20 + 10, "untouched")


def test_relay_dst_with_spaced_rows_is_exact(device):
    index = torch.tensor([2, 0, 7], device=device)
    src = torch.arange(B * 3, dtype=f32, device=device).view(B, 3)
    pool = torch.full((4, 5), -1.0, device=device)
    dst = pool[:, :3]                                       # rows 5 apart, 3 wide
    recipes.relay_scatter(index, [(src, dst)])
    want = torch.full((4, 5), -1.0)
    want[2, :3], want[0, :3] = src[0].cpu(), src[1].cpu()  # slot 7 is outside: skipped
    assert_equal(pool.cpu(), want, "pool")
