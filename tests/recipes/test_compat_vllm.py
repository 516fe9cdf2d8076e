"""recipes.compat.vllm against a plain-torch statement of vLLM 0.33.0's rejection samplers.

The model (`vllm_*` below) restates, request by request, what vLLM's kernels compute,
independently of ours: v1's `rejection_greedy_sample_kernel` on `target_logits.argmax`,
and model-runner v2's `_rejection_kernel` + `_insert_resampled_kernel` on its per-block
argmax (8192-id blocks, block maxima with NaN read as -inf). Greedy outputs must equal
the model bit for bit (v1 everywhere; MRv2 on NaN-free rows, with the documented NaN
difference checked on its own); every call also equals the module's `reference`, which
defines sampled rows too. Sampled rows are checked in distribution (chi-square).
"""
import importlib
import types

import pytest
import torch

from recipes.compat.vllm import mrv2, v1
from tests.helpers import (
    CountingKernel,
    assert_equal,
    bad,
    bad_inputs_test,
    hard_logits,
    sample_configs,
)

RG = importlib.import_module("recipes.compat.vllm._ragged")
SMALL = {"BLOCK_V": 1024, "SPLIT": 2, "num_warps": 4, "num_stages": 1, "UNROLL": 1,
         "EXACT": 0}
CHI2_DF5_P001 = 20.52      # chi-square critical value, 5 degrees of freedom, p = 0.001


# --- the model ---------------------------------------------------------------------------
def vllm_v1_greedy(draft_token_ids, cu, max_spec_len, target_logits, bonus):
    out = torch.full((cu.shape[0], max_spec_len + 1), -1, dtype=torch.int32)
    argmax = target_logits.cpu().argmax(dim=-1).to(torch.int32)
    d, cu, bonus = draft_token_ids.cpu(), cu.cpu(), bonus.cpu().reshape(-1)
    for b in range(cu.shape[0]):
        start, end = (0 if b == 0 else int(cu[b - 1])), int(cu[b])
        rejected = False
        for p in range(end - start):
            if not rejected:
                out[b, p] = argmax[start + p]
                rejected = int(d[start + p]) != int(argmax[start + p])
        if not rejected:
            out[b, end - start] = int(bonus[b])
    return out


def vllm_block_argmax(row, block=8192):
    x = row.float()
    maxes, ids = [], []
    for lo in range(0, x.shape[0], block):
        v, i = x[lo:lo + block].max(dim=0)
        maxes.append(float("-inf") if torch.isnan(v) else float(v))
        ids.append(lo + int(i))
    return ids[int(torch.tensor(maxes).argmax())]


def vllm_mrv2_greedy(target_logits, draft_sampled, cu, K):
    R = cu.shape[0] - 1
    sampled = torch.full((R, K + 1), -1, dtype=torch.int64)
    num = torch.zeros(R, dtype=torch.int32)
    x, ds, cu = target_logits.cpu(), draft_sampled.cpu(), cu.cpu()
    for b in range(R):
        start, end = int(cu[b]), int(cu[b + 1])
        accepted = 0
        for i in range(end - start - 1):
            t = vllm_block_argmax(x[start + i])
            d = int(ds[start + i + 1])
            ok = d >= 0 and t == d
            sampled[b, i] = d if ok else t
            accepted += ok
            if not ok:
                break
        if start + accepted == end - 1:              # the bonus row: resampled (argmax)
            sampled[b, accepted] = vllm_block_argmax(x[start + accepted])
        num[b] = accepted + 1
    return sampled, num


# --- batches -------------------------------------------------------------------------------
def greedy_meta(B=0):
    return types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                                 top_k=None, top_p=None, generators={})


def sampled_meta(temp):
    return types.SimpleNamespace(all_greedy=False, all_random=bool((temp > 0).all()),
                                 temperature=temp, top_k=None, top_p=None, generators={})


def drafts_for(t, n, accept, V, g):
    """Drafts of n tokens against targets t [n]: accept `accept` then miss (a wrong id,
    -1, V or V + 7 in turn)."""
    d = t.clone()
    if accept < n:
        d[accept] = [int(t[accept] + 1) % V, -1, V, V + 7][int(torch.randint(4, (1,),
                                                                             generator=g))]
        d[accept + 1:] = torch.randint(-1, V, (n - accept - 1,), generator=g)
    return d


