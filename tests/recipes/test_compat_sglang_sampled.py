"""recipes.compat.sglang's sampled chain verify (`target_verify_topk1_sample_postprocess`):
every field against chain_verify's reference in SGLang's layout (the exact tokens of our
random stream, with the spec's near-tie and threshold tolerances), against
recipes.chain_verify on the same inputs (bit for bit: the same launches), SGLang's greedy
requests (temperature 1, top_k 1) against the greedy verifier, the launch count, out=,
B = 0/1/odd, errors naming SGLang's arguments, and the emitted tokens' distribution."""
import importlib
import inspect

import pytest
import torch

import recipes
from recipes.compat import sglang as S
from tests.helpers import ON_GPU, CountingKernel, assert_equal, bad, bad_inputs_test, hard_logits
from tests.recipes.test_chain_verify_controls import check, chi2

CV = importlib.import_module("recipes.chain_verify")
CC = importlib.import_module("recipes._controls_core")
SMALL = {"BLOCK_V": 1024, "SPLIT": 2, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
         "EXACT": 0}
FN = S.target_verify_topk1_sample_postprocess


# --- inputs -------------------------------------------------------------------------------
def chain(B, N, device):
    ridx = torch.arange(B * N, device=device).view(B, N)
    rnext = torch.arange(1, N + 1, device=device).repeat(B, 1)
    rnext[:, -1] = -1
    return ridx, rnext


