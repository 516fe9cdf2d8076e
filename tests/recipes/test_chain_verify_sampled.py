"""chain_verify, sampled rows: parity with the reference under the spec's near-tie rule,
batch invariance, every config, and the sampling statistics (emitted tokens ~
softmax(logits / T), a draft accepted with its target probability). The Philox stream and
the filtered scan's bound: test_chain_verify_sampled_scan.py."""
import importlib
import math

import pytest
import torch

import recipes
from tests.helpers import ON_GPU, assert_equal, drafts_around, sample_configs

CV = importlib.import_module("recipes.chain_verify")
GC = importlib.import_module("recipes._gumbel_core")
SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
         "EXACT": 0}
EXACT = {**SMALL, "EXACT": 1}
NEAR_TIE_ULPS = 8


# --- helpers ---------------------------------------------------------------------------
def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 whose order is float32 order (-0.0 == +0.0): ulp distance = key difference."""
    b = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return torch.where(b >= 0, b, -(b & 0x7FFFFFFF))


def check_sampled(logits, draft, temperature, seeds, positions, got):
    """`got` is a valid answer: every emitted target token is the reference's, or (sampled
    rows only) a near-tie with it (reference scores within 8 float32 ulps); the accept
    logic holds on the emitted tokens. Returns the number of near-ties accepted."""
    B, K = draft.shape
    V = logits.shape[-1]
    t_ref = CV.target_tokens(logits.cpu(), B, K, temperature.cpu(), seeds.cpu(),
                             positions.cpu())
    s = CV.row_scores(logits.cpu(), B, K, temperature.cpu(), seeds.cpu(),
                      positions.cpu()).view(B, K + 1, V)
    sampled = temperature.cpu().float() > 0
    tokens = got.tokens.cpu().long()
    m = got.accept_len.cpu().long()
    d = draft.cpu().long()
    assert ((m >= 0) & (m <= K)).all(), f"accept_len {m.tolist()}"
    j = torch.arange(K + 1)
    emitted = j[None, :] <= m[:, None]
    assert ((tokens >= 0) & (tokens < V))[emitted].all(), "an emitted token out of range"
    assert (tokens[~emitted] == -1).all(), "tokens after the bonus must be -1"
    tok = torch.where(emitted, tokens, t_ref)
    diff = tok != t_ref
    if diff.any():
        sv = s.gather(2, tok[..., None]).squeeze(-1)
        sr = s.gather(2, t_ref[..., None]).squeeze(-1)
        dist = (order_key(sv) - order_key(sr)).abs()
        near = sampled[:, None] & ~torch.isnan(sr) & (dist <= NEAR_TIE_ULPS)
        bad = diff & ~near
        if bad.any():
            b, jj = [int(v) for v in bad.nonzero()[0]]
            raise AssertionError(
                f"row ({b}, {jj}): token {int(tok[b, jj])} (score {float(sv[b, jj])!r}) vs "
                f"the reference's {int(t_ref[b, jj])} (score {float(sr[b, jj])!r}), "
                f"{int(dist[b, jj])} ulps apart, sampled={bool(sampled[b])}")
    if K:
        acc = j[None, :K] < m[:, None]
        assert (d == tok[:, :K])[acc].all(), "an accepted draft does not match its target"
        rej = m < K
        at = m.clamp(max=K - 1)[:, None]
        assert (d.gather(1, at) != tok.gather(1, at))[rej].all(), "a matching draft rejected"
    assert torch.equal(got.bonus.cpu().long(), tok.gather(1, m[:, None]).squeeze(1))
    assert torch.equal(got.select_index.cpu(), torch.arange(B) * (K + 1) + m)
    return int(diff.sum())


def run_checked(logits, draft, temperature, seeds, positions, cfgs=(None,)):
    """Every config: poisoned out= buffers, a valid answer, and one answer for all."""
    first = None
    for cfg in cfgs:
        poison = recipes.VerifyResult(*(torch.full_like(t, -77) for t in (
            torch.empty(draft.shape[0], draft.shape[1] + 1, dtype=torch.int32,
                        device=draft.device),
            torch.empty(draft.shape[0], dtype=torch.int32, device=draft.device),
            torch.empty(draft.shape[0], dtype=torch.int32, device=draft.device),
            torch.empty(draft.shape[0], dtype=torch.int64, device=draft.device))))
        got = recipes.chain_verify(logits, draft, temperature=temperature, seeds=seeds,
                                   positions=positions, out=poison, config=cfg)
        check_sampled(logits, draft, temperature, seeds, positions, got)
        if first is None:
            first = got
        else:
            for name in recipes.VerifyResult._fields:
                assert_equal(getattr(got, name), getattr(first, name), f"{name} cfg={cfg}")
    return first


def drafts_from(logits, B, K, temperature, seeds, positions, seed, dtype=torch.int64):
    """Drafts around the reference's (sampled) targets (`helpers.drafts_around`)."""
    t = CV.target_tokens(logits.cpu(), B, K, temperature.cpu(), seeds.cpu(), positions.cpu())
    return drafts_around(t, logits.shape[-1], seed, dtype, logits.device)