def v1_batch(nd, V, dtype, device, seed, idt=torch.int64, hard=False):
    g = torch.Generator().manual_seed(seed)
    N = sum(nd)
    x = hard_logits(N, V, dtype, "cpu", seed) if hard else torch.randn(N, V, generator=g).to(dtype)
    t = x.argmax(dim=-1)
    d, s = torch.empty(N, dtype=torch.int64), 0
    for n in nd:
        d[s:s + n] = drafts_for(t[s:s + n], n, int(torch.randint(n + 1, (1,), generator=g)),
                                V, g)
        s += n
    cu = torch.tensor(nd, dtype=torch.int64).cumsum(0).to(idt)
    bonus = torch.randint(0, V, (len(nd), 1), generator=g, dtype=torch.int64).to(torch.int32)
    return [v.to(device) for v in (d.to(idt), cu, x, bonus)]


def mrv2_batch(nd, V, dtype, device, seed, idt=torch.int64, hard=False):
    """nd: drafts per request (each gets nd + 1 rows)."""
    g = torch.Generator().manual_seed(seed)
    L = [n + 1 for n in nd]
    N = sum(L)
    x = hard_logits(N, V, dtype, "cpu", seed) if hard else torch.randn(N, V, generator=g).to(dtype)
    t = x.argmax(dim=-1)
    ds, s = torch.randint(0, V, (N,), generator=g), 0
    for n in nd:
        ds[s + 1:s + 1 + n] = drafts_for(t[s:s + n], n, int(torch.randint(n + 1, (1,),
                                                                          generator=g)), V, g)
        s += n + 1
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(L).cumsum(0)]).to(idt)
    R = len(nd)
    pos = torch.cat([torch.arange(n + 1) + 100 * i for i, n in enumerate(nd)]).to(idt) \
        if R else torch.zeros(0, dtype=idt)
    idx = torch.randperm(R + 3, generator=g)[:R].to(idt)          # state indices
    elp = torch.cat([torch.arange(n + 1) for n in nd]).to(idt) if R else pos
    eidx = torch.repeat_interleave(idx, torch.tensor(L)) if R else pos
    return [v.to(device) for v in (x, ds.to(idt), cu, pos, idx, eidx, elp)]


def mrv2_call(fn, batch, K, temp=None, seed=None, **kw):
    x, ds, cu, pos, idx, eidx, elp = batch
    S = idx.shape[0] + 3
    temp = torch.zeros(S, device=x.device) if temp is None else temp
    seed = torch.arange(S, device=x.device) * 7919 if seed is None else seed
    return fn(x, None, ds, cu, pos, idx, eidx, elp, temp, seed, K, **kw)


RAGGED = [[3, 0, 2, 1, 3], [0], [1], [2, 2, 2], [0, 0, 0], [5, 1, 0, 4, 2, 3, 1]]


# --- greedy, bit for bit ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("nd", RAGGED, ids=lambda nd: "-".join(map(str, nd)))
def test_v1_greedy_matches_vllm(device, dtype, nd):
    K = max(nd)
    for idt in (torch.int64, torch.int32):
        d, cu, x, bonus = v1_batch(nd, 1000, dtype, device, seed=len(nd) + K, idt=idt,
                                   hard=True)
        want = vllm_v1_greedy(d, cu, K, x, bonus)
        got = v1.rejection_sample(d, nd, K, cu, None, x, bonus, greedy_meta(), config=SMALL)
        assert_equal(got, want.to(device), f"v1 {idt}")
        assert_equal(v1.reference(d, nd, K, cu, None, x, bonus, greedy_meta()), got, "ref")


