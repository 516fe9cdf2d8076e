"""Gumbel-max sampling over a vocabulary, on Triton's Philox stream, exact to plain torch.

The score of vocabulary id v in a row with temperature T > 0, seed and counter c is

    s_v = float32(logit_v) / T + g_v,     g_v = -log(-log(u_v))     (float32 throughout)
    u_v = uniform(x_(v & 3)),  (x0, x1, x2, x3) = Philox4x32-10(counter=(v >> 2, c, 0, 0),
                                                                key=(lo32(seed), hi32(seed)))
    uniform(x): i = int32(x); if i < 0: i = -i - 1; u = float32(i) * 4.6566127342e-10

and the sampled token is argmax_v s_v with torch's argmax rules. `uniform` is Triton's
`uint_to_uniform_float`, so u_v is component v & 3 of `tl.rand4x(seed, (c << 32) + (v >> 2))`.
The scale rounds to float32 0x1.fffffep-32 = 2^-31 (1 - 2^-24): u lies in {0} and
[4.66e-10, 1 - 2^-24], so g lies in {-inf} and [-3.08, 16.64] (g = -inf for raw 0 and
0xFFFFFFFF).

Torch side (the semantics): `philox4x32_10` in int64 arithmetic (32x32-bit products split
in 16-bit halves, so nothing overflows), `uniform`, `stream_bits`, `scores`.

Triton side: `philox` is Triton's philox_impl round for round, with each product's hi/lo
pair from one wide multiply (IMAD.WIDE.U32); one call gives 4 ids (counter v >> 2), and
`philox_tile` lays a tile out as [BLOCK/4, 4] (the four outputs in one thread's registers,
next to a [BLOCK/4, 4] logits tile: no layout conversion).

Two ways to scan a chunk of a row, same answer (`sampled_chunk_packed`):

* exact (`_exact_chunk_packed`, EXACT=1 and the fallback): every id's score as the
  reference computes it (IEEE division `div_rn`; the accurate log: libdevice `__nv_logf`,
  max 1 ulp, on the GPU - not tl.log - and numpy's float32 log under the interpreter),
  folded with the argmax rules. The log is the only place the GPU and torch may differ
  (by an ulp): the spec's near-tie rule.
* filtered (`_filter_chunk`): pass 1 computes for every id an upper bound of its score
  (log2 units, c = log2(e) / T)
      a = x * c - lg2(w),   w = -lg2(u~)   (w = (1 - u~) log2(e) when 1 - u~ < 2^-11.5)
  with lg2 = `lg2.approx.f32` (one MUFU.LG2; absolute error 2^-22 on [0.5, 2], 2 ulp
  elsewhere) and u~ = |float32(int32(x))| * scale >= u (the fold skipped: g grows with
  u, so this only raises the bound). In natural units sa = a ln2 - ln(ln2) and
  s <= sa + EPS |sa| + EABS for every id (EPS = 2^-16 against ~2^-21 of rounding;
  EABS = 2^-7 against <= 5e-4 of lg2.approx error, reached just below the series branch;
  the series branch itself is within ln(1 + 2^-11.5)). Each lane keeps only the max of a.
  Then the lane with the largest max is scored exactly, id by id; its best exact score A
  is a lower bound of the chunk's exact maximum s*. The winner's lane has a max whose
  upper bound reaches s* >= A, so only lanes whose upper bound reaches A can hold it:
  those (at most MAXC more, usually none) are scored exactly too, and all are folded with
  the argmax rules (an id tying s* also lies in such a lane). The bound is only ever used
  as an upper bound; a wrong bound could only lose the winner, and the tests plant
  winners outside the top lane to catch that (`test_winner_outside_the_top_lane`).
  Handed to the exact scan: a NaN or +inf anywhere in pass 1 (NaN/inf logits, overflow),
  |A| >= 2^120, more than MAXC candidate lanes, and rows whose log2(e) / T is outside
  (2^-100, 2^100) (from the start). A chunk whose upper bounds are all -inf is checked to
  be all -inf logits (then every score is -inf: answer (-inf, lo)) before falling back.

Ids and offsets are the same numbers here: row_ptr + v holds the logit of id v, and a
chunk's `lo` is a multiple of 4 (one Philox call covers ids 4g .. 4g+3). A vocabulary
shard whose first id s is not a multiple of 4 (`recipes.tp`) passes a row pointer shifted
by -s, `lo` rounded down to a multiple of 4 and `live_lo = s`: ids below live_lo are
masked like ids past hi (never loaded, scored -inf). Without live_lo (None) that mask is
not compiled in.

What each way costs per id, and the floor that sets: docs/performance.md, section "The
filtered Gumbel scan".
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common as C
from ._argmax_core import (
    PACKED_EMPTY,
    chunk_argmax_packed,
    lane_update,
    pack,
    unpack_index,
    unpack_value,
)

SCALE = 4.6566127342e-10        # Triton's uint_to_uniform_float scale (rounds to 2^-31 (1-2^-24))
SCALE_C = tl.constexpr(SCALE)
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
M32 = 0xFFFFFFFF

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_LN_LN2 = tl.constexpr(0.36651292058166435)   # -ln(ln 2): g = -ln(ln2 * w2) = this - ln2 lg2(w2)
SERIES_BELOW = tl.constexpr(2.0 ** -11)         # (1 - u) log2(e) below this: w = (1 - u) log2(e)
EPS = tl.constexpr(2.0 ** -16)                  # relative part of the score bound
EABS = tl.constexpr(2.0 ** -7)                  # absolute part of the score bound
FAR = tl.constexpr(2.0 ** 120)                  # |A| beyond this: rescan exactly
GATE_LO = tl.constexpr(2.0 ** -100)             # log2(e) / T outside (GATE_LO, GATE_HI): exact scan
GATE_HI = tl.constexpr(2.0 ** 100)
INT32_MAX = tl.constexpr(0x7FFFFFFF)


# --- torch: the semantics ----------------------------------------------------------------
def _mulhilo32(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit halves of a * b for a constant a < 2^32 and int64 b in [0, 2^32),
    in int64 without overflow (b split in 16-bit halves: every partial product < 2^49)."""
    p_lo = a * (b & 0xFFFF)
    p_hi = a * (b >> 16)
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & M32
    hi = (p_hi + (p_lo >> 16)) >> 16
    return hi, lo


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on int64 tensors holding uint32 values (broadcastable), as Triton's
    `philox_impl`: per round c0' = hi(B c2) ^ c1 ^ k0, c1' = lo(B c2),
    c2' = hi(A c0) ^ c3 ^ k1, c3' = lo(A c0); then the key is raised."""
    c0, c1, c2, c3, k0, k1 = (torch.as_tensor(t, dtype=torch.int64)
                              for t in (c0, c1, c2, c3, k0, k1))
    for _ in range(10):
        hb, lb = _mulhilo32(PHILOX_ROUND_B, c2)
        ha, la = _mulhilo32(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hb ^ c1 ^ k0, lb, ha ^ c3 ^ k1, la
        k0 = (k0 + PHILOX_KEY_A) & M32
        k1 = (k1 + PHILOX_KEY_B) & M32
    return c0, c1, c2, c3


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float on uint32 values held in int64: float32 u."""
    i = torch.where(bits >= 2**31, bits - 2**32, bits)
    i = torch.where(i < 0, -i - 1, i)
    return i.to(torch.float32) * torch.tensor(SCALE, dtype=torch.float32, device=bits.device)