def batch(B, N, V, device, seed, dtype=torch.bfloat16):
    """Logits with planted ties and -inf stretches, candidates whose drafts are the rows'
    argmax (so the sampled targets accept some), SGLang's [B, 1] temperatures (one
    greedy 0, one NaN where B allows), seeds, seq_lens."""
    g = torch.Generator().manual_seed(seed)
    R = B * N
    scale = torch.tensor([0.3, 1.0, 4.0, 12.0])[torch.arange(R) % 4][:, None]
    x = torch.randn(R, V, generator=g) * scale
    x[1::5, : V // 3] = float("-inf")
    x[2::5, torch.randint(0, V, (V // 8,), generator=g)] = 3.0
    top = x.argmax(dim=1).view(B, N)
    cand = torch.cat([torch.randint(0, V, (B, 1), generator=g), top[:, :N - 1]], dim=1)
    T = (torch.rand(B, 1, generator=g) + 0.4)
    if B > 2:
        T[1, 0], T[2, 0] = 0.0, float("nan")
    seeds = torch.randint(-2**62, 2**62, (B,), generator=g)
    seq = torch.randint(1, 2**20, (B,), generator=g)
    ridx, rnext = chain(B, N, "cpu")
    return [t.to(device) for t in (x.to(dtype), cand, ridx, rnext, seq, T, seeds)]


def ctl(device, B, **c):
    out = {}
    for name, vals in c.items():
        dt = torch.int32 if name == "top_ks" else torch.float32
        out[name] = torch.tensor((vals * B)[:B], dtype=dt, device=device)
    return out


def as_verify(res, B, N):
    """The SGLang fields' VerifyResult (chain_verify's layout)."""
    keep = res.accept_index.view(B, N) >= 0
    tokens = torch.where(keep, res.predict.view(B, N), -1)
    return CV.VerifyResult(tokens, res.num_correct_drafts, res.bonus_tokens,
                           res.select_index)


def check_call(x, cand, ridx, rnext, seq, T, seeds, controls, positions=None, **kw):
    """One call checked three ways: the tokens against chain_verify's reference (near-tie
    and threshold tolerances), every SGLang field against the layout of those tokens,
    and every field against recipes.chain_verify on the same inputs, bit for bit."""
    B, N = cand.shape
    got = FN(x, cand, ridx, rnext, seq, T, **controls, seeds=seeds, positions=positions, **kw)
    pos = seq if positions is None else positions
    cv_kw = {"temperature": T.reshape(B), "seeds": seeds, "positions": pos,
             **{n: controls[s] for s, n in zip(S.CONTROL_NAMES, CV.CONTROL_NAMES,
                                                strict=True) if s in controls}}
    vr = as_verify(got, B, N)
    check(x.reshape(B * N, -1), cand[:, 1:], cv_kw, vr)
    for a, b, f in zip(got, S._sglang_fields(vr, cand, seq), got._fields, strict=True):
        assert_equal(a, b, f"layout of {f}")
    cv = recipes.chain_verify(x.reshape(B * N, -1), cand[:, 1:], config=kw.get("config"),
                              **cv_kw)
    for a, b, f in zip(got, S._sglang_fields(cv, cand, seq), got._fields, strict=True):
        assert_equal(a, b, f"{f} vs chain_verify")
    return got


COMBOS = {
    "temperature": {},
    "top_k+top_p": {"top_ks": [20, 1, 5, 1 << 30, 7], "top_ps": [0.95, 1.0, 0.5, 0.8, 0.3]},
    "min_p": {"min_ps": [0.05, 0.0, 0.2, 1.0, 0.01]},
    "all": {"top_ks": [20, -1, 5, 100, 40], "top_ps": [0.95, 0.8, 1.0, 0.6, 0.9],
            "min_ps": [0.05, 0.0, 0.2, 0.01, 0.0]},
}


# --- parity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("combo", list(COMBOS))
def test_fields_against_reference_and_chain_verify(device, combo):
    B, N, V = 5, 3, 300
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=len(combo))
    got = check_call(x, cand, ridx, rnext, seq, T, seeds, ctl(device, B, **COMBOS[combo]),
                     config=SMALL)
    assert int(got.num_correct_drafts.sum()) > 0          # the accept path is exercised


def test_temperature_shapes_positions_and_configs(device):
    """[B] and [B, 1] temperatures agree; explicit positions replace seq_lens; every
    config gives the same bits; seq_lens keep their dtype in new_seq_lens; int32
    candidates and seq_lens."""
    B, N, V = 3, 4, 700
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=11, dtype=torch.float32)
    c = ctl(device, B, top_ks=[3, 50, 9], top_ps=[0.9, 0.7, 1.0])
    a = check_call(x, cand, ridx, rnext, seq, T, seeds, c, config=SMALL)
    b = check_call(x, cand, ridx, rnext, seq, T.view(B), seeds, c,
                   config={**SMALL, "SPLIT": 1, "UNROLL": 2})
    for u, v, f in zip(a, b, a._fields, strict=True):
        assert_equal(u, v, f)
    assert a.new_seq_lens.dtype == seq.dtype
    pos = torch.tensor([5, 2**30, 77], device=device)
    check_call(x, cand, ridx, rnext, seq, T, seeds, c, positions=pos, config=None)
    check_call(x, cand.to(torch.int32), ridx, rnext, seq.to(torch.int32), T, seeds, c,
               config=SMALL)


def test_sglang_greedy_requests_are_the_greedy_verifier(device):
    """SGLang turns a greedy request of a sampled batch into temperature 1 and top_k 1:
    such requests get exactly the greedy verifier's fields, on the hard rows (ties,
    NaN, all -inf, -0.0, +inf) too."""
    B, N, V = 4, 4, 1100
    x = hard_logits(B * N, V, torch.float32, device, seed=2)
    top = torch.argmax(x, dim=1).view(B, N)
    cand = torch.cat([top[:, :1] * 0, top[:, :N - 1]], dim=1)
    cand[1, 2] = -1
    ridx, rnext = chain(B, N, device)
    seq = torch.arange(B, device=device) + 40
    T = torch.ones(B, 1, device=device)
    got = FN(x, cand, ridx, rnext, seq, T, torch.ones(B, dtype=torch.int32, device=device),
             seeds=torch.arange(B, device=device), config=SMALL)
    want = S.target_verify_topk1_postprocess(x, cand, ridx, rnext, seq)
    for a, b, f in zip(got, want, got._fields, strict=True):
        assert_equal(a, b, f)


def test_batch_invariance(device):
    """A request's fields do not depend on the other requests or on the batch size."""
    B, N, V = 5, 3, 300
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=21)
    c = ctl(device, B, **COMBOS["all"])
    full = FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds, config=SMALL)
    x3 = x.view(B, N, V)
    for b in (0, 3):
        one = FN(x3[b:b + 1], cand[b:b + 1], *chain(1, N, device), seq[b:b + 1],
                 T[b:b + 1], **{k: v[b:b + 1] for k, v in c.items()}, seeds=seeds[b:b + 1],
                 config=SMALL)
        assert_equal(one.predict, full.predict[b * N:(b + 1) * N], f"request {b}")
        assert_equal(one.num_correct_drafts, full.num_correct_drafts[b:b + 1], f"req {b}")