def test_v1_wider_rows_and_out(device):
    """max_spec_len above every request's count: the rest of each row is -1; out= is
    written in full (poisoned first); a strided logits view is read in place."""
    nd = [2, 0, 1]
    d, cu, x, bonus = v1_batch(nd, 3000, torch.float32, device, seed=5)
    wide = torch.randn(x.shape[0], 4000, device=device)
    wide[:, :3000] = x
    view = wide[:, :3000]
    out = torch.full((3, 6), 77, dtype=torch.int32, device=device)
    got = v1.rejection_sample(d, nd, 5, cu, None, view, bonus, greedy_meta(), out=out,
                              config=SMALL)
    assert got is out
    assert_equal(out, vllm_v1_greedy(d, cu, 5, x, bonus).to(device), "wide")


@pytest.mark.parametrize("nd", RAGGED, ids=lambda nd: "-".join(map(str, nd)))
def test_mrv2_greedy_matches_vllm(device, nd):
    dtype = torch.bfloat16 if len(nd) % 2 else torch.float32
    K = max(nd)
    for idt in (torch.int64, torch.int32):
        batch = mrv2_batch(nd, 9000, dtype, device, seed=len(nd) + K, idt=idt)
        want = vllm_mrv2_greedy(batch[0], batch[1], batch[2], K)
        for hint in ((False, True) if idt == torch.int64 else (False,)):
            s, n = mrv2_call(mrv2.rejection_sample, batch, K, all_greedy=hint, config=SMALL)
            assert_equal(n, want[1].to(device), f"num_sampled {idt} all_greedy={hint}")
            keep = torch.arange(K + 1, device=device)[None, :] < n[:, None].long()
            assert_equal(torch.where(keep, s, -1), want[0].to(device), f"sampled {idt}")
            assert_equal(s, torch.where(keep, s, -1), "-1 past num_sampled")
            ref = mrv2_call(mrv2.reference, batch, K)
            assert_equal(s, ref[0], "ref sampled")
            assert_equal(n, ref[1], "ref num")


def test_mrv2_nan_follows_torch_argmax(device):
    """The documented difference: ours is torch.argmax (the first NaN wins) on the hard
    rows, where vLLM's block max reads NaN as -inf."""
    nd = [3, 2, 1, 0]
    batch = mrv2_batch(nd, 700, torch.float32, device, seed=3, hard=True)
    s, n = mrv2_call(mrv2.rejection_sample, batch, 3, config=SMALL)
    ref = mrv2_call(mrv2.reference, batch, 3)
    assert_equal(s, ref[0], "sampled")
    assert_equal(n, ref[1], "num")
    t = batch[0].cpu().argmax(dim=-1)
    assert int(s[0, 0]) == int(t[0]) or int(n[0]) == 1


def test_empty_and_single(device):
    x = torch.randn(0, 50, device=device)
    e = torch.zeros(0, dtype=torch.int64, device=device)
    got = v1.rejection_sample(e, [], 3, e, None, x, e.view(0, 1), greedy_meta())
    assert got.shape == (0, 4) and got.dtype == torch.int32
    s, n = mrv2.rejection_sample(x, None, e, torch.zeros(1, dtype=torch.int64, device=device),
                                 e, e, e, e, torch.zeros(2, device=device), e.new_zeros(2), 3)
    assert s.shape == (0, 4) and n.shape == (0,)
    # B = 1 with no draft: [bonus, -1, ...], one launch over no logits row
    bonus = torch.tensor([[42]], dtype=torch.int32, device=device)
    cu = torch.zeros(1, dtype=torch.int64, device=device)
    got = v1.rejection_sample(e, [0], 2, cu, None, x, bonus, greedy_meta())
    assert got.tolist() == [[42, -1, -1]]


def test_every_config_same_bits(device):
    nd = [3, 0, 2, 1, 3]
    batch = mrv2_batch(nd, 2500, torch.bfloat16, device, seed=11)
    d, cu, x, bonus = v1_batch(nd, 2500, torch.bfloat16, device, seed=11)
    key = RG.tune_key(torch.bfloat16, 2500, 15, False)
    want_v1 = vllm_v1_greedy(d, cu, 3, x, bonus).to(device)
    want = mrv2_call(mrv2.reference, batch, 3)
    for cfg in sample_configs(RG.TUNING.configs(key), 6):
        assert_equal(v1.rejection_sample(d, nd, 3, cu, None, x, bonus, greedy_meta(),
                                         config=cfg), want_v1, f"v1 {cfg}")
        got = mrv2_call(mrv2.rejection_sample, batch, 3, config=cfg)
        assert_equal(got[0], want[0], f"mrv2 {cfg}")


