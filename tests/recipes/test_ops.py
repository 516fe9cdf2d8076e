"""The custom ops (`recipes.ops`, namespace spec_cookbook): each one compiles inside a
`torch.compile(fullgraph=True)` function (so no graph break) and gives the recipe's
reference outputs bit for bit; `torch.library.opcheck` checks each op's schema (declared
mutations), fake implementation and AOT dispatch.

CPU: the kernels run under the Triton interpreter and the compiler backend is aot_eager
(Dynamo + AOT autograd + functionalization + fake tensors, without a C++ toolchain).
GPU: the inductor backend, plus a CUDA-graph ("reduce-overhead") run.
"""
import importlib

import pytest
import torch

import recipes
from recipes import ops
from tests.helpers import ON_GPU, assert_equal, bad, bad_inputs_test

BACKEND = "inductor" if ON_GPU else "aot_eager"


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=BACKEND)


def assert_tuple_equal(got, want, what, upto=None):
    """NamedTuples field by field; `upto` = {field: n} compares only the first n."""
    assert type(got) is type(want), f"{what}: {type(got).__name__} != {type(want).__name__}"
    for name, g, w in zip(type(want)._fields, got, want, strict=False):
        if w is None:
            assert g is None, f"{what}.{name}: expected None"
        else:
            n = (upto or {}).get(name)
            assert_equal(g if n is None else g[:n], w if n is None else w[:n],
                         f"{what}.{name}")


def opcheck(op, args):
    """schema (mutations declared), fake tensor, AOT dispatch; no autograd (no backward)."""
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


