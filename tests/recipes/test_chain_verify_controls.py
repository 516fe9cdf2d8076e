"""chain_verify with the sampling controls (top_k, top_p, min_p): parity with the
reference (the spec's near-tie and 1e-5 threshold tolerances), off values, the hard
rows (ties at the cut, NaN, flat and peaked), batch invariance, configs, statistics."""
import importlib
import math

import pytest
import torch

import recipes
from tests.helpers import ON_GPU, assert_equal

CV = importlib.import_module("recipes.chain_verify")
CC = importlib.import_module("recipes._controls_core")
SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
         "EXACT": 0}
CFGS = (None, SMALL, {**SMALL, "SPLIT": 1, "UNROLL": 2})


def order_key(x):
    return CC._order_key(x.to(torch.float32))


def check(x, d, kw, got):
    """Every emitted token is the reference's, or within the spec's tolerance: a near-tie
    (8 ulps), or the argmax of a kept set between the sets with the min_p/top_p
    thresholds moved by -1e-5 and +1e-5."""
    x, d = x.cpu(), d.cpu()
    kw = {k: v.cpu() for k, v in kw.items()}
    B, K = d.shape
    V = x.shape[-1]
    want = CV.reference(x, d, **kw)
    if all(torch.equal(a.cpu(), b) for a, b in zip(got, want, strict=True)):
        return 0
    t_ref = CV.target_tokens(x, B, K, **kw)
    tok = got.tokens.cpu().long()
    m = got.accept_len.cpu().long()
    j = torch.arange(K + 1)
    emitted = j[None, :] <= m[:, None]
    tok = torch.where(emitted, tok, t_ref)
    s = CV.row_scores(x, B, K, kw["temperature"], kw["seeds"], kw["positions"])
    rep = lambda c: None if c is None else c.repeat_interleave(K + 1)  # noqa: E731
    ctl = {n: rep(kw.get(n)) for n in ("top_k", "top_p", "min_p")}
    z = x.reshape(-1, V).float() / kw["temperature"].float().repeat_interleave(K + 1)[:, None]
    lo = CC.kept(z, ctl["top_k"], ctl["top_p"], ctl["min_p"], slack=-1e-5)
    hi = CC.kept(z, ctl["top_k"], ctl["top_p"], ctl["min_p"], slack=1e-5)
    order = torch.sort(-order_key(z), dim=1, stable=True).indices
    pos = torch.empty_like(order).scatter_(1, order, torch.arange(V).expand_as(order))
    bad = 0
    for r in (tok.reshape(-1) != t_ref.reshape(-1)).nonzero().flatten().tolist():
        t = int(tok.reshape(-1)[r])
        S = lo[r] | (pos[r] <= pos[r, t])
        best = int(CC.masked_argmax(s[r:r + 1], S[None])[0])
        dist = abs(int(order_key(s[r, t:t + 1])) - int(order_key(s[r, best:best + 1])))
        assert hi[r, t] and (t == best or dist <= 8), (
            f"row {r}: token {t} vs reference {int(t_ref.reshape(-1)[r])}")
        bad += 1
    if K:
        acc = j[None, :K] < m[:, None]
        assert (d.long() == tok[:, :K])[acc].all()
    return bad


def run(x, d, kw, cfgs=CFGS):
    first = None
    for cfg in cfgs:
        got = recipes.chain_verify(x, d, config=cfg, **kw)
        check(x, d, kw, got)
        if first is None:
            first = got
        else:
            for a, b in zip(got, first, strict=True):
                assert_equal(a, b, f"cfg={cfg}")
    return first