def test_real_vocab(device):
    nd = [3, 1]
    d, cu, x, bonus = v1_batch(nd, 151936, torch.bfloat16, device, seed=2)
    got = v1.rejection_sample(d, nd, 3, cu, None, x, bonus, greedy_meta())
    assert_equal(got, vllm_v1_greedy(d, cu, 3, x, bonus).to(device), "v1 V=151936")


def test_out_of_range_counts_stay_in_bounds(device):
    """Non-monotone, negative and too-large boundaries, and more drafts than the row
    holds: the defined answer (module reference), and the workspace is left at rest (the
    next call is right)."""
    nd = [2, 2, 2, 2]
    d, cu, x, bonus = v1_batch(nd, 600, torch.float32, device, seed=9)
    for bad_cu in ([4, 2, 6, 99], [-3, 2, 8, 5], [8, 8, 8, 8], [1, 9, 3, 8]):
        c = torch.tensor(bad_cu, device=device)
        got = v1.rejection_sample(d, nd, 1, c, None, x, bonus, greedy_meta(), config=SMALL)
        assert_equal(got, v1.reference(d, nd, 1, c, None, x, bonus, greedy_meta()), f"{bad_cu}")
    batch = mrv2_batch([3, 1, 2], 600, torch.float32, device, seed=9)
    for bad_cu in ([2, 1, 9, 40], [0, 9, 3, 8], [0, 0, 0, 0]):
        b2 = list(batch)
        b2[2] = torch.tensor(bad_cu, device=device)
        got = mrv2_call(mrv2.rejection_sample, b2, 1, config=SMALL)
        want = mrv2_call(mrv2.reference, b2, 1)
        assert_equal(got[0], want[0], f"{bad_cu}")
        assert_equal(got[1], want[1], f"{bad_cu}")
    got = v1.rejection_sample(d, nd, 2, cu, None, x, bonus, greedy_meta(), config=SMALL)
    assert_equal(got, vllm_v1_greedy(d, cu, 2, x, bonus).to(device), "after")


def test_one_launch(device, monkeypatch):
    k = CountingKernel(RG._ragged_kernel)
    monkeypatch.setattr(RG, "_ragged_kernel", k)
    nd = [2, 0, 3]
    d, cu, x, bonus = v1_batch(nd, 500, torch.float32, device, seed=1)
    v1.rejection_sample(d, nd, 3, cu, None, x, bonus, greedy_meta(), config=SMALL)
    assert k.launches == 1
    temp = torch.tensor([0.0, 1.0, 0.5], device=device)
    seeds = torch.arange(3, device=device)
    v1.rejection_sample(d, nd, 3, cu, None, x, bonus, sampled_meta(temp), seeds=seeds,
                        positions=seeds, config=SMALL)
    assert k.launches == 2
    batch = mrv2_batch(nd, 500, torch.float32, device, seed=1)
    mrv2_call(mrv2.rejection_sample, batch, 3, config=SMALL)
    assert k.launches == 3