def stream_bits(seeds: torch.Tensor, counters: torch.Tensor, V: int) -> torch.Tensor:
    """The raw Philox output of ids 0..V-1 for each (seed, counter) row: int64 [N, V]
    holding uint32 values (id v is output v & 3 of the call with counter v >> 2)."""
    seeds = seeds.to(torch.int64)
    G = -(-V // 4)
    grp = torch.arange(G, dtype=torch.int64, device=seeds.device)[None, :]
    ctr = (counters.to(torch.int64) & M32)[:, None]
    k0 = (seeds & M32)[:, None]
    k1 = ((seeds >> 32) & M32)[:, None]
    x = philox4x32_10(grp, ctr, torch.zeros_like(grp), torch.zeros_like(grp), k0, k1)
    return torch.stack(x, dim=-1).reshape(seeds.shape[0], 4 * G)[:, :V]


def gumbel(seeds: torch.Tensor, counters: torch.Tensor, V: int) -> torch.Tensor:
    """g = -log(-log(u)) in float32, [N, V]."""
    return -torch.log(-torch.log(uniform(stream_bits(seeds, counters, V))))


def scores(x: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
           counters: torch.Tensor) -> torch.Tensor:
    """s = float32(x) / T + g, float32 [N, V], one (T, seed, counter) per row of x."""
    t = temperature.to(torch.float32)[:, None]
    return x.to(torch.float32) / t + gumbel(seeds, counters, x.shape[-1])


# --- Triton ------------------------------------------------------------------------------
# Under the interpreter every nested @triton.jit call re-patches triton.language (a few ms
# each); the helpers below run there as plain Python inside the interpreted kernel (the
# language is already patched), the same code, only cheaper to call. On the GPU they are
# ordinary @triton.jit functions.
if C._INTERPRET_AT_IMPORT:
    def _helper(fn):
        return fn
else:
    _helper = triton.jit


# --- Triton: the log flavours -------------------------------------------------------------
if C.interpreter_active():
    @_helper
    def _log(x):
        return tl.log(x)

    @_helper
    def _one_minus_times(u, k):
        # (1 - u) * k: exact 1 - u for u >= 1/2 (Sterbenz), one rounding; equal to the
        # GPU's fma(u, -k, k) wherever the result is used (u > 1 - 2^-11.5)
        return (1.0 - u) * k

    @_helper
    def _fast_log2(x):
        """Under the interpreter: log2 pushed off by lg2.approx's documented worst error
        (2^-22 absolute on [0.5, 2], 2 ulp elsewhere), up or down by a bit of x, so the
        filtered scan's bound is exercised on the CPU too."""
        lg = tl.log2(x)
        err = tl.minimum(tl.maximum(tl.abs(lg), 1.0), 256.0) * 2.384185791015625e-07
        up = ((x.to(tl.int32, bitcast=True) >> 5) & 1) == 1
        return tl.where(up, lg + err, lg - err)
else:
    from triton.language.extra import libdevice

    @_helper
    def _log(x):
        # __nv_logf (max 1 ulp), not tl.log: the exact scan must track torch's log
        return libdevice.log(x)

    @_helper
    def _one_minus_times(u, k):
        # (1 - u) * k rounded once: one FFMA (the interpreter's fma would round twice)
        return tl.fma(u, -k, k)

    @_helper
    def _fast_log2(x):
        # lg2.approx.f32: one MUFU.LG2
        return libdevice.fast_log2f(x)


# --- Triton: the stream and the exact score -----------------------------------------------
@_helper
def live_mask(ids, hi, live_lo):
    """ids < hi, and ids >= live_lo unless live_lo is None (a constexpr: no compare)."""
    live = ids < hi
    if live_lo is not None:
        live = live & (ids >= live_lo)
    return live


@_helper
def philox(seed, c0, c1):
    """Philox4x32-10 with counter (c0, c1, 0, 0) (uint32 tensors/scalars) and key
    (lo32(seed), hi32(seed)): Triton's `philox_impl` round for round (bit-identical to
    tl.philox / tl.randint4x; the tests check it against tl.rand4x), except that each
    hi/lo pair of a product comes from one 32x32->64 multiply (mul.wide.u32: one
    IMAD.WIDE.U32 instead of IMAD.HI + IMAD)."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = tl.zeros_like(c1)
    c3 = tl.zeros_like(c1)
    for _ in tl.static_range(10):
        pb = c2.to(tl.uint64) * 0xCD9E8D57
        pa = c0.to(tl.uint64) * 0xD2511F53
        c0, c1, c2, c3 = ((pb >> 32).to(tl.uint32) ^ c1 ^ k0, pb.to(tl.uint32),
                          (pa >> 32).to(tl.uint32) ^ c3 ^ k1, pa.to(tl.uint32))
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0, c1, c2, c3


@_helper
def philox_tile(seed, ctr, grp0, G: tl.constexpr):
    """Raw Philox bits (uint32 [G, 4]) of ids 4*grp0 .. 4*(grp0+G)-1: entry [g, k] is
    output k of the call with counter (grp0 + g, ctr, 0, 0), i.e. id 4*(grp0+g) + k.
    (2-D so the four outputs stay in one thread's registers next to the [G, 4] logits
    tile: no layout conversion between the stream and the loads.)"""
    grp = (grp0 + tl.arange(0, G)).to(tl.uint32)
    r0, r1, r2, r3 = philox(seed, grp, ctr)
    return tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [G, 4])


@_helper
def tile_lanes(G: tl.constexpr):
    """int32 [G, 4]: 4*g + k, the position of each lane in a tile of 4*G ids."""
    return 4 * tl.arange(0, G)[:, None] + tl.arange(0, 4)[None, :]


@_helper
def exact_scores(x, T, bits):
    """s = x / T + (-log(-log(u))) with u = uniform(bits), as the reference rounds it."""
    u = tl.uint_to_uniform_float(bits)
    return tl.math.div_rn(x, T) + (-_log(-_log(u)))


@_helper
def _exact_chunk_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, BLOCK: tl.constexpr,
                        live_lo=None):
    """Argmax of the exact scores of ids [lo, hi) (n_tiles tiles of BLOCK) as one packed
    int64 (`pack`), in half tiles: the exact arithmetic needs more registers per id, and
    this scan shares a kernel with the filtered one (whose occupancy it would otherwise
    set). Lanes past hi score -inf (masked: with T = +inf a -inf logit scores NaN)."""
    HB: tl.constexpr = BLOCK // 2
    G: tl.constexpr = HB // 4
    lanes = tile_lanes(G)
    best = tl.full([G, 4], float("-inf"), tl.float32)
    best_tile = tl.zeros([G, 4], tl.int32)
    for t in range(0, 2 * n_tiles):
        base = lo + t * HB
        offs = base + lanes
        live = live_mask(offs, hi, live_lo)
        x = tl.load(row_ptr + offs, mask=live, other=float("-inf")).to(tl.float32)
        s = exact_scores(x, T, philox_tile(seed, ctr, base // 4, G))
        best, best_tile = lane_update(tl.where(live, s, float("-inf")), t, best, best_tile)
    packed = pack(best, lo + best_tile * HB + lanes)
    return tl.max(tl.reshape(packed, [HB]), 0)


# --- Triton: the filtered scan --------------------------------------------------------------
@_helper
def approx_log2_w(bits):
    """lg2(w) for raw Philox bits, w ~ -log2(u): the filtered scan's noise term, so that
    g ~ -ln(ln 2) - ln2 * lg2(w) and a = x * log2(e) / T - lg2(w) ~ s / ln2 + const.
    u~ = |float32(int32(bits))| * scale >= u (no fold; g grows with u). Near u = 1,
    where lg2.approx's absolute error would swamp -log2(u), w = (1 - u~) log2(e) <= -log2(u)
    instead (within a factor 1 + (1 - u))."""
    ua = tl.abs(bits.to(tl.int32, bitcast=True).to(tl.float32)) * SCALE_C
    d = _one_minus_times(ua, LOG2E)                     # (1 - u~) log2(e)
    w = tl.where(d < SERIES_BELOW, d, -_fast_log2(ua))
    return _fast_log2(w)


@_helper
def score_bound(a, SIGN: tl.constexpr):
    """Natural-units bound of a lane value a (log2 units): sa + SIGN * (EPS |sa| + EABS),
    sa = a ln2 - ln(ln2); an infinite a gives itself (NaN stays NaN)."""
    inf = (a == float("inf")) | (a == float("-inf"))
    sa = tl.where(inf, 0.0, a) * LN2 + NEG_LN_LN2      # (no inf - inf on the way)
    r = sa + SIGN * (tl.abs(sa) * EPS + EABS)
    return tl.where(inf, a, r)


@_helper
def _exact_lane_packed(row_ptr, lo, hi, n_tiles, lane, T, seed, ctr, BLOCK: tl.constexpr,
                       R: tl.constexpr, live_lo=None):
    """Packed argmax of the exact scores of the ids of one lane of a chunk:
    lo + t * BLOCK + lane for t < n_tiles (R of them at a time). Every id of a lane has
    the same Philox output index lane & 3 (BLOCK is a multiple of 4)."""
    k = lane % 4
    best = tl.full([], PACKED_EMPTY, tl.int64)
    for t0 in range(0, n_tiles, R):
        tt = t0 + tl.arange(0, R)
        ids = lo + tt * BLOCK + lane
        live = (tt < n_tiles) & live_mask(ids, hi, live_lo)
        x = tl.load(row_ptr + ids, mask=live, other=float("-inf")).to(tl.float32)
        r0, r1, r2, r3 = philox(seed, (ids // 4).to(tl.uint32), ctr)
        r = tl.where(k == 0, r0, tl.where(k == 1, r1, tl.where(k == 2, r2, r3)))
        s = tl.where(live, exact_scores(x, T, r), float("-inf"))
        best = tl.maximum(best, tl.max(pack(s, ids), 0))
    return best


@_helper
def _filter_chunk(row_ptr, lo, hi, n_tiles, T, c, seed, ctr, BLOCK: tl.constexpr,
                  MAXC: tl.constexpr, R: tl.constexpr, PREFETCH: tl.constexpr = False,
                  live_lo=None):
    """(packed answer, ok): the filtered scan of ids [lo, hi); ok = 0 means "rescan
    exactly" (the packed value is then meaningless).

    Pass 1 keeps, per lane, the max of the upper-bound score a (NaN-propagating, so a NaN
    anywhere shows). Then the lane with the largest max is scored exactly, id by id: its
    best exact score A is a lower bound of the chunk's exact maximum s*. The lane holding
    the winner has a max whose upper bound reaches s* >= A, so only lanes whose upper
    bound reaches A can hold it: each of those (at most MAXC more) is scored exactly too,
    and all are folded with the argmax rules (ties included: every id scoring s* lies in
    such a lane). Only the upper bound a + err >= s is relied on."""
    G: tl.constexpr = BLOCK // 4
    lanes = tile_lanes(G)
    b1 = tl.full([G, 4], float("-inf"), tl.float32)
    if PREFETCH:
        xn = tl.load(row_ptr + lo + lanes, mask=live_mask(lo + lanes, hi, live_lo),
                     other=float("-inf"))
    for t in range(0, n_tiles):
        base = lo + t * BLOCK
        if PREFETCH:
            # the next tile's loads go out before this tile's arithmetic
            x = xn.to(tl.float32)
            offs = base + BLOCK + lanes
            xn = tl.load(row_ptr + offs, mask=live_mask(offs, hi, live_lo),
                         other=float("-inf"))
        else:
            offs = base + lanes
            x = tl.load(row_ptr + offs, mask=live_mask(offs, hi, live_lo),
                        other=float("-inf")).to(tl.float32)
        a = x * c - approx_log2_w(philox_tile(seed, ctr, base // 4, G))
        b1 = tl.maximum(b1, a, propagate_nan=tl.PropagateNan.ALL)
    b1 = tl.reshape(b1, [BLOCK])
    lanes = tl.reshape(lanes, [BLOCK])
    # one int64 max gives the largest lane max and its lane (a NaN anywhere wins it)
    top_packed = tl.max(pack(b1, lanes), 0)
    bmax = unpack_value(top_packed)
    good = ((bmax > -FAR) & (bmax < FAR)).to(tl.int32)
    packed = tl.full([], PACKED_EMPTY, tl.int64)
    if good != 0:
        top = unpack_index(top_packed)
        packed = _exact_lane_packed(row_ptr, lo, hi, n_tiles, top, T, seed, ctr, BLOCK, R,
                                    live_lo)
        A = unpack_value(packed)                        # an exact score: <= s*
        cand = (score_bound(b1, 1.0) >= A) & (lanes != top)
        n = tl.sum(cand.to(tl.int32), 0)
        good = ((n <= MAXC) & (A > -FAR) & (A < FAR)).to(tl.int32)
        if good != 0:
            cl = tl.where(cand, lanes, INT32_MAX)
            for _ in range(0, n):
                lane = tl.min(cl, 0)
                cl = tl.where(cl == lane, INT32_MAX, cl)
                packed = tl.maximum(packed, _exact_lane_packed(row_ptr, lo, hi, n_tiles, lane,
                                                               T, seed, ctr, BLOCK, R, live_lo))
    elif bmax == float("-inf"):
        # every upper bound is -inf: if every logit is -inf (a masked chunk) every score
        # is -inf and the answer is (-inf, first live id), the plain argmax of the logits
        first = lo
        if live_lo is not None:
            first = tl.maximum(lo, live_lo)
        px = chunk_argmax_packed(row_ptr, first, hi, n_tiles, BLOCK)
        if unpack_value(px) == float("-inf"):
            packed = px
            good = good + 1
    return packed, good


@_helper
def sampled_chunk_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, BLOCK: tl.constexpr,
                         EXACT: tl.constexpr, MAXC: tl.constexpr,
                         PREFETCH: tl.constexpr = False, live_lo=None):
    """Argmax over ids [lo, hi) of the sampled scores (temperature T > 0, Philox key
    `seed` (int64), counter `ctr` (uint32)) as one packed int64. EXACT=1: the exact scan
    only; EXACT=0: the filtered scan, falling back to the exact one. Same answer.
    PREFETCH: the filtered scan loads tile t+1 before the arithmetic of tile t.
    live_lo: the first id of the chunk to score when it lies above lo (module doc)."""
    packed = tl.full([], PACKED_EMPTY, tl.int64)
    need = tl.full([], 1, tl.int32)
    if not EXACT:
        c = tl.math.div_rn(tl.full([], LOG2E, tl.float32), T)
        if (c > GATE_LO) & (c < GATE_HI):
            packed, ok = _filter_chunk(row_ptr, lo, hi, n_tiles, T, c, seed, ctr, BLOCK, MAXC,
                                       32, PREFETCH, live_lo)
            need = 1 - ok
    if need != 0:
        packed = _exact_chunk_packed(row_ptr, lo, hi, n_tiles, T, seed, ctr, BLOCK, live_lo)
    return packed
