"""The threshold P of a row with sampling controls, found by all of the row's programs.

P is `_controls_core.threshold_in`'s: after the min_p cut P0 (no pass), the k-th largest
pk where top_k is on, then the largest t with mass(pk >= t) >= top_p * W, W the mass at
or above the top_k threshold (integer fixed-point masses, compared as float64). Here it
is found in phases instead of by one program's bisections (a pass over the row each):

* phase 0 (the row's n_split programs, one chunk each) folds the pk range; its last
  program computes P0 and either publishes P (NaN row, top_p <= 0, min_p alone) or
  opens a search window [t_lo, t_hi) of pk known to hold P (`open_search`);
* each phase f = 1 .. NPH narrows the window. While it holds more than NCR ids, a split
  level: M split points s_1 > ... > s_M = t_lo (linear in z where the window spans many
  z keys, else linear in pk), and every program adds its chunk's count and mass of
  window ids at or above each s_i to the row's accumulators; the last program picks
  the bin that holds P (top_k by counts first, then top_p by masses; W is the mass at
  s_M on top_p's first level). Once the window holds at most NCR ids, a compaction:
  every program stores its window ids in the row's buffer, and the last program sorts
  them and finds P exactly (`_finish_compact`).
* if P is still open after phase NPH, the last program finds it by `threshold_in`.

With PCHECK (top_p given), rows with top_p and top_k off (and a finite z_max) first try
the candidate check (`_topp_core`): after phase 0, block 1 finds the row's C best
scores among pk >= P0 and W, block 2 their masses above; the first candidate whose mass
above is below top_p * W is the token (published into the row's slot, P = SKIP), and
only where none is does the check open phase 1 as phase 0 would have.

Counts and masses are integer sums, so P depends on neither the order of the atomics nor
the launch config. A phase's programs wait for its phase word (set by programs earlier
in launch order, running or done), its last program (the row counter) resets the
accumulators and publishes P or the next window; the last program of the row to exit
puts the state word to rest. State words rest at 0 (`SEARCH`); the buffer needs no rest.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _topp_core as TP
from ._argmax_core import PACKED_EMPTY, pack, unpack_value
from ._common import interpreter_active
from ._controls_core import mass, min_p_cut, packed_key, pk_range, threshold_in

NPH = 4                       # search phases after phase 0 (0: phase 0's last program bisects)
M = tl.constexpr(16)          # split points a level (4 bits of the window a phase)
# compaction: at most NCR ids of a window, sorted by the last program. P does not depend
# on it; the interpreter's sort costs seconds at 1024, so there the CPU tests run the
# search with 128 (and so with more levels before the compaction)
NCR = tl.constexpr(128 if interpreter_active() else 1024)
SPAN = tl.constexpr(28.0)     # z span of a first level (masses below e^-28 are 0 in fixed point)

# a row's state words (int64, resting at 0: `_common.SEARCH`), then its M masses and M
# counts, then its NCR buffer
(PHASE, T_LO, T_HI, M_HI, C_HI, MODE, TARGET, N_W, PMAX, PMIN, OFF, EXIT, P0W,
 CHK) = (tl.constexpr(i) for i in range(14))
ACC = tl.constexpr(16)
ST = tl.constexpr(ACC.value + 2 * M.value)
ROW = tl.constexpr(ST.value + NCR.value)    # int64 words a row
# counting for top_k; top_p with W unknown / known
MODE_K, MODE_P1, MODE_P = (tl.constexpr(i) for i in range(3))
DONE = tl.constexpr(1 << 40)  # the state word of a row whose P is published
SKIP = tl.constexpr(1 << 62)  # P of a row whose token is published (above every pk)
# CHK, the candidate check's word (PCHECK): 1 candidates, 2 check, 3 not this row's way
CHK_BEST, CHK_MASS, CHK_OFF = (tl.constexpr(i) for i in range(1, 4))


def state_size(R: int, phases: int) -> int:
    """int64 words of the search state of R rows (state, then an NCR buffer a row)."""
    return R * ROW.value if phases > 0 else 0


@triton.jit
def _splits(t_lo, t_hi, IDB, NS: tl.constexpr):
    """The NS split points s_1 > ... > s_NS = t_lo of the window [t_lo, t_hi)."""
    i = tl.arange(0, NS) + 1
    khi = (t_hi - 1) >> IDB
    klo = t_lo >> IDB
    zh = unpack_value(khi << 32)
    zl = tl.maximum(unpack_value(klo << 32), zh - SPAN)
    zi = zh - (zh - zl) * (i.to(tl.float32) / NS)
    sz = (pack(zi, tl.zeros([NS], tl.int32)) >> 32) << IDB
    finite = (zh - zl == zh - zl) & (zh - zl < float("inf"))
    sl = t_hi - tl.maximum((t_hi - t_lo) // NS, 1) * i
    s = tl.where(finite & (khi - klo >= 4 * NS), sz, sl)
    s = tl.minimum(tl.maximum(s, t_lo), t_hi)
    return tl.where(i == NS, t_lo, s)


@triton.jit
def _load_step(row_ptr, base, hi, T, IDB, LB: tl.constexpr):
    """(z, pk) of ids base .. base + LB - 1 (pk PACKED_EMPTY from hi on)."""
    ids = base + tl.arange(0, LB)
    x = tl.load(row_ptr + ids, mask=ids < hi, other=0.0)
    z = tl.math.div_rn(x.to(tl.float32), T)
    return z, tl.where(ids < hi, packed_key(z, ids, IDB), PACKED_EMPTY)


@triton.jit
def _level_pass(row_ptr, lo, hi, T, zmax, IDB, s, t_hi, NS: tl.constexpr,
                LB: tl.constexpr):
    """Mass and count of the window ids of [lo, hi) (pk < t_hi) at or above each s_i."""
    accm = tl.zeros([NS, LB], tl.int64)
    accc = tl.zeros([NS, LB], tl.int32)
    sb = tl.broadcast_to(s[:, None], [NS, LB])
    for base in range(lo, hi, LB):
        z, pk = _load_step(row_ptr, base, hi, T, IDB, LB)
        w = tl.where(pk < t_hi, mass(z, zmax), -1)        # -1: outside the window
        pkb = tl.broadcast_to(pk[None, :], [NS, LB])
        wb = tl.broadcast_to(w[None, :], [NS, LB])
        ge = (pkb >= sb) & (wb >= 0)
        accm += tl.where(ge, wb, 0)
        accc += ge.to(tl.int32)
    return tl.sum(accm, 1), tl.sum(accc, 1)


@triton.jit
def _compact_window(row_ptr, lo, hi, T, IDB, t_lo, t_hi, off_ptr, buf_ptr,
                    LB: tl.constexpr):
    """Store the pk of ids of [lo, hi) in [t_lo, t_hi) into the row's buffer."""
    for base in range(lo, hi, LB):
        _, pk = _load_step(row_ptr, base, hi, T, IDB, LB)
        inw = (pk >= t_lo) & (pk < t_hi)
        n = tl.sum(inw.to(tl.int64), 0)
        if n > 0:
            at = tl.atomic_add(off_ptr, n, sem="relaxed") + tl.cumsum(inw.to(tl.int64), 0) - 1
            tl.store(buf_ptr + at, pk, mask=inw & (at < NCR))


