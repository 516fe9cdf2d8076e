"""recipes.compat.vllm with the sampling controls (v1: sampling_metadata.top_k/top_p;
MRv2: per-state top_k/top_p/min_p) and apply_temperature=True: ragged rows read where
they lie. Each MRv2 request against recipes.chain_verify's reference on its own rows
(the exact tokens of our stream, with the spec's near-tie and threshold tolerances) and
against chain_verify's own call, bit for bit; every call against the module's
`reference`; launch counts, out=, empty requests, states outside the tables, errors and
the emitted tokens' distribution."""
import importlib

import pytest
import torch

import recipes
from recipes.compat.vllm import mrv2, v1
from tests.helpers import ON_GPU, CountingKernel, assert_equal, bad, bad_inputs_test
from tests.recipes.test_chain_verify_controls import check, chi2
from tests.recipes.test_compat_vllm import mrv2_batch, mrv2_call, sampled_meta, v1_batch

RG = importlib.import_module("recipes.compat.vllm._ragged")
CC = importlib.import_module("recipes._controls_core")
CV = importlib.import_module("recipes.chain_verify")
SMALL = {"BLOCK_V": 1024, "SPLIT": 2, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
         "EXACT": 0}
ND = [3, 0, 2, 1, 2]            # drafts per request: ragged, one empty request


