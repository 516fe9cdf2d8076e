"""top_p by the row's best-scoring ids: the sampled token without finding P first.

For a sampled row with top_p (top_k off) the token is the best exact score (argmax
rules) among the kept ids pk >= P, P `threshold_in`'s: the largest t with
mass(pk >= t) >= p * W, W = mass(pk >= P0) (P0: min_p's cut). Packed keys are unique, so
for an id c with pk_c >= P0

    pk_c >= P   <=>   mass(pk > pk_c) < p * W        (both as float64, as threshold_in)

and the token is the first of the row's best-scoring ids (among pk >= P0) whose mass
above is below the target: with the row's C best, one pass of C masked masses decides
it. None of them is kept with probability about (1 - p)^C (the C best are a sample of
the row without replacement); such a row falls through to the threshold search.

* `chunk_best`: a chunk's C best exact scores among pk >= P0 with a finite score (an id
  scoring -inf is the token only where every kept id does, and then no candidate is kept)
  and its mass of pk >= P0. Filtered bounds (`_gumbel_core`) per lane, then lanes in
  bound order are scored exactly until the next lane's bound is below the C-th score
  found; where the bounds cannot be used, or more than MAXL lanes would be scored, the
  same with exact lane maxima (which stops after at most C + 1 lanes).
* `merge_best`: the row's C best, from its chunks' lists (the C best of a union of
  per-chunk C best are the union's C best).
* `masses_above`: a chunk's mass of ids above each candidate's pk.
Masses are `_controls_core.mass` integers, so the token does not depend on the config.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _controls_core as CC
from . import _gumbel_core as GC
from ._argmax_core import PACKED_EMPTY, pack, unpack_index, unpack_value
from ._controls_core import mass, packed_key

C = tl.constexpr(4)        # candidates a row (a sampled row misses all four ~(1 - p)^4)
MAXL = tl.constexpr(16)    # lanes a chunk's filtered search may score before the exact one
GM = tl.constexpr(32)      # chunk lists merged at a time


@triton.jit
def _top_of(run, blk, NB: tl.constexpr):
    """The C largest of run (C, descending) and blk (NB), descending (PACKED_EMPTY
    where there are fewer): packed values are unique, so each is taken out once."""
    out = tl.full([C], PACKED_EMPTY, tl.int64)
    i = tl.arange(0, C)
    for c in tl.static_range(C):
        m = tl.maximum(tl.max(run, 0), tl.max(blk, 0))
        out = tl.where(i == c, m, out)
        run = tl.where(run == m, PACKED_EMPTY, run)
        blk = tl.where(blk == m, PACKED_EMPTY, blk)
    return out


@triton.jit
def _lane_best(run, row_ptr, lo, hi, n_tiles, lane, T, seed, ctr, P0, IDB,
               BLOCK: tl.constexpr, R: tl.constexpr):
    """run with the finite exact scores of the kept ids of one lane of a chunk
    (lo + t * BLOCK + lane, t < n_tiles) folded in."""
    for t0 in range(0, n_tiles, R):
        ids, live, s = CC.lane_scores(row_ptr, lo, hi, n_tiles, lane, t0, T, seed, ctr, P0,
                                      IDB, BLOCK, R)
        live = live & (s > float("-inf"))
        run = _top_of(run, tl.where(live, pack(s, ids), PACKED_EMPTY), R)
    return run


@triton.jit
def _best_by_lanes(row_ptr, lo, hi, n_tiles, T, c, seed, ctr, P0, IDB, zmax, filt,
                   BLOCK: tl.constexpr):
    """(C best, mass of pk >= P0, ok) of a chunk: lane maxima of the filtered bound
    (filt) or of the exact score, then lanes in that order scored exactly until the next
    lane's bound is below the C-th score found (ok = 0: more than MAXL lanes, or a bound
    that is NaN or +inf)."""
    G: tl.constexpr = BLOCK // 4
    lanes = GC.tile_lanes(G)
    b1 = tl.full([G, 4], float("-inf"), tl.float32)
    wacc = tl.zeros([G], tl.int64)         # the 4 of a Philox call sit in one thread
    for t in range(0, n_tiles):
        base = lo + t * BLOCK
        ids, x, z, keep = CC.tile_keys(row_ptr, base, lanes, hi, T, P0, IDB)
        wacc += tl.sum(tl.where(keep, mass(z, zmax), 0), 1)
        bits = GC.philox_tile(seed, ctr, base // 4, G)
        if filt:
            a = x * c - GC.approx_log2_w(bits)
        else:
            a = GC.exact_scores(x, T, bits)
        b1 = tl.maximum(b1, tl.where(keep, a, float("-inf")),
                        propagate_nan=tl.PropagateNan.ALL)
    b1 = tl.reshape(b1, [BLOCK])
    if filt:
        b1 = GC.score_bound(b1, 1.0)
    pu = pack(b1, tl.reshape(lanes, [BLOCK]))      # lanes by bound (ties: lower lane)
    run = tl.full([C], PACKED_EMPTY, tl.int64)
    ok = unpack_value(tl.max(pu, 0)) < float("inf")  # NaN: not ok
    if ok:
        done = tl.zeros([], tl.int32)
        for _ in range(0, MAXL):
            if done == 0:
                top = tl.max(pu, 0)
                pu = tl.where(pu == top, PACKED_EMPTY, pu)
                u = unpack_value(top)
                cth = tl.min(run, 0)
                if u == float("-inf"):                  # no lane left with a finite score
                    done += 1
                elif (cth != PACKED_EMPTY) & (u < unpack_value(cth)):
                    done += 1
                else:
                    run = _lane_best(run, row_ptr, lo, hi, n_tiles, unpack_index(top), T,
                                     seed, ctr, P0, IDB, BLOCK, 32)
        ok = done != 0
    return run, tl.sum(wacc, 0), ok


@triton.jit
def chunk_best(row_ptr, lo, hi, n_tiles, T, seed, ctr, P0, IDB, zmax, BLOCK: tl.constexpr):
    """(C best finite exact scores among the ids of [lo, hi) with pk >= P0, packed and
    descending; their mass sum as `mass` integers) of a chunk of n_tiles tiles."""
    c = tl.math.div_rn(tl.full([], GC.LOG2E, tl.float32), T)
    filt = (c > GC.GATE_LO) & (c < GC.GATE_HI)
    run, w, ok = _best_by_lanes(row_ptr, lo, hi, n_tiles, T, c, seed, ctr, P0, IDB, zmax,
                                filt, BLOCK)
    if ok == 0:
        run, w, ok = _best_by_lanes(row_ptr, lo, hi, n_tiles, T, c, seed, ctr, P0, IDB,
                                    zmax, False, BLOCK)
    return run, w


@triton.jit
def merge_best(slot_ptr, n_chunks):
    """The C best of the chunks' lists slot[0 : n_chunks * C] (read and put back to rest
    at PACKED_EMPTY), descending."""
    j = tl.arange(0, GM * C)
    run = tl.full([C], PACKED_EMPTY, tl.int64)
    for g0 in range(0, n_chunks, GM):
        live = g0 * C + j < n_chunks * C
        got = tl.atomic_xchg(slot_ptr + g0 * C + j, tl.full([GM * C], PACKED_EMPTY, tl.int64),
                             mask=live, sem="relaxed")
        run = _top_of(run, tl.where(live, got, PACKED_EMPTY), GM * C)
    return run


@triton.jit
def candidate_keys(best, row_ptr, T, IDB):
    """pk of the candidates `best` (PACKED_EMPTY where there is none)."""
    ids = unpack_index(best)
    valid = best != PACKED_EMPTY
    x = tl.load(row_ptr + ids, mask=valid, other=0.0).to(tl.float32)
    pk = packed_key(tl.math.div_rn(x, T), ids, IDB)
    return tl.where(valid, pk, PACKED_EMPTY)


@triton.jit
def masses_above(row_ptr, lo, hi, T, zmax, IDB, pks, LB: tl.constexpr):
    """Mass of the ids of [lo, hi) with pk above each of pks (C), as `mass` integers."""
    acc = tl.zeros([C, LB], tl.int64)
    pb = tl.broadcast_to(pks[:, None], [C, LB])
    for base in range(lo, hi, LB):
        ids = base + tl.arange(0, LB)
        live = ids < hi
        z = tl.math.div_rn(tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32), T)
        pk = tl.where(live, packed_key(z, ids, IDB), PACKED_EMPTY)
        w = tl.broadcast_to(mass(z, zmax)[None, :], [C, LB])
        above = tl.broadcast_to(pk[None, :], [C, LB]) > pb
        acc += tl.where(above, w, 0)
    return tl.sum(acc, 1)