@triton.jit
def _publish_p(st_ptr, thr_ptr, P):
    tl.atomic_xchg(thr_ptr, P, sem="release")
    tl.atomic_xchg(st_ptr + PHASE, DONE, sem="release")


@triton.jit
def _open(st_ptr, f, t_lo, t_hi, m_hi, c_hi, mode, target, n_w):
    """Store the next window and open phase f for it (release)."""
    tl.store(st_ptr + T_LO, t_lo)
    tl.store(st_ptr + T_HI, t_hi)
    tl.store(st_ptr + M_HI, m_hi)
    tl.store(st_ptr + C_HI, c_hi)
    tl.store(st_ptr + MODE, mode)
    tl.store(st_ptr + TARGET, target.to(tl.int64, bitcast=True))
    tl.store(st_ptr + N_W, n_w)
    tl.debug_barrier()
    tl.atomic_xchg(st_ptr + PHASE, f, sem="release")


@triton.jit
def open_search(st_ptr, thr_ptr, V, k, p, mp, IDB, pmax, pmin, PHASES: tl.constexpr,
                row_ptr, T, BLOCK: tl.constexpr, PCHECK: tl.constexpr = False):
    """Phase 0's last program: publish P where no pass is needed, else (PCHECK, top_p
    without top_k, a finite z_max) open the candidate check, else open phase 1 on the
    window [P0, pmax + 1) (PHASES = 0: find P by `threshold_in` here)."""
    zkey = pmax >> IDB
    zmax = unpack_value(zkey << 32)
    P0 = min_p_cut(pmax, pmin, mp, IDB)
    kon = (k > 0) & (k < V)
    check = tl.zeros([], tl.int32)
    if PHASES == 0:
        tl.atomic_xchg(thr_ptr, threshold_in(row_ptr, V, T, k, p, mp, IDB, pmax, pmin,
                                             BLOCK), sem="release")
    elif (zkey == 0x7FFFFFFF) | (p <= 0.0):     # a NaN row (its first NaN id); top_p <= 0
        _publish_p(st_ptr, thr_ptr, pmax)
    elif ~kon & ~(p < 1.0):                     # min_p alone
        _publish_p(st_ptr, thr_ptr, P0)
    else:
        tl.store(st_ptr + PMAX, pmax)
        tl.store(st_ptr + PMIN, pmin)
        if PCHECK & ~kon & (zmax > float("-inf")) & (zmax < float("inf")):
            check += 1
            tl.store(st_ptr + P0W, P0)
            tl.debug_barrier()
            tl.atomic_xchg(st_ptr + CHK, CHK_BEST, sem="release")
        else:
            _open_first(st_ptr, kon, P0, pmax, V)
    if PCHECK:
        if check == 0:
            tl.atomic_xchg(st_ptr + CHK, CHK_OFF, sem="release")


