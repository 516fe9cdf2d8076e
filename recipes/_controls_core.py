"""Sampling controls of chain_verify (top-k, top-p, min-p): the kept set S of a row.

With z_v = float32(logit_v) / T and the row order (z descending, id ascending), every
filter keeps a prefix of the order (min_p: z_v - z_max >= log(min_p) is monotone in z;
top_k: the first k; top_p: the shortest prefix whose mass reaches top_p * W), so S is
{v : pk_v >= P} for one packed key per row,

    pk_v = key(z_v) << IDB | (2^IDB - 1 - v),   IDB = bits of V - 1,

key the argmax order key of `_argmax_core.pack`. Masses are w_v = exp(d_v) with
d_v = z_v - z_max (0 for ids tied with z_max, so +-inf maxima stay finite), summed in
integer fixed point (w * 2^40, V < 2^23): the sums do not depend on the order of addition,
so P does not depend on the launch configuration. A row with a NaN z keeps its first NaN
id (it wins anyway). Greedy rows and rows with every control off get no threshold
(PACKED_EMPTY) and are scanned as without controls.

Two ways to the kept set, the same set (the same masses and comparisons):

* candidates (top_k on and at most CAP, whatever the other controls): S lies within
  the row's CAP largest pk. Each chunk finds its CAP largest (`chunk_top_packed`: a
  lane-max pass, then the ids at or above the CAP-th lane max compacted and sorted),
  the row's last chunk merges the lists, applies min_p, top_k and top_p to the sorted
  CAP and scores only the kept ids exactly (`candidates_packed`). No threshold pass.
* threshold (any other control on): P is `threshold_in`'s, which defines it: a binary
  search over z keys for the min_p cut (no pass), then bisections over packed keys with
  masked counts (top_k) and masses (top_p), a pass over the row each. chain_verify
  finds that P with all of the row's programs (`_threshold_core`: its pk range, then
  levels of exact counts and masses and a sorted compaction of the boundary's ids);
  the sampled scan then keeps only ids with pk >= P (`restricted_filtered_packed`,
  `restricted_chunk_packed` with EXACT). `row_threshold` runs `threshold_in` in one
  program (exact but a pass a step), for kernels of their own (the vLLM adapters'
  ragged verify).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _gumbel_core as GC
from ._argmax_core import PACKED_EMPTY, pack, unpack_index, unpack_value

MASS_ONE = tl.constexpr(2.0 ** 40)      # fixed-point scale of a mass w in (0, 1]
SELECT_BLOCK, SELECT_WARPS = 1024, 4    # `row_threshold`'s tile and warps (one program)
CAP = 32        # top_k up to this: the candidate path (the row's CAP largest pk)
SUB = 512       # ids a step of the candidate pass (more: more registers, fewer programs an SM)
NC = 128        # a chunk's compaction slots (ids at or above its lane-max cut)
MN = 256        # the row merge's sort: all lists up to MN entries, else those at the row cut
RS = tl.constexpr(16)   # steps of a chunk's CAP selected lanes compacted at a time
LG = tl.constexpr(128)  # chunk lists whose entries the row cut reads at a time
LOG_CAP = tl.constexpr(CAP.bit_length() - 1)    # the row cut's bounds: j = 1 .. CAP
assert NC * (MN // CAP) >= MN    # `row_top`'s scratch: the row's chunk compaction slots
KEPT_FLOOR = tl.constexpr(3.0e38)   # restricted filtered scan: floor of a kept id's bound


# --- torch: the semantics -------------------------------------------------------------
def _order_key(z: torch.Tensor) -> torch.Tensor:
    b = z.contiguous().view(torch.int32).to(torch.int64)
    k = torch.where(b >= 0, b, -(b & 0x7FFFFFFF))
    return torch.where(torch.isnan(z), torch.full_like(k, 0x7FFFFFFF), k)


def controls_on(top_k, top_p, min_p, V: int, n: int, device) -> torch.Tensor:
    """bool [n]: some control of the row is on (not an off value)."""
    on = torch.zeros(n, dtype=torch.bool, device=device)
    if top_k is not None:
        k = top_k.to(torch.int64)
        on |= (k > 0) & (k < V)
    if top_p is not None:
        on |= top_p.to(torch.float32) < 1       # NaN: off
    if min_p is not None:
        on |= min_p.to(torch.float32) > 0       # NaN: off
    return on


def kept(z: torch.Tensor, top_k, top_p, min_p, slack: float = 0.0) -> torch.Tensor:
    """bool [R, V]: the kept set S of each row of z (float32 [R, V]) under per-row
    controls ([R] or None): min_p, then top_k, then top_p (sums in float64). `slack`
    moves the min_p and top_p thresholds by that relative amount (> 0 keeps more): the
    tests' bounds for the spec's 1e-5 tolerance."""
    R, V = z.shape
    dev = z.device
    zmax = z.max(dim=1, keepdim=True).values
    d = torch.where(z == zmax, torch.zeros_like(z), z - zmax)
    order = torch.sort(-_order_key(z), dim=1, stable=True).indices   # z desc, id asc
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(V, device=dev).expand(R, V))
    n = torch.full((R,), V, dtype=torch.int64, device=dev)
    if min_p is not None:
        mp = min_p.to(torch.float32)
        lmp = torch.log(mp)[:, None]
        keep = (d >= lmp - slack * lmp.abs()) | (z == zmax)
        n = torch.where(mp > 0, keep.sum(1), n)
    if top_k is not None:
        k = top_k.to(torch.int64)
        n = torch.where((k > 0) & (k < V), torch.minimum(n, k), n)
    if top_p is not None:
        p = top_p.to(torch.float32).to(torch.float64)
        w = torch.exp(d.to(torch.float64)).gather(1, order)
        j = torch.arange(V, device=dev)[None, :]
        w = torch.where(j < n[:, None], w, torch.zeros_like(w))
        excl = torch.cumsum(w, 1) - w
        target = (p * w.sum(1))[:, None] * (1 + slack)
        np_ = ((excl < target) & (j < n[:, None])).sum(1).clamp(min=1)
        n = torch.where(p < 1, np_, n)
    S = pos < n[:, None]
    nan_row = torch.isnan(z).any(1, keepdim=True)
    return torch.where(nan_row, torch.isnan(z), S)


def masked_argmax(s: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """argmax over the ids of S of s (torch's argmax rules), int64 [R]."""
    V = s.shape[1]
    idx = torch.arange(V, device=s.device, dtype=torch.int64)[None, :]
    p = _order_key(s) * 2**32 + (0x7FFFFFFF - idx)
    p = torch.where(S, p, torch.full_like(p, -2**63))
    return torch.argmax(p, dim=1)


# --- Triton ---------------------------------------------------------------------------
@triton.jit
def packed_key(z, ids, IDB):
    """pk of ids with sampled logits z (module doc)."""
    return ((pack(z, ids) >> 32) << IDB) | ((1 << IDB) - 1 - ids).to(tl.int64)


@triton.jit
def mass(z, zmax):
    """Fixed-point mass w * 2^40 of sampled logits z (row max zmax)."""
    d = tl.where(z == zmax, 0.0, z - zmax)
    return (tl.exp(d) * MASS_ONE).to(tl.int64)


@triton.jit
def _above(row_ptr, lo, hi, T, zmax, P, IDB, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Count (MASS=False) or fixed-point mass of the ids of [lo, hi) with pk >= P."""
    acc = tl.zeros([BLOCK], tl.int64)
    for base in range(lo, hi, BLOCK):
        ids = base + tl.arange(0, BLOCK)
        live = ids < hi
        z = tl.math.div_rn(tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32), T)
        keep = live & (packed_key(z, ids, IDB) >= P)
        if MASS:
            acc += tl.where(keep, mass(z, zmax), 0)
        else:
            acc += keep.to(tl.int64)
    return tl.sum(acc, 0)


@triton.jit
def load_controls(topk_ptr, topp_ptr, minp_ptr, q, sk, sp, sm, V, ok,
                  HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_M: tl.constexpr):
    """(k, p, mp, on) of the request (or state) at index q (int64): its top_k, top_p and
    min_p (off values where a control is not given, or where `ok` is false) and whether
    any of them is on."""
    k = tl.zeros([], tl.int64)
    p = tl.full([], 1.0, tl.float32)
    mp = tl.zeros([], tl.float32)
    on = False
    if HAS_K:
        k = tl.load(topk_ptr + q * sk, mask=ok, other=0).to(tl.int64)
        on = on | ((k > 0) & (k < V))
    if HAS_P:
        p = tl.load(topp_ptr + q * sp, mask=ok, other=1.0).to(tl.float32)
        on = on | (p < 1.0)
    if HAS_M:
        mp = tl.load(minp_ptr + q * sm, mask=ok, other=0.0).to(tl.float32)
        on = on | (mp > 0.0)
    return k, p, mp, on


@triton.jit
def pk_range(row_ptr, lo, hi, T, IDB, BLOCK: tl.constexpr):
    """(largest, smallest) pk of ids [lo, hi)."""
    hi_pk = tl.full([BLOCK], PACKED_EMPTY, tl.int64)
    lo_pk = tl.full([BLOCK], -PACKED_EMPTY - 1, tl.int64)
    for base in range(lo, hi, BLOCK):
        ids = base + tl.arange(0, BLOCK)
        live = ids < hi
        z = tl.math.div_rn(tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32), T)
        pk = packed_key(z, ids, IDB)
        hi_pk = tl.maximum(hi_pk, tl.where(live, pk, PACKED_EMPTY))
        lo_pk = tl.minimum(lo_pk, tl.where(live, pk, -PACKED_EMPTY - 1))
    return tl.max(hi_pk, 0), tl.min(lo_pk, 0)


@triton.jit
def row_threshold(row_ptr, V, T, k, p, mp, IDB, BLOCK: tl.constexpr):
    """P of a sampled row with controls (k, p, mp), by one program: the row's pk range
    (`pk_range`), then `threshold_in`."""
    pmax, pmin = pk_range(row_ptr, 0, V, T, IDB, BLOCK)
    return threshold_in(row_ptr, V, T, k, p, mp, IDB, pmax, pmin, BLOCK)


@triton.jit
def min_p_cut(pmax, pmin, mp, IDB):
    """The smallest pk the min_p cut keeps (pmin where min_p is off), no pass: a binary
    search over z keys for the smallest with z - z_max >= log(min_p) (or tied with
    z_max)."""
    P = pmin
    zkey = pmax >> IDB
    zmax = unpack_value(zkey << 32)
    if (mp > 0.0) & (zkey != 0x7FFFFFFF):
        lmp = tl.log(mp)
        klo = tl.full([], -0x7F800000, tl.int64)
        khi = zkey
        while khi - klo > 0:
            mid = klo + (khi - klo) // 2
            zm = unpack_value(mid << 32)
            d = tl.where(zm == zmax, 0.0, zm - zmax)
            if (d >= lmp) | (zm == zmax):
                khi = mid
            else:
                klo = mid + 1
        P = tl.maximum(P, khi << IDB)
    return P


@triton.jit
def threshold_in(row_ptr, V, T, k, p, mp, IDB, pmax, pmin, BLOCK: tl.constexpr):
    """P of a sampled row with controls (k, p, mp) whose pk lie in [pmin, pmax]: a
    binary search over z keys for the min_p cut (no pass), then bisections over packed
    keys with masked counts (top_k) and masses (top_p), a pass over the row each."""
    zkey = pmax >> IDB
    zmax = unpack_value(zkey << 32)
    P = min_p_cut(pmax, pmin, mp, IDB)
    if zkey == 0x7FFFFFFF:                     # a NaN row: its first NaN id
        P = pmax
    else:
        if (k > 0) & (k < V):
            # the largest threshold keeping at least k ids: the k-th id's key
            lo_t = P
            hi_t = pmax + 1
            while hi_t - lo_t > 1:
                mid = lo_t + (hi_t - lo_t) // 2
                if _above(row_ptr, 0, V, T, zmax, mid, IDB, False, BLOCK) >= k:
                    lo_t = mid
                else:
                    hi_t = mid
            P = lo_t
        if p <= 0.0:
            P = pmax
        elif p < 1.0:
            W = _above(row_ptr, 0, V, T, zmax, P, IDB, True, BLOCK)
            target = p.to(tl.float64) * W.to(tl.float64)
            lo_t = P
            hi_t = pmax + 1
            while hi_t - lo_t > 1:
                mid = lo_t + (hi_t - lo_t) // 2
                m = _above(row_ptr, 0, V, T, zmax, mid, IDB, True, BLOCK)
                if m.to(tl.float64) >= target:
                    lo_t = mid
                else:
                    hi_t = mid
            P = lo_t
    return P


@triton.jit
def tile_keys(row_ptr, base, lanes, hi, T, P, IDB):
    """(ids, x, z, kept) of the tile of ids base + lanes below hi; kept: pk >= P."""
    ids = base + lanes
    live = ids < hi
    x = tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32)
    z = tl.math.div_rn(x, T)
    return ids, x, z, live & (packed_key(z, ids, IDB) >= P)


@triton.jit
def restricted_chunk_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, P, IDB,
                            BLOCK: tl.constexpr):
    """Packed argmax of the exact sampled scores over the ids of [lo, hi) with
    pk >= P (`GC.exact_scores`: the reference's rounding)."""
    G: tl.constexpr = BLOCK // 4
    lanes = GC.tile_lanes(G)
    best = tl.full([G, 4], PACKED_EMPTY, tl.int64)
    for t in range(0, n_tiles):
        base = lo + t * BLOCK
        ids, x, z, keep = tile_keys(row_ptr, base, lanes, hi, T, P, IDB)
        s = GC.exact_scores(x, T, GC.philox_tile(seed, ctr, base // 4, G))
        best = tl.maximum(best, tl.where(keep, pack(s, ids), PACKED_EMPTY))
    return tl.max(tl.reshape(best, [BLOCK]), 0)


@triton.jit
def lane_scores(row_ptr, lo, hi, n_tiles, lane, t0, T, seed, ctr, P, IDB,
                BLOCK: tl.constexpr, R: tl.constexpr):
    """(ids, kept, exact scores) of tiles t0 .. t0 + R - 1 of one lane of a chunk
    (ids lo + t * BLOCK + lane, t < n_tiles); kept: pk >= P."""
    tt = t0 + tl.arange(0, R)
    ids = lo + tt * BLOCK + lane
    live = (tt < n_tiles) & (ids < hi)
    x = tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32)
    live = live & (packed_key(tl.math.div_rn(x, T), ids, IDB) >= P)
    r0, r1, r2, r3 = GC.philox(seed, (ids // 4).to(tl.uint32), ctr)
    k = lane % 4
    r = tl.where(k == 0, r0, tl.where(k == 1, r1, tl.where(k == 2, r2, r3)))
    return ids, live, GC.exact_scores(x, T, r)


@triton.jit
def _restricted_lane_packed(row_ptr, lo, hi, n_tiles, lane, T, seed, ctr, P, IDB,
                            BLOCK: tl.constexpr, R: tl.constexpr):
    """Packed argmax of the exact scores of the ids of one lane of a chunk
    (lo + t * BLOCK + lane, t < n_tiles, R at a time) with pk >= P."""
    best = tl.full([], PACKED_EMPTY, tl.int64)
    for t0 in range(0, n_tiles, R):
        ids, live, s = lane_scores(row_ptr, lo, hi, n_tiles, lane, t0, T, seed, ctr, P, IDB,
                                   BLOCK, R)
        best = tl.maximum(best, tl.max(tl.where(live, pack(s, ids), PACKED_EMPTY), 0))
    return best


@triton.jit
def restricted_filtered_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, P, IDB,
                               BLOCK: tl.constexpr, MAXC: tl.constexpr):
    """`restricted_chunk_packed`'s answer by the filtered scan of `_gumbel_core`
    (`_filter_chunk`), the ids with pk < P given the bound -inf: pass 1 keeps each
    lane's max upper bound over the kept ids, the top lane is scored exactly over its
    kept ids (A, a kept id's exact score), then every other lane whose bound reaches A
    (at most MAXC). A chunk with no kept id answers PACKED_EMPTY. Handed to the exact
    restricted scan: log2(e) / T outside the gate, a NaN or infinite bound, |A| beyond
    FAR (kept ids whose logits are all -inf come here too), more than MAXC lanes."""
    c = tl.math.div_rn(tl.full([], GC.LOG2E, tl.float32), T)
    packed = tl.full([], PACKED_EMPTY, tl.int64)
    good = tl.zeros([], tl.int32)
    if (c > GC.GATE_LO) & (c < GC.GATE_HI):
        G: tl.constexpr = BLOCK // 4
        lanes = GC.tile_lanes(G)
        b1 = tl.full([G, 4], float("-inf"), tl.float32)
        for t in range(0, n_tiles):
            base = lo + t * BLOCK
            ids = base + lanes
            live = ids < hi
            x = tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32)
            keep = live & (packed_key(tl.math.div_rn(x, T), ids, IDB) >= P)
            a = x * c - GC.approx_log2_w(GC.philox_tile(seed, ctr, base // 4, G))
            # a kept id's bound is at least -KEPT_FLOOR (raising a bound keeps it one), so
            # a lane max of -inf means the lane keeps nothing; NaN propagates
            a = tl.maximum(a, -KEPT_FLOOR, propagate_nan=tl.PropagateNan.ALL)
            b1 = tl.maximum(b1, tl.where(keep, a, float("-inf")),
                            propagate_nan=tl.PropagateNan.ALL)
        b1 = tl.reshape(b1, [BLOCK])
        lanes = tl.reshape(lanes, [BLOCK])
        top_packed = tl.max(pack(b1, lanes), 0)
        bmax = unpack_value(top_packed)
        if bmax == float("-inf"):
            good = tl.full([], 1, tl.int32)         # no kept id: PACKED_EMPTY
        elif (bmax > -GC.FAR) & (bmax < GC.FAR):
            top = unpack_index(top_packed)
            packed = _restricted_lane_packed(row_ptr, lo, hi, n_tiles, top, T, seed, ctr, P,
                                             IDB, BLOCK, 32)
            A = unpack_value(packed)
            cand = (GC.score_bound(b1, 1.0) >= A) & (lanes != top)
            n = tl.sum(cand.to(tl.int32), 0)
            if (n <= MAXC) & (A > -GC.FAR) & (A < GC.FAR):
                good = tl.full([], 1, tl.int32)
                cl = tl.where(cand, lanes, 0x7FFFFFFF)
                for _ in range(0, n):
                    lane = tl.min(cl, 0)
                    cl = tl.where(cl == lane, 0x7FFFFFFF, cl)
                    packed = tl.maximum(packed, _restricted_lane_packed(
                        row_ptr, lo, hi, n_tiles, lane, T, seed, ctr, P, IDB, BLOCK, 32))
    if good == 0:
        packed = restricted_chunk_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, P, IDB,
                                         BLOCK)
    return packed


@triton.jit
def small_k(k, V, CAPK: tl.constexpr):
    """top_k is on and at most CAPK: the row's kept set lies within its CAPK largest pk."""
    return (k > 0) & (k < V) & (k <= CAPK)


@triton.jit
def _step_load(row_ptr, base, hi, SUBN: tl.constexpr):
    ids = base + tl.arange(0, SUBN)
    return tl.load(row_ptr + ids, mask=ids < hi, other=0.0)


@triton.jit
def _step_pk(x, base, hi, T, IDB, SUBN: tl.constexpr):
    """pk of ids base .. base + SUBN - 1 with logits x (PACKED_EMPTY from hi on)."""
    ids = base + tl.arange(0, SUBN)
    pk = packed_key(tl.math.div_rn(x.to(tl.float32), T), ids, IDB)
    return tl.where(ids < hi, pk, PACKED_EMPTY)


@triton.jit
def _keep_append(pk, keep, n, buf_ptr, NCN: tl.constexpr):
    """Append the kept pk (1-D) to buf after its n first; return the new count (the
    stores beyond NCN are dropped, the count is not)."""
    at = n + tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.store(buf_ptr + at, pk, mask=keep & (at < NCN))
    return n + tl.sum(keep.to(tl.int32), 0)


@triton.jit
def _compact(row_ptr, lo, hi, T, IDB, t, top, buf_ptr, SUBN: tl.constexpr,
             NCN: tl.constexpr, CAPK: tl.constexpr):
    """Store the pk >= t of ids [lo, hi) into buf[0:NCN] (the first NCN found); return
    how many there are. Only the lanes of `top` are read (the CAPK largest lane maxima,
    t the smallest of them at most: no other lane holds an id at or above t), RS steps
    of each at a time."""
    lane = (((1 << IDB) - 1 - (top & ((1 << IDB) - 1)) - lo) % SUBN).to(tl.int32)
    valid = top != PACKED_EMPTY
    n = tl.zeros([], tl.int32)
    for s0 in range(0, tl.cdiv(hi - lo, SUBN), RS):
        ids = lo + (s0 + tl.arange(0, RS))[None, :] * SUBN + lane[:, None]
        live = valid[:, None] & (ids < hi)
        z = tl.math.div_rn(tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32), T)
        pk = packed_key(z, ids, IDB)
        keep = live & (pk >= t)
        n = _keep_append(tl.reshape(pk, [CAPK * RS]), tl.reshape(keep, [CAPK * RS]), n,
                         buf_ptr, NCN)
    return n


@triton.jit
def chunk_top_packed(row_ptr, lo, hi, T, IDB, buf_ptr, CAPK: tl.constexpr,
                     SUBN: tl.constexpr, NCN: tl.constexpr):
    """The CAPK largest pk of ids [lo, hi), descending (PACKED_EMPTY where the chunk has
    fewer). One pass keeps each lane's max (lane: position in a SUBN-id step); the
    CAPK-th largest lane max t has CAPK ids at or above it, so the chunk's CAPK largest
    are among the ids with pk >= t, which lie in the CAPK lanes of those maxima: a
    second pass over these lanes alone (L1/L2-resident) stores them into buf[0:NCN]
    (scratch resting at PACKED_EMPTY, left at rest), and a sort of them picks the CAPK
    largest. Where more than NCN ids reach t (many of the largest in
    few lanes), bisection over counts finds the CAPK-th largest pk exactly first."""
    lm = tl.full([SUBN], PACKED_EMPTY, tl.int64)
    xn = _step_load(row_ptr, lo, hi, SUBN)
    for base in range(lo, hi, SUBN):
        x = xn
        xn = _step_load(row_ptr, base + SUBN, hi, SUBN)    # in flight during this step
        lm = tl.maximum(lm, _step_pk(x, base, hi, T, IDB, SUBN))
    top = tl.topk(lm, CAPK)
    t = tl.min(top, 0)
    n = _compact(row_ptr, lo, hi, T, IDB, t, top, buf_ptr, SUBN, NCN, CAPK)
    used = tl.minimum(n, NCN)
    if n > NCN:
        lo_t = t
        hi_t = tl.max(lm, 0) + 1
        while hi_t - lo_t > 1:
            mid = lo_t + (hi_t - lo_t) // 2
            if _above(row_ptr, lo, hi, T, 0.0, mid, IDB, False, SUBN) >= CAPK:
                lo_t = mid
            else:
                hi_t = mid
        n = _compact(row_ptr, lo, hi, T, IDB, lo_t, top, buf_ptr, SUBN, NCN, CAPK)  # CAPK
    tl.debug_barrier()                 # every thread's stores before the read-back
    j = tl.arange(0, NCN)
    c = tl.atomic_xchg(buf_ptr + j, tl.full([NCN], PACKED_EMPTY, tl.int64), mask=j < used,
                       sem="relaxed")
    return tl.topk(tl.where(j < n, c, PACKED_EMPTY), CAPK)


@triton.jit
def _row_cut(cand_ptr, n_chunks, CAPK: tl.constexpr):
    """A lower bound of the row's CAPK-th largest pk from its chunks' lists
    (cand[0:n_chunks*CAPK], each descending): for j = 1, 2, 4, .., CAPK, the (CAPK/j)-th
    largest of the lists' j-th entries, which CAPK/j lists hold j entries at or above
    each, so CAPK ids reach it; the largest of these bounds. Each j bounds how many
    lists hold j entries at or above the cut (at most CAPK/j), so at most
    CAPK * log2(CAPK) + 1 entries reach it (161 for CAPK = 32)."""
    cut = tl.full([], PACKED_EMPTY, tl.int64)
    for g0 in range(0, n_chunks, LG):
        jj = g0 + tl.arange(0, LG)
        for e in tl.static_range(LOG_CAP + 1):
            col = tl.load(cand_ptr + jj * CAPK + (1 << e) - 1, mask=jj < n_chunks,
                          other=PACKED_EMPTY, cache_modifier=".cg")
            if e == LOG_CAP:
                b = tl.max(col, 0)
            else:
                b = tl.min(tl.topk(col, CAPK >> e), 0)
            cut = tl.maximum(cut, b)
    return cut


@triton.jit
def row_top(cand_ptr, n_chunks, buf_ptr, CAPK: tl.constexpr, MN: tl.constexpr):
    """The CAPK largest of the chunks' lists cand[0:n_chunks*CAPK] (each descending;
    put back to rest at PACKED_EMPTY), descending. Up to MN entries in all: one sort of
    them. More: the entries at or above `_row_cut` (at most 161 <= MN: the row's CAPK
    largest among them) go to buf[0:MN] (scratch resting at PACKED_EMPTY, left at
    rest), and one sort of those. buf is read only then, when the row has more than
    MN / CAPK chunks: their compaction slots (NC each) hold MN."""
    j = tl.arange(0, MN)
    total = n_chunks * CAPK
    if total <= MN:
        c = tl.topk(tl.load(cand_ptr + j, mask=j < total, other=PACKED_EMPTY,
                            cache_modifier=".cg"), CAPK)
    else:
        cut = _row_cut(cand_ptr, n_chunks, CAPK)
        n = tl.zeros([], tl.int32)
        for g0 in range(0, total, MN):
            got = tl.load(cand_ptr + g0 + j, mask=g0 + j < total, other=PACKED_EMPTY,
                          cache_modifier=".cg")
            n = _keep_append(got, (got >= cut) & (got != PACKED_EMPTY), n, buf_ptr, MN)
        tl.debug_barrier()             # every thread's stores before the read-back
        b = tl.atomic_xchg(buf_ptr + j, tl.full([MN], PACKED_EMPTY, tl.int64), mask=j < n,
                           sem="relaxed")
        c = tl.topk(tl.where(j < n, b, PACKED_EMPTY), CAPK)
    for g0 in range(0, total, MN):
        tl.store(cand_ptr + g0 + j, tl.full([MN], PACKED_EMPTY, tl.int64), mask=g0 + j < total)
    return c


@triton.jit
def candidates_packed(cand_ptr, n_chunks, row_ptr, T, seed, ctr, k, p, mp, IDB, buf_ptr,
                      HAS_P: tl.constexpr, HAS_M: tl.constexpr, CAPK: tl.constexpr,
                      MN: tl.constexpr):
    """The sampled token of a row whose top_k (k) is at most CAPK, as a packed exact
    score: the row's CAPK largest pk are the largest of its chunks' lists
    (cand[0:n_chunks*CAPK], read and put back to rest; `row_top`, buf: MN scratch
    slots at rest); min_p, top_k and top_p are then applied to that sorted list
    as `row_threshold` applies them to the row (the same masses and comparisons, so the
    same kept set), and only the kept ids are scored."""
    c = row_top(cand_ptr, n_chunks, buf_ptr, CAPK, MN)
    i = tl.arange(0, CAPK)
    valid = c != PACKED_EMPTY
    zkey = tl.max(c, 0) >> IDB
    zmax = unpack_value(zkey << 32)
    z = unpack_value((c >> IDB) << 32)
    n = k
    if HAS_M:
        if mp > 0.0:
            d = tl.where(z == zmax, 0.0, z - zmax)
            keep = valid & ((d >= tl.log(mp)) | (z == zmax))
            n = tl.minimum(n, tl.sum(keep.to(tl.int64), 0))
    if HAS_P:
        if p <= 0.0:
            n = tl.full([], 1, tl.int64)
        elif p < 1.0:
            w = tl.where(i < n, mass(z, zmax), 0)
            target = p.to(tl.float64) * tl.sum(w, 0).to(tl.float64)
            excl = tl.cumsum(w, 0) - w
            n = tl.maximum(tl.sum(((excl.to(tl.float64) < target) & (i < n)).to(tl.int64),
                                  0), 1)
    if zkey == 0x7FFFFFFF:             # a NaN row: its first NaN id
        n = tl.full([], 1, tl.int64)
    ids = ((1 << IDB) - 1 - (c & ((1 << IDB) - 1))).to(tl.int32)
    kept = (i < n) & valid
    x = tl.load(row_ptr + ids, mask=kept, other=0.0).to(tl.float32)
    r0, r1, r2, r3 = GC.philox(seed, (ids // 4).to(tl.uint32), ctr)
    q = ids % 4
    r = tl.where(q == 0, r0, tl.where(q == 1, r1, tl.where(q == 2, r2, r3)))
    s = GC.exact_scores(x, T, r)
    return tl.max(tl.where(kept, pack(s, ids), PACKED_EMPTY), 0)


def id_bits(V: int) -> int:
    return max(1, (V - 1).bit_length())


def control_args(controls, like) -> tuple:
    """The kernel arguments of (top_k, top_p, min_p), each a tensor or None: the three
    tensors (`like` for a missing one: never read), their three strides, and the
    constexprs HAS_K/HAS_P/HAS_M as a dict."""
    ts = [t if t is not None else like for t in controls]
    strides = [t.stride(0) if t is not None else 0 for t in controls]
    flags = {f"HAS_{c}": t is not None for c, t in zip("KPM", controls, strict=True)}
    return ts, strides, flags