# --- sampled -----------------------------------------------------------------------------------
def test_sampled_equals_reference_and_batch_invariance(device):
    nd = [3, 0, 2, 1]
    batch = mrv2_batch(nd, 3000, torch.bfloat16, device, seed=4)
    S = len(nd) + 3
    temp = torch.tensor([0.7, 0.0, 1.3, 2.0, 1.0, 0.0, 0.5], device=device)[:S]
    seed = torch.randint(-2**62, 2**62, (S,), generator=torch.Generator().manual_seed(1))
    seed = seed.to(device)
    for apply in (False, True):
        got = mrv2_call(mrv2.rejection_sample, batch, 3, temp, seed, apply_temperature=apply,
                        config=SMALL)
        want = mrv2_call(mrv2.reference, batch, 3, temp, seed, apply_temperature=apply)
        assert_equal(got[0], want[0], f"sampled apply={apply}")
        assert_equal(got[1], want[1], f"num apply={apply}")
    # request 2 alone: same tokens (the stream is keyed by seed and position only)
    x, ds, cu, pos, idx, eidx, elp = batch
    s0, e0 = int(cu[2]), int(cu[3])
    alone = (x[s0:e0], ds[s0:e0], torch.tensor([0, e0 - s0], device=device), pos[s0:e0],
             idx[2:3], eidx[s0:e0], elp[s0:e0])
    one = mrv2_call(mrv2.rejection_sample, alone, 3, temp, seed, config=SMALL)
    assert one[0][0].tolist() == got[0][2].tolist()
    # v1: the same rows sampled in v1's layout equal its reference
    d, cu1, x1, bonus = v1_batch(nd, 3000, torch.bfloat16, device, seed=4)
    t1 = torch.tensor([0.7, 0.0, 1.3, 2.0], device=device)
    kw = dict(seeds=seed[:4], positions=torch.arange(4, device=device) * 50)
    got = v1.rejection_sample(d, nd, 3, cu1, None, x1, bonus, sampled_meta(t1), config=SMALL,
                              **kw)
    assert_equal(got, v1.reference(d, nd, 3, cu1, None, x1, bonus, sampled_meta(t1), **kw),
                 "v1 sampled")


def chi2(counts, p):
    n = counts.sum()
    e = n * p
    return float(((counts - e) ** 2 / e).sum())


def test_sampled_distribution(device):
    """MRv2, many requests with their own seeds, one draft each over V = 6, the kernel
    dividing by T (apply_temperature): the first emitted token follows softmax(row 0 / T),
    the draft is accepted with its probability, and after an accepted draft the bonus
    token follows softmax(row 1 / T) (chi-square, p = 0.001)."""
    R, V, d0, T = 240, 6, 2, 0.8
    z0 = torch.tensor([0.5, -1.0, 1.2, 0.0, 0.3, -0.4])
    z1 = torch.tensor([-0.2, 0.9, 0.1, 0.4, -1.1, 0.6])
    x = torch.stack([z0, z1]).repeat(R, 1).to(device)
    ds = torch.tensor([0, d0]).repeat(R).to(device)
    cu = (torch.arange(R + 1) * 2).to(device)
    pos = torch.arange(2 * R, device=device) * 3
    idx = torch.arange(R, device=device)
    seed = torch.randint(-2**62, 2**62, (R,), generator=torch.Generator().manual_seed(7))
    temp = torch.full((R,), T, device=device)
    s, n = mrv2.rejection_sample(x, None, ds, cu, pos, idx, pos, pos, temp, seed.to(device),
                                 1, apply_temperature=True)
    s, n = s.cpu(), n.cpu()
    first = torch.bincount(s[:, 0], minlength=V).double()
    assert chi2(first, torch.softmax(z0 / T, 0).double()) < CHI2_DF5_P001, first.tolist()
    acc = s[:, 0] == d0
    assert (n == torch.where(acc, 2, 1).int()).all()
    bonus = torch.bincount(s[acc, 1], minlength=V).double()
    assert chi2(bonus, torch.softmax(z1 / T, 0).double()) < CHI2_DF5_P001, bonus.tolist()
    assert (s[~acc, 1] == -1).all()


# --- errors ------------------------------------------------------------------------------------
def _v1(dev, **over):
    d, cu, x, bonus = v1_batch([2, 1], 100, torch.float32, dev, seed=0)
    a = dict(draft_token_ids=d, num_draft_tokens=[2, 1], max_spec_len=2,
             cu_num_draft_tokens=cu, draft_probs=None, target_logits=x,
             bonus_token_ids=bonus, sampling_metadata=greedy_meta())
    a.update({k: (v(a, dev) if callable(v) else v) for k, v in over.items()})
    return v1.rejection_sample(**a)