@triton.jit
def _open_first(st_ptr, kon, P0, pmax, V):
    """Open phase 1 on the window [P0, pmax + 1)."""
    mode = tl.where(kon, MODE_K, MODE_P1).to(tl.int64)
    zero = tl.zeros([], tl.int64)
    _open(st_ptr, 1, P0, pmax + 1, zero, zero, mode, tl.zeros([], tl.float64),
          zero + V + NCR + 1)                 # the window's count: not known yet


@triton.jit
def _exit(st_ptr, n_exits):
    """Count a search or check program out; the last of the row's n_exits puts the
    state words to rest."""
    if tl.atomic_add(st_ptr + EXIT, 1, sem="acq_rel") == n_exits - 1:
        tl.store(st_ptr + EXIT, 0)
        tl.atomic_xchg(st_ptr + CHK, 0, sem="relaxed")
        tl.atomic_xchg(st_ptr + PHASE, 0, sem="relaxed")


@triton.jit
def _wait_chk(st_ptr, at_least):
    c = tl.atomic_add(st_ptr + CHK, 0, sem="acquire")
    while c < at_least:
        c = tl.atomic_add(st_ptr + CHK, 0, sem="acquire")
    return c


@triton.jit
def best_program(st_ptr, rcnt_ptr, lists_ptr, chunk, row_ptr, lo, hi, n_tiles, T, seed,
                 ctr, IDB, n_split, HB: tl.constexpr):
    """The candidate check's first step, chunk [lo, hi) (n_tiles tiles of HB): its C
    best scores among pk >= P0 into lists[chunk], its mass of pk >= P0 into the W word;
    the last program stores the row's C best and their pk and opens the check."""
    if _wait_chk(st_ptr, CHK_BEST) == CHK_BEST:
        pmax = tl.load(st_ptr + PMAX, cache_modifier=".cg")
        P0 = tl.load(st_ptr + P0W, cache_modifier=".cg")
        zmax = unpack_value((pmax >> IDB) << 32)
        best, w = TP.chunk_best(row_ptr, lo, hi, n_tiles, T, seed, ctr, P0, IDB, zmax, HB)
        tl.store(lists_ptr + chunk * TP.C + tl.arange(0, TP.C), best)
        tl.atomic_add(st_ptr + ACC + TP.C, w, sem="relaxed")
        tl.debug_barrier()
        if tl.atomic_add(rcnt_ptr, 1, sem="acq_rel") == n_split - 1:
            tl.store(rcnt_ptr, 0)
            best = TP.merge_best(lists_ptr, n_split)
            tl.store(st_ptr + ST + tl.arange(0, TP.C), TP.candidate_keys(best, row_ptr, T, IDB))
            tl.store(st_ptr + ST + TP.C + tl.arange(0, TP.C), best)
            tl.debug_barrier()
            tl.atomic_xchg(st_ptr + CHK, CHK_MASS, sem="release")


