"""top_p's candidate check (`recipes._topp_core`, blocks 1 and 2 of chain_verify's
controls launch): a chunk's C best exact scores among pk >= P0 equal torch's, by the
filtered and by the exact lane search, and chain_verify's tokens are the reference's on
rows the check decides and rows that fall through to the threshold search, in one call
and with every config."""
import importlib

import pytest
import torch
import triton
import triton.language as tl

from tests.helpers import ON_GPU, assert_equal
from tests.recipes.test_chain_verify_controls import CFGS, SMALL, ctl, run

CC = importlib.import_module("recipes._controls_core")
GC = importlib.import_module("recipes._gumbel_core")
TP = importlib.import_module("recipes._topp_core")
EMPTY = -(2**63)


@triton.jit
def _best_kernel(x_ptr, stride, V, T_ptr, seed_ptr, ctr_ptr, p0_ptr, zmax_ptr, lists_ptr,
                 w_ptr, IDB, n_split, chunk, HB: tl.constexpr):
    """Program (row, c): chunk c's C best and mass into lists[row, c] and w[row, c]."""
    pid = tl.program_id(0)
    r = pid // n_split
    c = pid - r * n_split
    lo = c * chunk
    hi = tl.minimum(lo + chunk, V)
    best, w = TP.chunk_best(x_ptr + r.to(tl.int64) * stride, lo, hi, chunk // HB,
                            tl.load(T_ptr + r), tl.load(seed_ptr + r),
                            tl.load(ctr_ptr + r).to(tl.uint32), tl.load(p0_ptr + r), IDB,
                            tl.load(zmax_ptr + r), HB)
    tl.store(lists_ptr + pid * TP.C + tl.arange(0, TP.C), best)
    tl.store(w_ptr + pid, w)


@triton.jit
def _merge_kernel(lists_ptr, out_ptr, n_split):
    r = tl.program_id(0)
    best = TP.merge_best(lists_ptr + r * n_split * TP.C, n_split)
    tl.store(out_ptr + r * TP.C + tl.arange(0, TP.C), best)


def packed_keys(z, IDB):
    """pk of every id (`_controls_core.packed_key`), int64 [R, V]."""
    ids = torch.arange(z.shape[1], device=z.device)
    return (CC._order_key(z) << IDB) | ((1 << IDB) - 1 - ids)


def torch_best(x, T, seeds, ctrs, P0, IDB):
    """The C best finite exact scores among pk >= P0, packed as the kernel packs them."""
    z = x.float() / T[:, None]
    s = GC.scores(x, T, seeds, ctrs)
    ids = torch.arange(x.shape[1], device=x.device)
    packed = (CC._order_key(s) << 32) | (0x7FFFFFFF - ids)
    keep = (packed_keys(z, IDB) >= P0[:, None]) & (s > float("-inf"))
    packed = torch.where(keep, packed, torch.full_like(packed, EMPTY))
    return torch.sort(packed, dim=1, descending=True).values[:, :TP.C.value]


def rows(V, device):
    """(x, T, P0) of rows that stress the lane search: flat (every score is noise),
    ties, a masked vocabulary, a peak, few kept ids, and temperatures outside the
    filtered scan's gate."""
    g = torch.Generator().manual_seed(3)
    n = torch.randn(V, generator=g)
    masked = torch.full((V,), float("-inf"))
    masked[torch.randint(0, V, (V // 50,), generator=g)] = n[: V // 50]
    xs = [n, n * 8, torch.zeros(V), torch.round(n * 2) / 2, masked,
          torch.where(torch.arange(V) == V - 3, 30.0, n), n, n * 3, n]
    T = [0.7, 1.0, 0.5, 1.3, 0.9, 1.0, 5e-31, 1e30, 0.7]
    x = torch.stack(xs).to(torch.bfloat16).to(device)
    T = torch.tensor(T, device=device)
    IDB = CC.id_bits(V)
    pk = packed_keys(x.float() / T[:, None], IDB)
    P0 = torch.full((len(xs),), EMPTY, dtype=torch.int64, device=device)
    top = torch.sort(pk, dim=1, descending=True).values
    P0[1] = top[1, V // 10]                   # a min_p-like cut inside the row
    P0[8] = top[8, 2]                         # three kept ids: fewer than C
    return x, T, P0, IDB


SHAPES = [(3000, 3, 256)]
if ON_GPU:
    SHAPES += [(40000, 8, 1024), (151936, 19, 2048)]


@pytest.mark.parametrize("V,n_split,HB", SHAPES)
def test_chunk_best_is_torch_top_c(device, V, n_split, HB):
    x, T, P0, IDB = rows(V, device)
    R = x.shape[0]
    seeds = torch.arange(R, device=device) * 7919 - 3
    ctrs = torch.arange(R, device=device) + 11
    z = x.float() / T[:, None]
    zmax = z.max(1).values
    chunk = triton.cdiv(triton.cdiv(V, n_split), HB) * HB
    n = triton.cdiv(V, chunk)
    lists = torch.empty(R * n * TP.C.value, dtype=torch.int64, device=device)
    w = torch.empty(R * n, dtype=torch.int64, device=device)
    _best_kernel[(R * n,)](x, x.stride(0), V, T, seeds, ctrs, P0, zmax, lists, w, IDB, n,
                           chunk, HB=HB, num_warps=4)
    got = torch.empty(R, TP.C.value, dtype=torch.int64, device=device)
    _merge_kernel[(R,)](lists, got, n)
    assert (lists == EMPTY).all()             # merge_best puts the lists back to rest
    want = torch_best(x, T, seeds, ctrs, P0, IDB)
    # the same ids; the scores within the spec's near-tie (the log, numpy's or the
    # GPU's, may differ from torch's by an ulp)
    assert_equal(got & 0xFFFFFFFF, want & 0xFFFFFFFF)
    assert ((got >> 32) - (want >> 32)).abs().max() <= 8


def test_check_decides_or_falls_through(device):
    """Rows the check decides (top_p 0.9 over peaked and normal rows) and rows none of
    whose C best is kept (a tiny top_p over flat rows), with min_p and a masked
    vocabulary, in one call: the reference's tokens, the same bits with every config."""
    B, K, V = 6, 1, 2500
    g = torch.Generator().manual_seed(8)
    x = torch.randn(B * (K + 1), V, generator=g)
    x[2:4] = torch.randn(2, V, generator=g) * 0.01               # nearly flat
    x[6:8, V // 5:] = float("-inf")                              # masked vocabulary
    x[8:10, 17] = 12.0                                           # peaked
    x = x.to(torch.bfloat16).to(device)
    kw = {"temperature": torch.full((B,), 0.8, device=device),
          "seeds": torch.arange(B, device=device) + 5,
          "positions": torch.arange(B, device=device) * 3}
    d = torch.randint(0, V, (B, K), generator=g).to(device)
    c = ctl(device, top_p=[0.9, 1e-3, 0.95, 0.9, 0.5, 0.999], min_p=[0.0, 0.0, 0.0, 0.2, 0.0, 0.01])
    run(x, d, {**kw, **c}, cfgs=(*CFGS, {**SMALL, "SPLIT": 2}))