TEMPS = [0.7, 0.0, 1.0, float("nan"), 2.5, -1.0, 1e-3, 50.0, float("inf"), 1e-32, 0.31, 1.0]


def sampled_case(B, K, V, dtype, device, seed, temps=TEMPS):
    """Hard inputs: per-row scales (peaked and flat rows), -inf masks (whole rows and
    parts), planted equal logits; temperatures mixing greedy (0, NaN, < 0) and sampled
    rows (tiny, huge, +inf and out of the filtered scan's range); seeds over the whole
    int64 range; positions up to 2^31 - K - 1."""
    g = torch.Generator().manual_seed(seed)
    R = B * (K + 1)
    x = torch.randn(R, V, generator=g) * torch.tensor([0.3, 1.0, 4.0, 30.0])[
        torch.arange(R) % 4][:, None]
    for r in range(R):
        kind = (r + seed) % 6
        if kind == 1:
            x[r, torch.rand(V, generator=g) < 0.7] = float("-inf")
        elif kind == 2:
            x[r, : max(1, V // 2)] = float("-inf")
        elif kind == 3:
            x[r, torch.randint(0, V, (max(1, V // 10),), generator=g)] = x[r].max()
        elif kind == 4 and V > 1:
            x[r] = float("-inf")
            x[r, V - 1] = 0.5
    T = torch.tensor([temps[(b + seed) % len(temps)] for b in range(B)], dtype=torch.float32)
    seeds = torch.randint(-2**63, 2**63 - 1, (B,), generator=g, dtype=torch.int64)
    pos = torch.randint(0, 2**31 - K - 1, (B,), generator=g, dtype=torch.int64)
    pos[0] = 2**31 - K - 1
    return x.to(dtype).to(device), T.to(device), seeds.to(device), pos.to(device)


# --- parity with the reference ---------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy on inf/0 edge inputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,V", [(6, 1, 2100), (3, 3, 700), (2, 0, 3000), (4, 2, 5)])
def test_sampled_hard_inputs(device, dtype, B, K, V):
    x, T, seeds, pos = sampled_case(B, K, V, dtype, device, seed=B * 7 + K * 3 + V)
    d = drafts_from(x, B, K, T, seeds, pos, seed=V)
    run_checked(x, d, T, seeds, pos,
                cfgs=(None, SMALL, EXACT, {**SMALL, "SPLIT": 1, "UNROLL": 2}))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy on inf/0 edge inputs
def test_sampled_every_row_kind_in_one_launch(device):
    """All temperatures of TEMPS in one batch (greedy and sampled rows mixed), 3-D
    strided logits, int32 drafts, int32 seeds/positions and strided sampling inputs."""
    B, K, V = len(TEMPS), 2, 700
    base, T, seeds, pos = sampled_case(B, K, V + 64, torch.bfloat16, device, seed=5)
    x3 = base.view(B, K + 1, V + 64)[:, :, 32:32 + V]
    d = drafts_from(x3.reshape(B * (K + 1), V), B, K, T, seeds, pos, seed=2,
                    dtype=torch.int32)
    run_checked(x3, d, T, seeds, pos, cfgs=(None, SMALL))
    Ts = torch.stack([T, T], 1)[:, 0]                      # stride 2
    s32 = (seeds & 0x7FFFFFFF).to(torch.int32)
    p32 = pos.to(torch.int32)
    d2 = drafts_from(x3.reshape(B * (K + 1), V), B, K, Ts, s32, p32, seed=3)
    run_checked(x3, d2, Ts, s32, p32, cfgs=(SMALL,))


def test_sampled_real_vocab_151936(device):
    B, K, V = 1, 3, 151936
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(B * (K + 1), V, generator=g) * 3).to(torch.bfloat16).to(device)
    T = torch.tensor([0.8], device=device)
    seeds = torch.tensor([1234567], dtype=torch.int64, device=device)
    pos = torch.tensor([4096], dtype=torch.int64, device=device)
    d = drafts_from(x, B, K, T, seeds, pos, seed=4)
    # (on the CPU one program per row keeps the interpreter's per-op overhead down)
    big = None if ON_GPU else {"BLOCK_V": 8192, "SPLIT": 1, "num_warps": 8}
    run_checked(x, d, T, seeds, pos, cfgs=(big,))


def test_sampled_every_config(device):
    B, K, V = 2, 1, 2100
    x, T, seeds, pos = sampled_case(B, K, V, torch.bfloat16, device, seed=8,
                                    temps=[0.9, 1.7])
    d = drafts_from(x, B, K, T, seeds, pos, seed=8)
    configs = CV.TUNING.configs(CV.tune_key(torch.bfloat16, V, B, K, True))
    assert configs and all(c["EXACT"] == 0 for c in configs)
    # EXACT=1 (the exact scan only) is outside the tuned space but must agree too
    run_checked(x, d, T, seeds, pos,
                cfgs=sample_configs(configs, 6) + [{**configs[0], "EXACT": 1}])


def test_batch_invariance(device):
    """A request gets the same tokens at any batch position, batch size and draft length:
    the stream depends on (seed, position + j, id) only."""
    V = 1100
    g = torch.Generator().manual_seed(21)
    rows = torch.randn(6, V, generator=g).to(torch.bfloat16).to(device)   # the request's rows
    T = torch.tensor([0.8], device=device)
    seed = torch.tensor([-77], dtype=torch.int64, device=device)
    p0 = torch.tensor([1000], dtype=torch.int64, device=device)
    t_full = CV.target_tokens(rows[:4].cpu(), 1, 3, T.cpu(), seed.cpu(), p0.cpu())[0]

    def emitted(B, K, at):
        other = torch.randn(B * (K + 1), V, generator=g).to(torch.bfloat16).to(device)
        x = other.view(B, K + 1, V).clone()
        x[at] = rows[:K + 1]
        Ts = torch.rand(B, generator=g).to(device) + 0.3
        Ts[at] = T
        sd = torch.randint(-2**40, 2**40, (B,), generator=g).to(device)
        sd[at] = seed
        ps = torch.randint(0, 2**20, (B,), generator=g).to(device)
        ps[at] = p0
        d = torch.zeros(B, K, dtype=torch.int64, device=device)
        d[at] = t_full[:K].to(device)                            # accepted in full
        r = recipes.chain_verify(x, d, temperature=Ts, seeds=sd, positions=ps,
                                 config=SMALL if B % 2 else None)
        assert int(r.accept_len[at]) == K
        return r.tokens[at].cpu()

    ref = t_full.to(torch.int32)
    assert torch.equal(emitted(1, 3, 0), ref)
    assert torch.equal(emitted(3, 3, 1), ref)
    assert torch.equal(emitted(5, 3, 4), ref)
    assert torch.equal(emitted(2, 1, 1), ref[:2])
    # a longer draft: the first 4 targets are the same
    t5 = CV.target_tokens(rows.cpu(), 1, 5, T.cpu(), seed.cpu(), p0.cpu())[0]
    assert torch.equal(t5[:4], t_full)


def test_greedy_rows_ignore_the_stream(device):
    """temperature 0 / NaN / negative rows are the plain argmax, whatever the seed."""
    B, K, V = 3, 2, 1000
    x = torch.randn(B * (K + 1), V, generator=torch.Generator().manual_seed(2)).to(device)
    t = torch.argmax(x.view(B, K + 1, V), -1)
    T = torch.tensor([0.0, float("nan"), -2.0], device=device)
    seeds = torch.tensor([1, 2, 3], device=device)
    pos = torch.tensor([0, 0, 0], device=device)
    r = recipes.chain_verify(x, t[:, :K].clone(), temperature=T, seeds=seeds, positions=pos)
    assert_equal(r.tokens, t.to(torch.int32), "greedy rows in a sampled launch")


def test_empty_batch_sampled(device):
    x = torch.empty(0, 100, device=device)
    d = torch.empty(0, 3, dtype=torch.int64, device=device)
    e = torch.empty(0, device=device)
    r = recipes.chain_verify(x, d, temperature=e, seeds=e.long(), positions=e.long())
    assert r.tokens.shape == (0, 4)


def test_sampled_errors(device):
    x = torch.randn(8, 50, device=device)
    d = torch.zeros(2, 3, dtype=torch.int64, device=device)
    T = torch.ones(2, device=device)
    s = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="seeds: required when temperature is given"):
        recipes.chain_verify(x, d, temperature=T, positions=s)
    with pytest.raises(ValueError, match="positions: required when temperature is given"):
        recipes.chain_verify(x, d, temperature=T, seeds=s)
    with pytest.raises(TypeError, match="temperature: expected dtype .*float32, got int64"):
        recipes.chain_verify(x, d, temperature=s, seeds=s, positions=s)
    with pytest.raises(ValueError, match="temperature: expected shape \\(2,\\).*got \\(3,\\)"):
        recipes.chain_verify(x, d, temperature=torch.ones(3, device=device), seeds=s,
                             positions=s)
    with pytest.raises(TypeError, match="seeds: expected dtype int32/int64, got float32"):
        recipes.chain_verify(x, d, temperature=T, seeds=T, positions=s)
    with pytest.raises(ValueError, match="positions: expected a 1-D tensor"):
        recipes.chain_verify(x, d, temperature=T, seeds=s, positions=s[None])
    with pytest.raises(ValueError, match="seeds: expected a tensor on .*meta"):
        recipes.chain_verify(x, d, temperature=T, seeds=s.to("meta"), positions=s)
    if ON_GPU:
        with pytest.raises(ValueError, match="seeds: expected a tensor on cuda"):
            recipes.chain_verify(x, d, temperature=T, seeds=s.cpu(), positions=s)


# --- statistics --------------------------------------------------------------------------
LOGITS10 = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0, float("-inf")]


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the ids with positive probability; an id of probability
    0 that shows up makes it infinite."""
    n = counts.sum()
    live = probs > 0
    if (counts[~live] > 0).any():
        return float("inf")
    e = probs[live] * n
    return float(((counts[live] - e) ** 2 / e).sum())


def request_batch(N, K, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor(LOGITS10).repeat(N * (K + 1), 1)
    seeds = torch.randint(-2**62, 2**62, (N,), generator=g)
    pos = torch.randint(0, 2**30, (N,), generator=g)
    return x, torch.full((N,), T), seeds, pos


@pytest.mark.parametrize("T", [0.3, 1.0, 3.0])
def test_reference_samples_follow_softmax(T):
    """The semantics: 200k sampled targets per temperature follow softmax(logits / T)
    (chi-square over 8 degrees of freedom, well below the 40 that a p of ~1e-5 would
    need; greedy or uniform draws score in the thousands), the -inf id never shows, and
    targets of consecutive rows of a request are independent."""
    N, K = 200_000, 1
    x, Ts, seeds, pos = request_batch(N, K, T)
    t = CV.target_tokens(x, N, K, Ts, seeds, pos)
    p = torch.softmax(torch.tensor(LOGITS10, dtype=torch.float64) / T, 0)
    for j in range(K + 1):
        assert chi2(torch.bincount(t[:, j], minlength=10).double(), p) < 40
    joint = torch.bincount(t[:, 0] * 10 + t[:, 1], minlength=100).double().view(10, 10)
    live = p > 0
    pj = (p[:, None] * p[None, :])[live][:, live]
    c = joint[live][:, live]
    e = pj * N
    assert float(((c - e) ** 2 / e).sum()) < 64 + 6 * math.sqrt(128)   # dof 64
    # not greedy, not uniform: both fail by far
    assert chi2(torch.bincount(torch.zeros(N, dtype=torch.int64), minlength=10).double(), p) > 1e3
    uni = torch.bincount(torch.arange(N) % 9, minlength=10).double()
    assert chi2(uni, p) > 1e3


def test_reference_draft_accepted_with_its_probability():
    """A draft token d is accepted with probability softmax(logits / T)[d]; on rejection
    the bonus token follows softmax conditioned on != d."""
    N, K, T = 200_000, 1, 0.8
    x, Ts, seeds, pos = request_batch(N, K, T, seed=1)
    p = torch.softmax(torch.tensor(LOGITS10, dtype=torch.float64) / T, 0)
    for dtok in (0, 3):
        d = torch.full((N, K), dtok, dtype=torch.int64)
        r = CV.reference(x, d, Ts, seeds, pos)
        rate = float(r.accept_len.double().mean())
        sd = math.sqrt(float(p[dtok] * (1 - p[dtok])) / N)
        assert abs(rate - float(p[dtok])) < 5 * sd, (dtok, rate, float(p[dtok]))
        rej = r.accept_len == 0
        q = p.clone()
        q[dtok] = 0
        q /= q.sum()
        assert chi2(torch.bincount(r.bonus[rej].long(), minlength=10).double(), q) < 40


def test_kernel_sampling_statistics(device):
    """The kernel's samples: on the GPU 40k requests through the same checks as the
    reference's; on the CPU (interpreter) a small batch, where the kernel's tokens must
    equal the reference's, which carries the statistics above."""
    N = 40_000 if ON_GPU else 24
    K, T = 1, 0.8
    x, Ts, seeds, pos = request_batch(N, K, T, seed=2)
    p = torch.softmax(torch.tensor(LOGITS10, dtype=torch.float64) / T, 0)
    dtok = 1
    d = torch.full((N, K), dtok, dtype=torch.int64)
    r = recipes.chain_verify(x.to(device), d.to(device), temperature=Ts.to(device),
                             seeds=seeds.to(device), positions=pos.to(device))
    check_sampled(x, d, Ts, seeds, pos, r)
    t0 = r.tokens[:, 0].cpu().long()
    assert (t0 != 9).all()                                   # the -inf id
    if ON_GPU:
        assert chi2(torch.bincount(t0, minlength=10).double(), p) < 40
        rate = float(r.accept_len.double().mean())
        assert abs(rate - float(p[dtok])) < 5 * math.sqrt(float(p[dtok] * (1 - p[dtok])) / N)


def clustered_rows(n_rows, V, T, seed):
    """Rows whose top scores sit within the filtered scan's approximation error of each
    other: four ids in different lanes, each with u in the lg2.approx-sensitive band just
    below the series branch (1 - u in [3.5e-4, 2e-3]), get logits placing their exact
    scores 3e-5 apart around 20 (16 ulps apart: no near-ties); every other id scores
    at most 16.7. The approximate order of those four can differ from the exact one, so
    the winner is often not in the lane with the largest upper bound: only the bound
    (and the exact scoring of every lane it admits) gets these right."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-2**62, 2**62, (n_rows,), generator=g)
    ctrs = torch.randint(0, 2**20, (n_rows,), generator=g)
    bits = GC.stream_bits(seeds, ctrs, V)
    u = GC.uniform(bits)
    gum = -torch.log(-torch.log(u))
    x = torch.zeros(n_rows, V)
    for r in range(n_rows):
        band = torch.nonzero((1 - u[r] >= 3.5e-4) & (1 - u[r] <= 2e-3)).flatten()
        band = band[torch.randperm(band.numel(), generator=g)]
        picked, lanes = [], set()
        for v in band.tolist():
            if v % 1024 not in lanes:
                picked.append(v)
                lanes.add(v % 1024)
            if len(picked) == 4:
                break
        assert len(picked) == 4
        for k, v in enumerate(picked):
            x[r, v] = T * (20.0 + 3e-5 * k - float(gum[r, v]))
    return x, seeds, ctrs


def test_winner_outside_the_top_lane(device):
    """The bound decides: 12 rows whose four top scores lie within the approximation
    error of each other (see `clustered_rows`), one request per row (K = 0)."""
    n, V, T = 12, 6000, 0.75
    x, seeds, ctrs = clustered_rows(n, V, T, seed=9)
    Ts = torch.full((n,), T)
    d = torch.empty(n, 0, dtype=torch.int64)
    want = CV.target_tokens(x, n, 0, Ts, seeds, ctrs)[:, 0]
    for cfg in (SMALL, {**SMALL, "SPLIT": 1}):
        r = recipes.chain_verify(x.to(device), d.to(device), temperature=Ts.to(device),
                                 seeds=seeds.to(device), positions=ctrs.to(device), config=cfg)
        assert_equal(r.tokens[:, 0].cpu().long(), want, f"cfg={cfg}")