@triton.jit
def check_program(st_ptr, thr_ptr, rcnt_ptr, slot_ptr, row_ptr, lo, hi, V, T, p, IDB,
                  n_split, LB: tl.constexpr):
    """The candidate check's second step, chunk [lo, hi): its mass above each
    candidate's pk; the last program publishes the first candidate whose mass above is
    below p * W into the row's slot (P = SKIP: the scan only counts in), or opens the
    threshold search where none is."""
    if _wait_chk(st_ptr, CHK_MASS) == CHK_MASS:
        pmax = tl.load(st_ptr + PMAX, cache_modifier=".cg")
        zmax = unpack_value((pmax >> IDB) << 32)
        i = tl.arange(0, TP.C)
        pks = tl.load(st_ptr + ST + i, cache_modifier=".cg")
        m = TP.masses_above(row_ptr, lo, hi, T, zmax, IDB, pks, LB)
        tl.atomic_add(st_ptr + ACC + i, m, sem="relaxed")
        tl.debug_barrier()
        if tl.atomic_add(rcnt_ptr, 1, sem="acq_rel") == n_split - 1:
            tl.store(rcnt_ptr, 0)
            m = tl.atomic_xchg(st_ptr + ACC + i, tl.zeros([TP.C], tl.int64), sem="relaxed")
            W = tl.atomic_xchg(st_ptr + ACC + TP.C, 0, sem="relaxed")
            best = tl.load(st_ptr + ST + TP.C + i, cache_modifier=".cg")
            target = p.to(tl.float64) * W.to(tl.float64)
            hit = (best != PACKED_EMPTY) & (m.to(tl.float64) < target)
            at = tl.min(tl.where(hit, i, TP.C), 0)
            if at < TP.C:
                tl.atomic_max(slot_ptr, tl.sum(tl.where(i == at, best, 0), 0), sem="relaxed")
                _publish_p(st_ptr, thr_ptr, SKIP)
            else:
                _open_first(st_ptr, False, tl.load(st_ptr + P0W, cache_modifier=".cg"), pmax, V)


@triton.jit
def _pick(v, i, at):
    """v[at - 1] (1-based at; 0 for at = 0) of a vector indexed by i = 1, 2, ..."""
    return tl.sum(tl.where(i == at, v, 0), 0)


@triton.jit
def _finish_split(st_ptr, thr_ptr, f, k, p, IDB, t_lo, t_hi, m_hi, c_hi, mode, target):
    """A split level's last program: the bin holding P becomes the next window."""
    i = tl.arange(0, M) + 1
    s = _splits(t_lo, t_hi, IDB, M)
    m = tl.atomic_xchg(st_ptr + ACC + tl.arange(0, M), tl.zeros([M], tl.int64), sem="relaxed")
    c = tl.atomic_xchg(st_ptr + ACC + M + tl.arange(0, M), tl.zeros([M], tl.int64),
                       sem="relaxed")
    done = tl.zeros([], tl.int32)
    if mode == MODE_K:
        if c_hi + _pick(c, i, M) < k:          # the min_p cut keeps fewer than k ids
            if p < 1.0:
                mode = mode * 0 + MODE_P1
            else:
                _publish_p(st_ptr, thr_ptr, t_lo)
                done += 1
    if mode == MODE_P1:
        target = p.to(tl.float64) * (m_hi + _pick(m, i, M)).to(tl.float64)
        mode = mode * 0 + MODE_P
    if done == 0:
        if mode == MODE_K:
            hit = (c_hi + c) >= k
        else:
            hit = (m_hi + m).to(tl.float64) >= target
        at = tl.min(tl.where(hit, i, M), 0)
        new_hi = tl.where(at == 1, t_hi, _pick(s, i, at - 1))
        c_prev = _pick(c, i, at - 1)
        _open(st_ptr, f + 1, _pick(s, i, at), new_hi, m_hi + _pick(m, i, at - 1),
              c_hi + c_prev, mode, target, _pick(c, i, at) - c_prev)