def test_real_vocab(device):
    """V = 151936 bf16, N = 4: temperature only and with min_p (the CPU's affordable
    control); top_k 20 with top_p 0.95 on the GPU."""
    B, N, V = 1, 4, 151936
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=5)
    big = None if ON_GPU else {"BLOCK_V": 8192, "SPLIT": 1, "num_warps": 8}
    check_call(x, cand, ridx, rnext, seq, T, seeds, {}, config=big)
    check_call(x, cand, ridx, rnext, seq, T, seeds, ctl(device, B, min_ps=[0.05]), config=big)
    if ON_GPU:
        check_call(x, cand, ridx, rnext, seq, T, seeds,
                   ctl(device, B, top_ks=[20], top_ps=[0.95]))


# --- launches, out=, empty ------------------------------------------------------------------
def test_launches_as_chain_verify(device, monkeypatch):
    """One launch, with or without controls, as chain_verify's own call."""
    kernels = [(CV, "_verify_kernel"), (CV, "_controls_verify_kernel")]
    counters = []
    for mod, name in kernels:
        k = CountingKernel(getattr(mod, name))
        monkeypatch.setattr(mod, name, k)
        counters.append(k)

    def take():
        n = sum(k.launches for k in counters)
        for k in counters:
            k.launches = 0
        return n

    B, N, V = 3, 3, 200
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=3)
    FN(x, cand, ridx, rnext, seq, T, seeds=seeds, config=SMALL)
    assert take() == 1
    c = ctl(device, B, top_ks=[5, 0, 9], min_ps=[0.1, 0.0, 0.0])
    FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds, config=SMALL)
    ours = take()
    recipes.chain_verify(x, cand[:, 1:], temperature=T.view(B), seeds=seeds, positions=seq,
                         top_k=c["top_ks"], min_p=c["min_ps"], config=SMALL)
    assert ours == take() == 1
    e = FN(x[:0], cand[:0], ridx[:0], rnext[:0], seq[:0], T[:0], seeds=seeds[:0])
    assert take() == 0 and e.predict.shape == (0,) and e.accept_index.shape == (0, N)


def test_out_buffers_and_batch_sizes(device):
    """out= fields are written in place (poisoned first) and returned; B = 1 and odd B."""
    for B in (1, 3):
        N, V = 4, 257
        x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=B)
        c = ctl(device, B, top_ps=[0.9, 0.5, 1.0])
        want = FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds, config=SMALL)
        out = S.TargetVerifyTopk1Output(*[torch.full_like(t, 99) for t in want])
        got = FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds, out=out, config=SMALL)
        for a, b, w, f in zip(got, out, want, got._fields, strict=True):
            assert a is b, f
            assert_equal(a, w, f)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and allocation counts need a GPU")
def test_graph_capture_allocates_nothing_with_out(device):
    from tests.helpers import capture

    B, N, V = 4, 4, 151936
    x, cand, ridx, rnext, seq, T, seeds = batch(B, N, V, device, seed=8)
    for c in ({}, ctl(device, B, top_ks=[20], top_ps=[0.95])):
        out = FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds)

        def call(c=c, out=out):
            return FN(x, cand, ridx, rnext, seq, T, **c, seeds=seeds, out=out)
        want = [t.clone() for t in call()]
        graph, allocated = capture(call)
        for t in out:
            t.fill_(-7)
        graph.replay()
        assert allocated <= 0
        for a, b in zip(out, want, strict=True):
            assert_equal(a, b)