def states(S, device, seed, **c):
    """Per-state temperatures (a greedy 0 and a NaN among them), seeds and controls."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(S, generator=g) + 0.4
    temp[1], temp[S - 2] = 0.0, float("nan")
    seed_t = torch.randint(-2**62, 2**62, (S,), generator=g)
    ctl = {n: torch.tensor((v * S)[:S], dtype=torch.int32 if n == "top_k" else torch.float32,
                           device=device) for n, v in c.items()}
    return temp.to(device), seed_t.to(device), ctl


COMBOS = {
    "top_k": {"top_k": [20, 1, 3, 0, 7, 700, 2, 5]},
    "top_p": {"top_p": [0.9, 0.5, 1e-6, 1.0, 0.99, 0.3, 0.7, 1.5]},
    "min_p": {"min_p": [0.05, 0.5, 1.0, 0.0, 1e-3, 0.2, 0.1, 0.3]},
    "all": {"top_k": [20, 5, 0, 100, 40, 3, 9, 11], "top_p": [0.95, 0.8, 0.5, 1.0, 0.6, 0.9,
                                                               0.7, 0.4],
            "min_p": [0.05, 0.0, 0.2, 0.01, 0.0, 0.1, 0.0, 0.3]},
}


def check_mrv2_requests(batch, K, temp, seed_t, ctl, got):
    """Each request b of an MRv2 call: its (sampled, num_sampled) row is chain_verify's
    answer on its own rows (the reference with the spec's tolerances, and chain_verify's
    call bit for bit), with the state's temperature, seed, controls and the row's
    position; requests whose state is outside the tables are greedy."""
    x, ds, cu, pos, idx, _, _ = batch
    S = temp.shape[0]
    sampled, num = got
    for b in range(idx.shape[0]):
        s, e = int(cu[b]), int(cu[b + 1])
        L, q = min(e - s, K + 1), int(idx[b])
        if L == 0:
            assert int(num[b]) == 0 and (sampled[b] == -1).all()
            continue
        rows = x[s:s + L]
        d = ds[s + 1:s + L].view(1, L - 1)
        inside = 0 <= q < S
        kw = {"temperature": (temp[q:q + 1] if inside else temp[:1] * 0),
              "seeds": seed_t[q:q + 1] if inside else seed_t[:1],
              "positions": pos[s:s + 1].to(torch.int64),
              **{n: (t[q:q + 1] if inside else t[:1]) for n, t in ctl.items()}}
        k = int(num[b])
        tokens = torch.where(torch.arange(L, device=x.device) < k, sampled[b, :L], -1)
        vr = recipes.VerifyResult(tokens.view(1, L).to(torch.int32),
                                  num[b:b + 1] - 1, sampled[b, k - 1:k].to(torch.int32),
                                  (num[b:b + 1] - 1).to(torch.int64))
        check(rows, d, kw, vr)
        cv = recipes.chain_verify(rows, d, **kw)
        assert_equal(vr.tokens, cv.tokens, f"request {b}")
        assert (sampled[b, L:] == -1).all()


@pytest.mark.parametrize("combo", list(COMBOS))
def test_mrv2_controls_per_request(device, combo):
    K = 3
    batch = mrv2_batch(ND, 300, torch.bfloat16, device, seed=len(combo))
    S = len(ND) + 3
    temp, seed_t, ctl = states(S, device, seed=2, **COMBOS[combo])
    got = mrv2_call(mrv2.rejection_sample, batch, K, temp, seed_t, apply_temperature=True,
                    config=SMALL, **ctl)
    check_mrv2_requests(batch, K, temp, seed_t, ctl, got)
    want = mrv2_call(mrv2.reference, batch, K, temp, seed_t, apply_temperature=True, **ctl)
    assert_equal(got[1], want[1], "num_sampled")
    assert_equal(got[0], want[0], "sampled")


def test_mrv2_states_outside_the_tables_and_configs(device):
    """An idx_mapping entry outside the tables reads as greedy (controls too); every
    config gives the same bits; out= buffers are written in place; int32 index tensors."""
    K = 2
    batch = mrv2_batch([2, 1, 2, 0], 500, torch.float32, device, seed=7, idt=torch.int32)
    x, ds, cu, pos, idx, eidx, elp = batch
    idx = idx.clone()
    idx[0], idx[2] = 50, -3
    batch = [x, ds, cu, pos, idx, eidx, elp]
    temp, seed_t, ctl = states(7, device, seed=3, **COMBOS["all"])
    outs = []
    for cfg in (SMALL, {**SMALL, "SPLIT": 1, "UNROLL": 2}, None):
        out = (torch.full((4, K + 1), 9, dtype=torch.int64, device=device),
               torch.full((4,), 9, dtype=torch.int32, device=device))
        got = mrv2_call(mrv2.rejection_sample, batch, K, temp, seed_t, apply_temperature=True,
                        config=cfg, out=out, **ctl)
        assert got[0] is out[0] and got[1] is out[1]
        outs.append(got)
    for got in outs[1:]:
        assert_equal(got[0], outs[0][0])
        assert_equal(got[1], outs[0][1])
    check_mrv2_requests(batch, K, temp, seed_t, ctl, outs[0])
    greedy = torch.argmax(x, dim=-1)
    assert int(outs[0][0][0, 0]) == int(greedy[0])


def test_mrv2_batch_invariance(device):
    """A request's tokens do not depend on the other requests' controls or the batch."""
    K = 3
    batch = mrv2_batch(ND, 300, torch.bfloat16, device, seed=9)
    S = len(ND) + 3
    temp, seed_t, ctl = states(S, device, seed=4, **COMBOS["all"])
    full = mrv2_call(mrv2.rejection_sample, batch, K, temp, seed_t, apply_temperature=True,
                     config=SMALL, **ctl)
    x, ds, cu, pos, idx, eidx, elp = batch
    b = 3
    s, e = int(cu[b]), int(cu[b + 1])
    alone = (x[s:e], ds[s:e], torch.tensor([0, e - s], device=device), pos[s:e],
             idx[b:b + 1], eidx[s:e], elp[s:e])
    one = mrv2_call(mrv2.rejection_sample, alone, K, temp, seed_t, apply_temperature=True,
                    config=SMALL, **ctl)
    assert_equal(one[0][0], full[0][b])


def test_v1_controls(device):
    """v1 with sampling_metadata.top_k/top_p and apply_temperature=True equals its
    reference; each request's draft rows sample over chain_verify's kept set (a request
    alone gives the same row); greedy requests are the argmax."""
    nd = [3, 0, 2, 1, 4]
    d, cu, x, bonus = v1_batch(nd, 400, torch.bfloat16, device, seed=5)
    temp = torch.tensor([0.7, 0.0, 1.3, 0.9, 0.5], device=device)
    meta = sampled_meta(temp)
    meta.top_k = torch.tensor([20, 5, 0, 1, 400], dtype=torch.int32, device=device)
    meta.top_p = torch.tensor([0.9, 0.5, 1.0, 0.3, 0.8], device=device)
    kw = dict(seeds=torch.arange(5, device=device) * 31 - 7,
              positions=torch.tensor([10, 20, 30, 2**20, 0], device=device),
              apply_temperature=True)
    got = v1.rejection_sample(d, nd, 4, cu, None, x, bonus, meta, config=SMALL, **kw)
    want = v1.reference(d, nd, 4, cu, None, x, bonus, meta, **kw)
    assert_equal(got, want, "v1")
    # request 3 (top_k 1: the argmax of z, whatever the noise) alone
    s, e = int(cu[2]), int(cu[3])
    alone = v1.rejection_sample(d[s:e], [1], 4, cu[3:4] - s, None, x[s:e], bonus[3:4],
                                _meta(meta, 3), seeds=kw["seeds"][3:4],
                                positions=kw["positions"][3:4], apply_temperature=True,
                                config=SMALL)
    assert_equal(alone[0], got[3])
    assert int(got[3, 0]) == int(torch.argmax(x[s].float() / 0.9))
    # without apply_temperature the controls are vLLM's, already applied: not read
    plain = v1.rejection_sample(d, nd, 4, cu, None, x, bonus, meta, config=SMALL,
                                seeds=kw["seeds"], positions=kw["positions"])
    meta.top_k = meta.top_p = None
    assert_equal(plain, v1.reference(d, nd, 4, cu, None, x, bonus, meta,
                                     seeds=kw["seeds"], positions=kw["positions"]))


def _meta(meta, b):
    m = sampled_meta(meta.temperature[b:b + 1])
    m.top_k, m.top_p = meta.top_k[b:b + 1], meta.top_p[b:b + 1]
    return m


def test_empty_and_single(device):
    """B = 0 launches nothing; B = 1 with controls; a request with no rows at all."""
    temp, seed_t, ctl = states(4, device, seed=1, **COMBOS["top_k"])
    empty = mrv2_batch([], 100, torch.float32, device, seed=0)
    s, n = mrv2_call(mrv2.rejection_sample, empty, 2, temp, seed_t, apply_temperature=True,
                     **ctl)
    assert s.shape == (0, 3) and n.shape == (0,)
    d, cu, x, bonus = v1_batch([], 100, torch.float32, device, seed=0)
    meta = sampled_meta(temp[:0])
    meta.top_k = ctl["top_k"][:0]
    o = v1.rejection_sample(d, [], 2, cu, None, x, bonus.view(0, 1), meta,
                            seeds=seed_t[:0], positions=seed_t[:0], apply_temperature=True)
    assert o.shape == (0, 3)
    one = mrv2_batch([2], 300, torch.float32, device, seed=2)
    got = mrv2_call(mrv2.rejection_sample, one, 2, temp, seed_t, apply_temperature=True,
                    config=SMALL, **ctl)
    check_mrv2_requests(one, 2, temp, seed_t, ctl, got)


def test_launches(device, monkeypatch):
    """Controls: the threshold launch and the verify launch; without them (or with an
    all-greedy batch) the verify launch alone."""
    sel, ver = CountingKernel(RG._select_kernel), CountingKernel(RG._ragged_kernel)
    monkeypatch.setattr(RG, "_select_kernel", sel)
    monkeypatch.setattr(RG, "_ragged_kernel", ver)
    batch = mrv2_batch([2, 1], 200, torch.float32, device, seed=1)
    temp, seed_t, ctl = states(5, device, seed=1, **COMBOS["all"])
    mrv2_call(mrv2.rejection_sample, batch, 2, temp, seed_t, apply_temperature=True,
              config=SMALL, **ctl)
    assert (sel.launches, ver.launches) == (1, 1)
    mrv2_call(mrv2.rejection_sample, batch, 2, temp, seed_t, apply_temperature=True,
              config=SMALL)
    mrv2_call(mrv2.rejection_sample, batch, 2, temp, seed_t, apply_temperature=True,
              all_greedy=True, config=SMALL, **ctl)
    assert (sel.launches, ver.launches) == (1, 3)
    d, cu, x, bonus = v1_batch([2, 1], 200, torch.float32, device, seed=1)
    meta = sampled_meta(temp[:2])
    meta.top_p = torch.tensor([0.5, 0.9], device=device)
    v1.rejection_sample(d, [2, 1], 2, cu, None, x, bonus, meta, seeds=seed_t[:2],
                        positions=seed_t[:2] * 0, apply_temperature=True, config=SMALL)
    assert (sel.launches, ver.launches) == (2, 4)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and allocation counts need a GPU")
def test_graph_capture_allocates_nothing_with_out(device):
    from tests.helpers import capture

    K = 3
    batch = mrv2_batch([3, 1, 0, 2] * 4, 151936, torch.bfloat16, device, seed=3)
    temp, seed_t, ctl = states(19, device, seed=5, top_k=[20], top_p=[0.95])
    out = mrv2_call(mrv2.rejection_sample, batch, K, temp, seed_t, apply_temperature=True,
                    **ctl)

    def call():
        return mrv2_call(mrv2.rejection_sample, batch, K, temp, seed_t,
                         apply_temperature=True, out=out, **ctl)
    want = [t.clone() for t in call()]
    graph, allocated = capture(call)
    out[0].fill_(-7)
    graph.replay()
    assert allocated <= 0
    assert_equal(out[0], want[0])
    assert_equal(out[1], want[1])


# --- statistics -------------------------------------------------------------------------------
CHI2_P001 = {3: 16.27, 4: 18.47, 5: 20.52}


def test_distribution(device):
    """MRv2, R requests with their own seeds, one draft each over V = 8, T = 0.8 with
    min_p 0.1, top_k 6 and top_p 0.9: the first emitted token follows the filtered
    renormalised softmax (the unfiltered fails), the draft is accepted exactly when
    drawn. Counted over 20000 requests on the module's semantics (chain_verify's, row by
    row: `target_tokens` of every first row), which the kernel and `reference` must
    equal (the kernel on all of them on the GPU, on the first 12 under the interpreter)."""
    R, V, d0, T = 20000, 8, 1, 0.8
    z0 = torch.tensor([1.2, 0.9, 0.5, 0.3, 0.0, -0.4, -1.0, -3.0])
    x = torch.stack([z0, z0.flip(0)]).repeat(R, 1)
    ds = torch.tensor([0, d0]).repeat(R)
    cu = torch.arange(R + 1) * 2
    pos = torch.arange(2 * R) * 3
    idx = torch.arange(R)
    seed_t = torch.randint(-2**62, 2**62, (R,), generator=torch.Generator().manual_seed(7))
    temp = torch.full((R,), T)
    c = {"min_p": torch.full((R,), 0.1), "top_k": torch.full((R,), 6, dtype=torch.int32),
         "top_p": torch.full((R,), 0.9)}
    first = CV.target_tokens(x[0::2], R, 0, temp, seed_t, pos[0::2], c["top_k"], c["top_p"],
                             c["min_p"])[:, 0]
    n = R if ON_GPU else 12
    want = mrv2.reference(x[:2 * n], None, ds[:2 * n], cu[:n + 1], pos[:2 * n], idx[:n],
                          pos[:2 * n], pos[:2 * n], temp[:n], seed_t[:n], 1,
                          apply_temperature=True, **{k: v[:n] for k, v in c.items()})
    assert torch.equal(want[0][:, 0], first[:n])
    assert torch.equal(want[1] == 2, first[:n] == d0)
    args = [t.to(device) for t in (x[:2 * n], ds[:2 * n], cu[:n + 1], pos[:2 * n], idx[:n],
                                   pos[:2 * n], pos[:2 * n], temp[:n], seed_t[:n])]
    got = mrv2.rejection_sample(args[0], None, *args[1:], 1, apply_temperature=True,
                                **{k: v[:n].to(device) for k, v in c.items()})
    assert_equal(got[0], want[0].to(device))
    assert_equal(got[1], want[1].to(device))
    kept = CC.kept((z0 / T)[None], c["top_k"][:1], c["top_p"][:1], c["min_p"][:1])[0]
    p = torch.where(kept, torch.softmax(z0.double() / T, 0), 0.0)
    p = p / p.sum()
    counts = torch.bincount(first, minlength=V).double()
    dof = int(kept.sum()) - 1
    assert 0 < dof < V - 1
    assert chi2(counts, p) < CHI2_P001[dof], counts.tolist()
    assert chi2(counts, torch.softmax(z0.double() / T, 0)) > 200


# --- errors -----------------------------------------------------------------------------------
def _v1(dev, **meta_over):
    d, cu, x, bonus = v1_batch([2, 1], 100, torch.float32, dev, seed=0)
    meta = sampled_meta(torch.ones(2, device=dev))
    for k, v in meta_over.items():
        setattr(meta, k, v(dev) if callable(v) else v)
    return v1.rejection_sample(d, [2, 1], 2, cu, None, x, bonus, meta,
                               seeds=torch.zeros(2, dtype=torch.int64, device=dev),
                               positions=torch.zeros(2, dtype=torch.int64, device=dev),
                               apply_temperature=True)


def _m2(dev, **c):
    batch = mrv2_batch([2, 1], 100, torch.float32, dev, seed=0)
    temp, seed_t, _ = states(5, dev, seed=0)
    return mrv2_call(mrv2.rejection_sample, batch, 2, temp, seed_t, apply_temperature=True,
                     **{k: v(dev) for k, v in c.items()})


BAD = [
    bad("v1-top_k-dtype", lambda d: _v1(d, top_k=lambda d: torch.ones(2, device=d)),
        TypeError, "sampling_metadata.top_k"),
    bad("v1-top_p-shape", lambda d: _v1(d, top_p=lambda d: torch.ones(3, device=d)),
        ValueError, "sampling_metadata.top_p"),
    bad("m2-top_k-shape", lambda d: _m2(d, top_k=lambda d: torch.ones(4, dtype=torch.int32,
                                                                      device=d)),
        ValueError, "top_k"),
    bad("m2-min_p-dtype", lambda d: _m2(d, min_p=lambda d: torch.ones(5, dtype=torch.float64,
                                                                      device=d)),
        TypeError, "min_p"),
    bad("m2-controls-without-apply", lambda d: mrv2_call(
        mrv2.rejection_sample, mrv2_batch([1], 50, torch.float32, d, seed=0), 1,
        top_p=torch.ones(4, device=d)), ValueError, "top_p"),
]
test_bad_inputs = bad_inputs_test(BAD)