@triton.jit
def _finish_compact(st_ptr, thr_ptr, f, k, p, IDB, t_hi, m_hi, c_hi, mode, target, n_w,
                    pmax):
    """A compaction's last program: P from the window's ids, sorted (or, where top_p's
    boundary lies above a top_k window, the window above it opens)."""
    j = tl.arange(0, NCR)
    valid = j < n_w
    v = tl.load(st_ptr + ST + j, mask=valid, other=PACKED_EMPTY, cache_modifier=".cg")
    tl.store(st_ptr + OFF, 0)
    srt = tl.sort(v, descending=True)
    zmax = unpack_value((pmax >> IDB) << 32)
    w = tl.where(valid, mass(unpack_value((srt >> IDB) << 32), zmax), 0)
    n = n_w
    P = tl.full([], PACKED_EMPTY, tl.int64)
    if mode == MODE_K:
        n = k - c_hi
        P = tl.sum(tl.where(j == n - 1, srt, 0), 0)
        if p < 1.0:
            W = m_hi + tl.sum(tl.where(j < n, w, 0), 0)
            target = p.to(tl.float64) * W.to(tl.float64)
            mode = mode * 0 + MODE_P
    elif mode == MODE_P1:
        target = p.to(tl.float64) * (m_hi + tl.sum(w, 0)).to(tl.float64)
        mode = mode * 0 + MODE_P
    if mode == MODE_P:
        if m_hi.to(tl.float64) >= target:      # top_p's P lies above this (top_k) window
            zero = tl.zeros([], tl.int64)
            _open(st_ptr, f + 1, t_hi, pmax + 1, zero, zero, mode, target, c_hi)
        else:
            w = tl.where(j < n, w, 0)
            excl = m_hi + tl.cumsum(w, 0) - w
            q = tl.sum(((excl.to(tl.float64) < target) & (j < n)).to(tl.int32), 0)
            _publish_p(st_ptr, thr_ptr, tl.sum(tl.where(j == q - 1, srt, 0), 0))
    else:
        _publish_p(st_ptr, thr_ptr, P)