def case(B, K, V, device, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    R = B * (K + 1)
    scale = torch.tensor([0.3, 1.0, 4.0, 12.0])[torch.arange(R) % 4][:, None]
    x = torch.randn(R, V, generator=g) * scale
    x[1::5, : V // 3] = float("-inf")
    x[2::5, torch.randint(0, V, (V // 8,), generator=g)] = 3.0    # planted ties
    kw = {"temperature": torch.rand(B, generator=g) + 0.4,
          "seeds": torch.randint(-2**62, 2**62, (B,), generator=g),
          "positions": torch.randint(0, 2**30, (B,), generator=g)}
    d = torch.randint(0, V, (B, K), generator=g)
    return x.to(dtype).to(device), d.to(device), {k: v.to(device) for k, v in kw.items()}


def ctl(device, **c):
    out = {}
    for name, vals in c.items():
        dt = torch.int64 if name == "top_k" else torch.float32
        out[name] = torch.tensor(vals, dtype=dt, device=device)
    return out


COMBOS = {
    "top_k": {"top_k": [20, 1, 3, 150, 7]},
    "top_p": {"top_p": [0.9, 0.5, 1e-6, 1 - 1e-7, 0.99]},
    "min_p": {"min_p": [0.05, 0.5, 1.0, 2.0, 1e-3]},
    "top_k+top_p": {"top_k": [20, 5, 2, 100, 40], "top_p": [0.95, 0.8, 0.5, 0.3, 1e-3]},
    "all": {"top_k": [20, 5, 0, 100, 40], "top_p": [0.95, 0.8, 0.5, 1.0, 0.6],
            "min_p": [0.05, 0.0, 0.2, 0.01, 0.9]},
}


@pytest.mark.parametrize("combo", list(COMBOS))
def test_controls_parity(device, combo):
    B, K, V = 5, 1, 300
    x, d, kw = case(B, K, V, device, seed=len(combo))
    run(x, d, {**kw, **ctl(device, **COMBOS[combo])})


def test_off_values_are_temperature_only(device):
    """Every off value (top_k 0, negative, >= V; top_p >= 1, NaN; min_p 0, negative,
    NaN) gives bit for bit the outputs without controls."""
    B, K, V = 6, 2, 257
    x, d, kw = case(B, K, V, device, seed=3, dtype=torch.float32)
    want = recipes.chain_verify(x, d, **kw)
    c = ctl(device, top_k=[0, -3, V, V + 5, 0, -1],
            top_p=[1.0, float("nan"), 2.0, 1.0, float("inf"), float("nan")],
            min_p=[0.0, -1.0, float("nan"), 0.0, -0.0, float("nan")])
    for cfg in CFGS:
        got = recipes.chain_verify(x, d, config=cfg, **kw, **c)
        for a, b in zip(got, want, strict=True):
            assert_equal(a, b)
    check(x, d, {**kw, **c}, got)


def test_top_k_1_is_greedy_argmax_of_z(device):
    B, K, V = 4, 2, 400
    x, d, kw = case(B, K, V, device, seed=4, dtype=torch.float32)
    got = recipes.chain_verify(x, d, **kw, **ctl(device, top_k=[1] * B))
    z = x.cpu() / kw["temperature"].cpu().repeat_interleave(K + 1)[:, None]
    t = torch.argmax(z, dim=1).view(B, K + 1)
    m = got.accept_len.cpu().long()
    assert_equal(got.bonus.cpu().long(), t.gather(1, m[:, None]).squeeze(1))
    assert torch.equal(got.tokens.cpu().long()[:, 0], t[:, 0])


def test_ties_at_the_cut_flat_and_peaked(device):
    """Flat rows (every logit equal: top_k and top_p cut inside one tie group, by id),
    a row of two tie groups, a peaked row, min_p >= 1 keeping the ids tied with z_max."""
    V = 200
    rows = [torch.zeros(V), torch.zeros(V), torch.where(torch.arange(V) % 3 == 0, 1.0, 0.0),
            torch.full((V,), -5.0).index_fill_(0, torch.tensor([17]), 30.0),
            torch.where(torch.arange(V) % 7 == 0, 2.0, 0.0), torch.zeros(V)]
    x = torch.stack(rows).to(device)
    B = x.shape[0]
    d = torch.empty(B, 0, dtype=torch.int64, device=device)
    kw = {"temperature": torch.full((B,), 0.8, device=device),
          "seeds": torch.arange(B, device=device) * 977 + 5,
          "positions": torch.arange(B, device=device) + 100}
    for c in ({"top_k": [37, 1, 40, 2, 29, 199]}, {"top_p": [0.3, 0.5001, 0.5, 0.2, 0.9, 0.0]},
              {"min_p": [1.0, 1.5, 1.0, 1.0, 0.999, 1.0]},
              {"top_k": [50, 10, 67, 3, 20, 150], "top_p": [0.5, 0.25, 0.8, 0.999, 0.4, 0.33]}):
        run(x, d, {**kw, **ctl(device, **c)})
    # flat row, top_k = 37: the token is one of the first 37 ids
    for seed in range(6):
        kw2 = {**kw, "seeds": kw["seeds"] + seed}
        r = recipes.chain_verify(x[:1], d[:1], **{k: v[:1] for k, v in kw2.items()},
                                 top_k=torch.tensor([37], device=device))
        assert int(r.tokens[0, 0]) < 37


def test_nan_and_inf_rows(device):
    V = 300
    x = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    x[0, 77] = float("nan")
    x[0, 200] = float("nan")
    x[1] = float("-inf")
    x[2, 5] = float("inf")
    x[2, 9] = float("inf")
    x[3, :100] = float("-inf")
    x = x.to(device)
    d = torch.empty(4, 0, dtype=torch.int64, device=device)
    kw = {"temperature": torch.tensor([0.7, 1.0, 0.5, float("inf")], device=device),
          "seeds": torch.tensor([1, 2, 3, 4], device=device),
          "positions": torch.tensor([0, 0, 0, 0], device=device)}
    r = run(x, d, {**kw, **ctl(device, top_k=[5, 3, 4, 2], top_p=[0.5, 0.9, 0.9, 0.5],
                                min_p=[0.1, 0.1, 0.5, 0.0])})
    assert int(r.tokens[0, 0]) == 77


def test_mixed_batch_one_call_and_batch_invariance(device):
    """Greedy, temperature-only and controlled requests in one call; each request's
    tokens are those it gets alone."""
    B, K, V = 6, 2, 300
    x, d, kw = case(B, K, V, device, seed=9)
    kw["temperature"][1] = 0.0
    kw["temperature"][4] = float("nan")
    c = ctl(device, top_k=[20, 5, 0, 3, 100, 0], top_p=[0.9, 0.5, 1.0, 0.8, 0.7, 1.0],
            min_p=[0.0, 0.1, 0.0, 0.0, 0.05, 0.0])
    got = run(x, d, {**kw, **c}, cfgs=(None,))
    x3 = x.view(B, K + 1, V)
    for b in range(B):
        one = recipes.chain_verify(x3[b:b + 1], d[b:b + 1],
                                   **{k: v[b:b + 1] for k, v in {**kw, **c}.items()},
                                   config=SMALL)
        assert_equal(one.tokens[0], got.tokens[b], f"request {b}")


def test_real_vocab_151936(device):
    B, K, V = 1, 1, 151936
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(B * (K + 1), V, generator=g) * 3).to(torch.bfloat16).to(device)
    kw = {"temperature": torch.tensor([0.7], device=device),
          "seeds": torch.tensor([99], device=device),
          "positions": torch.tensor([4096], device=device)}
    d = torch.zeros(B, K, dtype=torch.int64, device=device)
    big = None if ON_GPU else {"BLOCK_V": 8192, "SPLIT": 1, "num_warps": 8}
    run(x, d, {**kw, **ctl(device, min_p=[0.05])}, cfgs=(big,))
    if ON_GPU:
        run(x, d, {**kw, **ctl(device, top_k=[20], top_p=[0.95])}, cfgs=(None,))
        run(x, d, {**kw, **ctl(device, top_p=[0.9])}, cfgs=(None,))


def test_controls_errors(device):
    x = torch.randn(8, 50, device=device)
    d = torch.zeros(2, 3, dtype=torch.int64, device=device)
    T = torch.ones(2, device=device)
    s = torch.zeros(2, dtype=torch.int64, device=device)
    for name, t in (("top_k", s), ("top_p", T), ("min_p", T)):
        with pytest.raises(ValueError, match=f"{name}: expected None without temperature"):
            recipes.chain_verify(x, d, **{name: t})
    kw = {"temperature": T, "seeds": s, "positions": s}
    with pytest.raises(TypeError, match="top_k: expected dtype int32/int64, got float32"):
        recipes.chain_verify(x, d, top_k=T, **kw)
    with pytest.raises(TypeError, match="top_p: expected dtype float32, got int64"):
        recipes.chain_verify(x, d, top_p=s, **kw)
    with pytest.raises(ValueError, match=r"min_p: expected shape \(2,\)"):
        recipes.chain_verify(x, d, min_p=torch.ones(3, device=device), **kw)


def test_tp_refuses_controls(device):
    x = torch.randn(4, 50, device=device)
    d = torch.zeros(1, 3, dtype=torch.int64, device=device)
    with pytest.raises(NotImplementedError, match="top_k, top_p"):
        recipes.tp.chain_verify(x, d, vocab_start=0, vocab_size=50,
                                temperature=torch.ones(1, device=device),
                                seeds=d[:, 0], positions=d[:, 0],
                                top_k=torch.ones(1, dtype=torch.int64, device=device),
                                top_p=torch.ones(1, device=device))


# --- statistics ---------------------------------------------------------------------
LOGITS10 = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0, float("-inf")]


def chi2(counts, probs):
    live = probs > 0
    if (counts[~live] > 0).any():
        return float("inf")
    e = probs[live] * counts.sum()
    return float(((counts[live] - e) ** 2 / e).sum())


def filtered_softmax(T, top_k=None, top_p=None, min_p=None):
    z = torch.tensor(LOGITS10, dtype=torch.float32) / T
    S = CC.kept(z[None], *(None if c is None else torch.tensor([c]) for c in
                           (top_k, top_p, min_p)))[0]
    p = torch.where(S, torch.softmax(z.double(), 0), torch.zeros(10, dtype=torch.float64))
    return p / p.sum()


STATS = [dict(top_k=4), dict(top_p=0.7), dict(min_p=0.2), dict(top_k=6, top_p=0.8)]


@pytest.mark.parametrize("c", STATS, ids=[str(c) for c in STATS])
def test_samples_follow_the_filtered_softmax(device, c):
    """Emitted tokens follow softmax(z) restricted to S and renormalised: the reference
    with 100k seeds (and the kernel with 40k on the GPU; on the CPU a small batch must
    equal the reference); the plain softmax fails the same test by far."""
    T = 0.8
    N = 40_000 if ON_GPU else 16
    g = torch.Generator().manual_seed(7)
    seeds = torch.randint(-2**62, 2**62, (100_000,), generator=g)
    pos = torch.randint(0, 2**30, (100_000,), generator=g)
    x = torch.tensor(LOGITS10).repeat(100_000, 1)
    full = {n: torch.full((100_000,), v, dtype=torch.int64 if n == "top_k" else torch.float32)
            for n, v in c.items()}
    p = filtered_softmax(T, **c)
    d = torch.empty(100_000, 0, dtype=torch.int64)
    kw = {"temperature": torch.full((100_000,), T), "seeds": seeds, "positions": pos, **full}
    t = CV.target_tokens(x, 100_000, 0, **kw)[:, 0]
    counts = torch.bincount(t, minlength=10).double()
    dof = int((p > 0).sum()) - 1
    assert chi2(counts, p) < dof + 8 * math.sqrt(2 * dof) + 10
    plain = torch.softmax(torch.tensor(LOGITS10, dtype=torch.float64) / T, 0)
    assert chi2(counts, plain) > 500
    sub = {k: v[:N].to(device) for k, v in kw.items()}
    r = recipes.chain_verify(x[:N].to(device), d[:N].to(device), **sub)
    got = r.tokens[:, 0].cpu().long()
    if ON_GPU:
        bound = dof + 8 * math.sqrt(2 * dof) + 10
        assert chi2(torch.bincount(got, minlength=10).double(), p) < bound
    else:
        assert torch.equal(got, t[:N])