def _m2(dev, **over):
    batch = mrv2_batch([2, 1], 100, torch.float32, dev, seed=0)
    names = ("target_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping",
             "expanded_idx_mapping", "expanded_local_pos")
    a = dict(zip(names, batch, strict=True), draft_logits=None,
             temperature=torch.ones(5, device=dev), seed=torch.zeros(5, dtype=torch.int64,
                                                                      device=dev),
             num_speculative_steps=2)
    a.update({k: (v(a, dev) if callable(v) else v) for k, v in over.items()})
    return mrv2.rejection_sample(**a)


def _v1_overlap(dev):
    big = torch.zeros(6, dtype=torch.int32, device=dev)
    return _v1(dev, bonus_token_ids=big[:2].view(2, 1), out=big.view(2, 3))


BAD = [
    bad("v1-probs", lambda d: _v1(d, draft_probs=lambda a, d: torch.rand(3, 100, device=d),
                                  sampling_metadata=sampled_meta(torch.ones(2, device=d))),
        NotImplementedError, "draft_probs"),
    bad("v1-synthetic", lambda d: _v1(d, synthetic_mode=True), NotImplementedError,
        "synthetic"),
    bad("v1-fly", lambda d: _v1(d, fly_window_size=2), NotImplementedError, "fly"),
    bad("v1-seeds", lambda d: _v1(d, sampling_metadata=sampled_meta(torch.ones(2, device=d))),
        ValueError, "seeds"),
    bad("v1-out-dtype", lambda d: _v1(d, out=torch.zeros(2, 3, dtype=torch.int64, device=d)),
        TypeError, "out"),
    bad("v1-out-shape", lambda d: _v1(d, out=torch.zeros(2, 4, dtype=torch.int32, device=d)),
        ValueError, "out"),
    bad("v1-out-overlap", lambda d: _v1_overlap(d), ValueError, "out"),
    bad("v1-cu-shape", lambda d: _v1(d, cu_num_draft_tokens=lambda a, d: a[
        "cu_num_draft_tokens"][:1]), ValueError, "cu_num_draft_tokens"),
    bad("v1-drafts", lambda d: _v1(d, draft_token_ids=lambda a, d: a["draft_token_ids"][:2]),
        ValueError, "draft_token_ids"),
    bad("v1-bonus", lambda d: _v1(d, bonus_token_ids=lambda a, d: a["bonus_token_ids"]
                                  .float()), TypeError, "bonus_token_ids"),
    bad("v1-max-spec", lambda d: _v1(d, max_spec_len=-1), ValueError, "max_spec_len"),
    bad("v1-meta", lambda d: _v1(d, sampling_metadata=object()), TypeError,
        "sampling_metadata"),
    bad("m2-draft-logits", lambda d: _m2(d, draft_logits=torch.zeros(5, 2, 100, device=d)),
        NotImplementedError, "draft_logits"),
    bad("m2-block", lambda d: _m2(d, use_block_verification=True), NotImplementedError,
        "use_block_verification"),
    bad("m2-watermark", lambda d: _m2(d, watermark_key=3), NotImplementedError,
        "watermark_key"),
    bad("m2-top-k", lambda d: _m2(d, top_k=torch.ones(5, dtype=torch.int64, device=d)),
        ValueError, "top_k"),
    bad("m2-top-p-shape", lambda d: _m2(d, top_p=torch.ones(4, device=d),
                                        apply_temperature=True), ValueError, "top_p"),
    bad("m2-seed-shape", lambda d: _m2(d, seed=torch.zeros(4, dtype=torch.int64, device=d)),
        ValueError, "seed"),
    bad("m2-pos", lambda d: _m2(d, pos=lambda a, d: a["pos"][1:]), ValueError, "pos"),
    bad("m2-out", lambda d: _m2(d, out=(torch.zeros(2, 3, dtype=torch.int64, device=d),)),
        TypeError, "out"),
    bad("m2-out-overlap", lambda d: _m2(d, out=lambda a, d: (
        torch.zeros(2, 3, dtype=torch.int64, device=d),
        a["target_logits"].view(torch.int32).view(-1)[:2])), ValueError, "out.num_sampled"),
    bad("m2-steps", lambda d: _m2(d, num_speculative_steps=True), TypeError,
        "num_speculative_steps: expected an int, got bool"),
]
test_bad_inputs = bad_inputs_test(BAD)