def test_signature():
    """The greedy verifier's five positional parameters, then SGLang's sampling tensors;
    ours keyword-only."""
    ps = inspect.signature(FN).parameters.values()
    pos = [p.name for p in ps if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    kw = [p.name for p in ps if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert pos == ["next_token_logits", "candidates", "retrieve_index", "retrieve_next_token",
                   "seq_lens", "temperatures", "top_ks", "top_ps", "min_ps"]
    assert kw == ["seeds", "positions", "out", "config"]
    assert "sample_postprocess" in S.__all__[3]


# --- statistics -------------------------------------------------------------------------------
CHI2_P001 = {4: 18.47, 5: 20.52}      # chi-square critical values, p = 0.001


def test_distribution(device):
    """R requests with their own seeds, one draft each over V = 8 logits, T = 0.8 with
    top_k 6 and top_p 0.9: the first emitted token follows the filtered renormalised
    softmax of row 0 (the unfiltered softmax fails by far), the draft is accepted exactly
    when it is drawn, and after an accepted draft the bonus token follows row 1's. Counted on
    the reference's fields for 6000 requests, which the kernel must equal (all of them
    on the GPU; on the CPU the interpreter runs the first 24)."""
    R, V, d0, T = 6000, 8, 1, 0.8
    z0 = torch.tensor([1.2, 0.9, 0.5, 0.3, 0.0, -0.4, -1.0, -3.0])
    z1 = torch.tensor([-0.2, 0.9, 0.1, 0.4, -1.1, 0.6, 0.0, -2.0])
    x = torch.stack([z0, z1]).repeat(R, 1)
    cand = torch.tensor([[0, d0]]).repeat(R, 1)
    ridx, rnext = chain(R, 2, "cpu")
    seq = torch.arange(R) * 5
    seeds = torch.randint(-2**62, 2**62, (R,), generator=torch.Generator().manual_seed(3))
    temps = torch.full((R, 1), T)
    c = {"top_ks": torch.full((R,), 6, dtype=torch.int32), "top_ps": torch.full((R,), 0.9)}
    want = S.target_verify_sample_reference(x, cand, ridx, rnext, seq, temps, **c,
                                            seeds=seeds)
    n = R if ON_GPU else 24
    got = FN(*(t[:n].to(device) for t in (x.view(R, 2, V), cand, ridx, rnext, seq, temps)),
             **{k: v[:n].to(device) for k, v in c.items()}, seeds=seeds[:n].to(device))
    assert_equal(got.predict, want.predict[:2 * n].to(device), "predict")
    assert_equal(got.num_correct_drafts, want.num_correct_drafts[:n].to(device), "accepted")
    kept = [CC.kept((z / T)[None], torch.tensor([6]), torch.tensor([0.9]), None)[0]
            for z in (z0, z1)]
    p = [torch.where(k, torch.softmax(z.double() / T, 0), 0.0)
         for k, z in zip(kept, (z0, z1), strict=True)]
    p = [q / q.sum() for q in p]
    pred = want.predict.view(R, 2).long()
    first = torch.bincount(pred[:, 0], minlength=V).double()
    dof = int((p[0] > 0).sum()) - 1
    assert 0 < dof < V - 1                                   # the controls cut some ids
    assert chi2(first, p[0]) < CHI2_P001[dof], first.tolist()
    assert chi2(first, torch.softmax(z0.double() / T, 0)) > 200     # the unfiltered fails
    acc = want.num_correct_drafts == 1
    assert torch.equal(acc, pred[:, 0] == d0)
    bonus = torch.bincount(pred[acc, 1], minlength=V).double()
    dof1 = int((p[1] > 0).sum()) - 1
    assert chi2(bonus, p[1]) < CHI2_P001[dof1], bonus.tolist()


# --- errors -----------------------------------------------------------------------------------
def _call(dev, **over):
    x, cand, ridx, rnext, seq, T, seeds = batch(2, 3, 50, dev, seed=0, dtype=torch.float32)
    a = dict(next_token_logits=x, candidates=cand, retrieve_index=ridx,
             retrieve_next_token=rnext, seq_lens=seq, temperatures=T, seeds=seeds)
    a.update({k: (v(a, dev) if callable(v) else v) for k, v in over.items()})
    return FN(**a)


BAD = [
    bad("temperatures-shape", lambda d: _call(d, temperatures=torch.ones(2, 2, device=d)),
        ValueError, "temperatures"),
    bad("temperatures-dtype", lambda d: _call(d, temperatures=torch.ones(2, 1, dtype=torch.int64,
                                                                        device=d)),
        TypeError, "temperatures"),
    bad("seeds-missing", lambda d: _call(d, seeds=None), ValueError, "seeds"),
    bad("positions-shape", lambda d: _call(d, positions=torch.zeros(3, dtype=torch.int64,
                                                                    device=d)),
        ValueError, "positions"),
    bad("top_ks-dtype", lambda d: _call(d, top_ks=torch.ones(2, device=d)), TypeError, "top_ks"),
    bad("top_ps-shape", lambda d: _call(d, top_ps=torch.ones(3, device=d)), ValueError,
        "top_ps"),
    bad("min_ps-dtype", lambda d: _call(d, min_ps=torch.ones(2, dtype=torch.float64, device=d)),
        TypeError, "min_ps"),
    bad("candidates-shape", lambda d: _call(d, candidates=lambda a, d: a["candidates"][:, :2]),
        ValueError, "next_token_logits"),
    bad("out-overlaps-temperatures", lambda d: _call(d, out=lambda a, d: (
        None, a["temperatures"].view(torch.int32).view(-1)[:2], *[None] * 6)), ValueError,
        "out.num_correct_drafts"),
    bad("out-dtype", lambda d: _call(d, out=(torch.zeros(6, dtype=torch.int64, device=d),
                                             *[None] * 7)), TypeError, "out.predict"),
]
test_bad_inputs = bad_inputs_test(BAD)