def test_every_op_is_registered():
    for name in ops.OPS:
        assert hasattr(torch.ops.spec_cookbook, name), name
    writes = {name: {a.name for a in getattr(torch.ops.spec_cookbook, name).default
                     ._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
              for name in ops.OPS}
    assert writes == {"argmax": set(), "chain_verify": set(), "verify_metadata": set(),
                      "draft_tail": {"positions", "draft_tokens"}, "relay_scatter": {"dsts"},
                      "relay_gather": {"dsts"}, "copy_inputs": {"dsts"}}, writes


# --- argmax -----------------------------------------------------------------------------
def test_argmax_op(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3000, generator=g).to(torch.bfloat16).to(device)
    x[1, 7] = float("nan")
    x[2] = float("-inf")
    fn = compiled(lambda t: ops.argmax(t) + 1)
    assert_equal(fn(x), torch.argmax(x, 1) + 1, "compiled argmax")
    opcheck(torch.ops.spec_cookbook.argmax.default, (x[:2],))


# --- chain_verify -----------------------------------------------------------------------
def _verify_inputs(device, B=3, K=3, V=2048, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B * (K + 1), V, generator=g).to(device)
    t = torch.argmax(x.view(B, K + 1, V).cpu(), -1)
    d = t[:, :K].clone()
    d[0, 1] = (d[0, 1] + 1) % V          # request 0 accepts 1, request 1 all, 2 pads
    if B > 2:
        d[2, 0:] = -1
    return x, d.to(device)


def test_chain_verify_op_greedy(device):
    x, d = _verify_inputs(device)
    fn = compiled(lambda x, d: ops.chain_verify(x, d))
    got = fn(x, d)
    assert_tuple_equal(got, recipes.chain_verify.reference(x, d), "compiled chain_verify")
    assert got.accept_len.tolist() == [1, 3, 0]
    opcheck(torch.ops.spec_cookbook.chain_verify.default, (x, d, None, None, None))


def test_chain_verify_op_sampled(device):
    B, K, V = 3, 2, 512
    x, d = _verify_inputs(device, B=B, K=K, V=V, seed=3)
    temp = torch.tensor([0.0, 0.7, 1.5], device=device)
    seeds = torch.tensor([11, -5, 2**40 + 3], dtype=torch.int64, device=device)
    pos = torch.tensor([40, 1000, 0], dtype=torch.int64, device=device)
    fn = compiled(lambda x, d, T, s, p: ops.chain_verify(x, d, temperature=T, seeds=s,
                                                         positions=p))
    got = fn(x, d, temp, seeds, pos)
    want = recipes.chain_verify.reference(x, d, temperature=temp, seeds=seeds, positions=pos)
    assert_tuple_equal(got, want, "compiled sampled chain_verify")


# --- draft_tail -------------------------------------------------------------------------
def _tail_inputs(device, R=6, V=3000, H=40, seed=2):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(R, V, generator=g).to(device)
    rows = torch.tensor([5, 0, 3], dtype=torch.int64, device=device)
    hidden = torch.randn(R, H, generator=g).to(torch.bfloat16).to(device)
    token_map = (torch.arange(V) + 100).to(device)
    positions = torch.tensor([7, 8, 9], dtype=torch.int64, device=device)
    draft_tokens = torch.full((3, 4), -1, dtype=torch.int64, device=device)
    return logits, rows, hidden, token_map, positions, draft_tokens


def test_draft_tail_op(device):
    logits, rows, hidden, token_map, positions, draft_tokens = _tail_inputs(device)
    DT = importlib.import_module("recipes.draft_tail")
    pos_ref, dt_ref = positions.clone(), draft_tokens.clone()
    want = DT.reference(logits, rows, hidden, token_map, pos_ref, dt_ref, 2)

    def step(logits, rows, hidden, token_map, positions, draft_tokens):
        r = ops.draft_tail(logits, rows=rows, hidden=hidden, token_map=token_map,
                           positions=positions, draft_tokens=draft_tokens, column=2)
        return r, r.tokens * 2

    got, doubled = compiled(step)(logits, rows, hidden, token_map, positions, draft_tokens)
    assert_tuple_equal(got, want, "compiled draft_tail")
    assert_equal(doubled, want.tokens * 2, "tokens * 2")
    assert_equal(positions, pos_ref, "positions (mutated in place)")
    assert_equal(draft_tokens, dt_ref, "draft_tokens (mutated in place)")

    plain = compiled(lambda x: ops.draft_tail(x))(logits)          # no hidden: None
    assert plain.hidden is None
    assert_equal(plain.tokens, torch.argmax(logits, 1), "draft_tail tokens")
    opcheck(torch.ops.spec_cookbook.draft_tail.default,
            (logits, rows, hidden, token_map, positions.clone(), draft_tokens.clone(), 1))
    opcheck(torch.ops.spec_cookbook.draft_tail_pure.default, (logits, rows, hidden, token_map))


# --- relay ------------------------------------------------------------------------------
def _relay_inputs(device, B=3, P=8, seed=4):
    g = torch.Generator().manual_seed(seed)
    index = torch.tensor([6, 1, 9], dtype=torch.int64, device=device)   # 9: outside, skipped
    bonus = torch.randint(0, 1000, (B,), generator=g, dtype=torch.int32).to(device)
    hid = torch.randn(B, 5, 16, generator=g).to(device)
    pool_bonus = torch.full((P,), -3, dtype=torch.int32, device=device)
    pool_hid = torch.randn(P, 5, 16, generator=g).to(device)
    return index, [bonus, hid], [pool_bonus, pool_hid]


def test_relay_scatter_op(device):
    RL = importlib.import_module("recipes.relay")
    index, srcs, pools = _relay_inputs(device)
    want = [p.clone() for p in pools]
    RL.reference_scatter(index, list(zip(srcs, want, strict=False)))

    def step(index, a, b, pa, pb):
        ops.relay_scatter(index, [(a, pa), (b, pb)])
        return pa.sum()

    s = compiled(step)(index, srcs[0], srcs[1], pools[0], pools[1])
    for i, (p, w) in enumerate(zip(pools, want, strict=False)):
        assert_equal(p, w, f"scattered pool {i}")
    assert_equal(s, want[0].sum(), "sum after scatter")
    opcheck(torch.ops.spec_cookbook.relay_scatter.default,
            (index, srcs, [p.clone() for p in pools]))
    # the raw op takes two lists: a field without its partner is an error, not dropped
    with pytest.raises(ValueError, match="srcs, dsts.*same length.*2 and 1"):
        torch.ops.spec_cookbook.relay_scatter(index, srcs, pools[:1])
    with pytest.raises(TypeError, match="fields\\[1\\].*\\(src, dst\\) pair"):
        ops.relay_scatter(index, [(srcs[0], pools[0]), srcs[1]])


def test_relay_gather_op(device):
    RL = importlib.import_module("recipes.relay")
    index, batch, pools = _relay_inputs(device)
    dsts = [torch.full_like(t, 77) for t in batch]
    want = [d.clone() for d in dsts]
    RL.reference_gather(index, list(zip(pools, want, strict=False)))

    def step(index, pa, pb, da, db):
        ops.relay_gather(index, [(pa, da), (pb, db)])

    compiled(step)(index, pools[0], pools[1], dsts[0], dsts[1])
    for i, (d, w) in enumerate(zip(dsts, want, strict=False)):
        assert_equal(d, w, f"gathered field {i}")
    assert int(dsts[0][2]) == 0, "an outside slot gathers zeros"
    opcheck(torch.ops.spec_cookbook.relay_gather.default,
            (index, pools, [d.clone() for d in dsts]))


# --- verify_metadata --------------------------------------------------------------------
def _metadata_inputs(device, B=3, P=5, C=64, seed=5):
    g = torch.Generator().manual_seed(seed)
    req = torch.tensor([4, 0, 2], dtype=torch.int64, device=device)
    seq = torch.tensor([10, 0, 50], dtype=torch.int32, device=device)
    r2t = torch.randint(0, 10000, (P, C), generator=g, dtype=torch.int32).to(device)
    return req, seq, r2t


@pytest.mark.parametrize("layout", ["fa3", "flashinfer", "both"])
def test_verify_metadata_op(device, layout):
    VM = importlib.import_module("recipes.verify_metadata")
    req, seq, r2t = _metadata_inputs(device)
    kw = dict(page_size=4, window=None, max_pages=None, layout=layout)
    want = VM.reference(req, seq, r2t, 4, **kw)

    def step(req, seq, r2t):
        return ops.verify_metadata(req, seq, r2t, 4, page_size=4, layout=layout)

    got = compiled(step)(req, seq, r2t)
    # kv_indices past kv_indptr[B] are unspecified
    upto = None if want.kv_indptr is None else {"kv_indices": int(want.kv_indptr[-1])}
    assert_tuple_equal(got, want, f"compiled verify_metadata {layout}", upto)
    if layout == "both":
        win = compiled(lambda a, b, c: ops.verify_metadata(a, b, c, 4, page_size=4,
                                                          window=16, layout="fa3"))
        assert_tuple_equal(win(req, seq, r2t),
                           VM.reference(req, seq, r2t, 4, page_size=4, window=16,
                                        max_pages=None, layout="fa3"), "window")
    if layout == "fa3":     # (flashinfer's kv_indices tail is unspecified: not comparable)
        opcheck(torch.ops.spec_cookbook.verify_metadata.default,
                (req, seq, r2t, 4, 4, None, None, layout))


# --- copy_inputs ------------------------------------------------------------------------
def test_copy_inputs_op(device):
    g = torch.Generator().manual_seed(6)
    srcs = [torch.randn(37, generator=g).to(device),
            torch.randint(0, 9, (3, 5), generator=g).to(device),
            torch.tensor([float("nan"), -0.0], dtype=torch.bfloat16, device=device)]
    dsts = [torch.zeros_like(s) for s in srcs]

    def step(d0, d1, d2, s0, s1, s2):
        ops.copy_inputs(src=[s0, s1, s2], dst=[d0, d1, d2])

    compiled(step)(*dsts, *srcs)
    for i, (d, s) in enumerate(zip(dsts, srcs, strict=False)):
        assert_equal(d.view(torch.uint8) if d.dtype == torch.bfloat16 else d,
                     s.view(torch.uint8) if s.dtype == torch.bfloat16 else s, f"pair {i}")
    opcheck(torch.ops.spec_cookbook.copy_inputs.default,
            (srcs[:2], [torch.zeros_like(s) for s in srcs[:2]]))
    with pytest.raises(ValueError, match="src, dst.*same length.*2 and 1"):
        torch.ops.spec_cookbook.copy_inputs(srcs[:2], dsts[:1])
    with pytest.raises(TypeError, match="copy_inputs: expected keyword arguments src=.* "
                                        "and dst="):
        ops.copy_inputs([(dsts[0], srcs[0])])
    with pytest.raises(TypeError, match="dst: expected a list or tuple of tensors, got "
                                        "Tensor"):
        ops.copy_inputs(src=[srcs[0]], dst=dsts[0])


# --- bad inputs through the ops -------------------------------------------------------
def _i64(dev, *shape):
    return torch.zeros(*shape, dtype=torch.int64, device=dev)


COLUMN = "column: expected only with draft_tokens"
BAD = [
    bad("draft_tail column alone",
        lambda d: ops.draft_tail(torch.randn(4, 10, device=d), column=1), ValueError, COLUMN),
    bad("draft_tail column with positions only",
        lambda d: ops.draft_tail(torch.randn(4, 10, device=d), positions=_i64(d, 4),
                                 column=0), ValueError, COLUMN),
    bad("draft_tail op column without draft_tokens",
        lambda d: torch.ops.spec_cookbook.draft_tail(torch.randn(4, 10, device=d), None,
                                                     None, None, _i64(d, 4), None, 2),
        ValueError, COLUMN),
    bad("draft_tail op positions in draft_tokens",
        lambda d: (lambda dt: torch.ops.spec_cookbook.draft_tail(
            torch.randn(4, 10, device=d), None, None, None, dt[:, 1], dt, 1))(_i64(d, 4, 3)),
        ValueError, "draft_tokens: expected a tensor that shares no memory with positions"),
    bad("chain_verify seeds alone",
        lambda d: ops.chain_verify(torch.randn(8, 10, device=d), _i64(d, 2, 3),
                                   seeds=_i64(d, 2)), ValueError,
        "seeds: expected None without temperature"),
    bad("relay_scatter one dst twice",
        lambda d: (lambda p: ops.relay_scatter(_i64(d, 2), [(_i64(d, 2), p),
                                                            (_i64(d, 2), p)]))(_i64(d, 5)),
        ValueError, r"fields\[[01]\] dst: expected a tensor that shares no memory"),
    bad("copy_inputs dst is src",
        lambda d: (lambda a: ops.copy_inputs(src=[a], dst=[a]))(_i64(d, 4)), ValueError,
        r"dst\[0\]: expected a tensor that shares no memory with src\[0\]"),
]


test_bad_inputs = bad_inputs_test(BAD)


# --- CUDA graphs through torch.compile -------------------------------------------------
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_reduce_overhead_cuda_graphs(device, monkeypatch):
    """On a fresh stage-2 scratch, so that its first allocation happens inside the
    warm-up (whose thread's allocations go to the graph pool) whatever ran before."""
    from recipes import _common as C

    monkeypatch.setattr(C, "WORKSPACE", C._Workspace())
    x, d = _verify_inputs(device, B=4, K=3, V=151936)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, d: tuple(ops.chain_verify(x, d)) + (ops.argmax(x),),
                       mode="reduce-overhead", fullgraph=True)
    want = recipes.chain_verify.reference(x, d)
    for _ in range(3):                      # warm-up, record, replay
        got = fn(x, d)
        for name, g_, w in zip(want._fields, got[:4], want, strict=False):
            assert_equal(g_, w, name)
        assert_equal(got[4], torch.argmax(x, 1), "argmax")