@triton.jit
def search_program(f, st_ptr, thr_ptr, rcnt_ptr, row_ptr, lo, hi, V, T, k, p, mp, IDB,
                   n_split, n_exits, PHASES: tl.constexpr, LB: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Phase f (1 .. PHASES) of the row's search, chunk [lo, hi) (module doc); n_exits:
    the row's programs that count out (`_exit`)."""
    ph = tl.atomic_add(st_ptr + PHASE, 0, sem="acquire")
    while ph < f:
        ph = tl.atomic_add(st_ptr + PHASE, 0, sem="acquire")
    if ph == f:
        t_lo = tl.load(st_ptr + T_LO, cache_modifier=".cg")
        t_hi = tl.load(st_ptr + T_HI, cache_modifier=".cg")
        n_w = tl.load(st_ptr + N_W, cache_modifier=".cg")
        pmax = tl.load(st_ptr + PMAX, cache_modifier=".cg")
        zmax = unpack_value((pmax >> IDB) << 32)
        if n_w <= NCR:
            _compact_window(row_ptr, lo, hi, T, IDB, t_lo, t_hi, st_ptr + OFF, st_ptr + ST,
                            LB)
        else:
            s = _splits(t_lo, t_hi, IDB, M)
            m, c = _level_pass(row_ptr, lo, hi, T, zmax, IDB, s, t_hi, M, LB)
            tl.atomic_add(st_ptr + ACC + tl.arange(0, M), m, sem="relaxed")
            tl.atomic_add(st_ptr + ACC + M + tl.arange(0, M), c.to(tl.int64), sem="relaxed")
        tl.debug_barrier()
        if tl.atomic_add(rcnt_ptr, 1, sem="acq_rel") == n_split - 1:
            tl.store(rcnt_ptr, 0)
            m_hi = tl.load(st_ptr + M_HI, cache_modifier=".cg")
            c_hi = tl.load(st_ptr + C_HI, cache_modifier=".cg")
            mode = tl.load(st_ptr + MODE, cache_modifier=".cg")
            target = tl.load(st_ptr + TARGET, cache_modifier=".cg").to(tl.float64,
                                                                       bitcast=True)
            if n_w <= NCR:
                _finish_compact(st_ptr, thr_ptr, f, k, p, IDB, t_hi, m_hi, c_hi, mode,
                                target, n_w, pmax)
            else:
                _finish_split(st_ptr, thr_ptr, f, k, p, IDB, t_lo, t_hi, m_hi, c_hi, mode,
                              target)
            if f == PHASES:
                if tl.atomic_add(st_ptr + PHASE, 0, sem="acquire") != DONE:
                    pmin = tl.load(st_ptr + PMIN, cache_modifier=".cg")
                    _publish_p(st_ptr, thr_ptr, threshold_in(row_ptr, V, T, k, p, mp, IDB,
                                                             pmax, pmin, BLOCK))
    _exit(st_ptr, n_exits)


@triton.jit
def threshold_program(f, st_ptr, thr_ptr, rcnt_ptr, max_ptr, min_ptr, row_ptr, lo, hi, V,
                      T, k, p, mp, IDB, n_split, slot_ptr, lists_ptr, chunk, n_tiles, seed,
                      ctr, PHASES: tl.constexpr, LB: tl.constexpr, BLOCK: tl.constexpr,
                      PCHECK: tl.constexpr, HB: tl.constexpr):
    """Block f's program for chunk [lo, hi) (number `chunk`, n_tiles tiles of HB) of a
    row with controls (k, p, mp) at temperature T, Philox key seed and counter ctr:
    block 0 folds the row's pk range into max_ptr / min_ptr (resting at PACKED_EMPTY;
    min complemented) and its last program opens the candidate check or the search;
    with PCHECK blocks 1 and 2 are the check (`best_program`, `check_program`: the token
    lands in slot_ptr, chunk lists in lists_ptr), then PHASES search blocks
    (`search_program`). P lands in thr_ptr; rcnt_ptr: the row's arrival counter (resting
    at 0); st_ptr: the row's state (`state_size`)."""
    if f == 0:
        pmax, pmin = pk_range(row_ptr, lo, hi, T, IDB, BLOCK)
        tl.atomic_max(max_ptr, pmax, sem="relaxed")
        tl.atomic_max(min_ptr, ~pmin, sem="relaxed")
        if tl.atomic_add(rcnt_ptr, 1, sem="acq_rel") == n_split - 1:
            pmax = tl.atomic_xchg(max_ptr, PACKED_EMPTY, sem="relaxed")
            pmin = ~tl.atomic_xchg(min_ptr, PACKED_EMPTY, sem="relaxed")
            tl.store(rcnt_ptr, 0)
            open_search(st_ptr, thr_ptr, V, k, p, mp, IDB, pmax, pmin, PHASES, row_ptr, T,
                        BLOCK, PCHECK)
    elif PCHECK:
        n_exits = (PHASES + 2) * n_split
        if f == 1:
            best_program(st_ptr, rcnt_ptr, lists_ptr, chunk, row_ptr, lo, hi, n_tiles, T,
                         seed, ctr, IDB, n_split, HB)
            _exit(st_ptr, n_exits)
        elif f == 2:
            check_program(st_ptr, thr_ptr, rcnt_ptr, slot_ptr, row_ptr, lo, hi, V, T, p, IDB,
                          n_split, LB)
            _exit(st_ptr, n_exits)
        else:
            search_program(f - 2, st_ptr, thr_ptr, rcnt_ptr, row_ptr, lo, hi, V, T, k, p, mp,
                           IDB, n_split, n_exits, PHASES, LB, BLOCK)
    else:
        search_program(f, st_ptr, thr_ptr, rcnt_ptr, row_ptr, lo, hi, V, T, k, p, mp, IDB,
                       n_split, PHASES * n_split, PHASES, LB, BLOCK)
