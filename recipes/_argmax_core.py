"""The torch-exact argmax, shared by every recipe that reduces over a vocabulary.

`torch.argmax` semantics, which every piece below keeps:

* the largest value wins, ties go to the lowest index;
* NaN is larger than every number, so the first NaN wins;
* a row of all -inf gives index 0 (every element ties);
* -0.0 and +0.0 are equal (they tie, the lower index wins).

The reduction has two stages. Stage 1: each program scans a chunk of one row. A lane
is one 16-byte load of each tile; it keeps the best of its loads' maxima and the tile
it came from (a strict `>` keeps the earlier tile on a tie, since a lane sees its
indices in increasing order), the lanes fold with one int64 max over their packed (key,
first index of the load), and the winning load is read again to find its first element
of that value. Stage 2 folds the chunks of a row: every program turns its
(value, index) into one int64 whose signed order is the argmax order (`pack`), and
`atomic_max`es it into the row's slot; an arrival counter tells the last program of a
group that every chunk is in. Because `pack` orders exactly as the rules do,
the answer does not depend on how the vocabulary is split.

Order key of a float32 value x with bits b (int32):
    NaN                 -> 0x7FFFFFFF (above +inf's 0x7F800000, all NaNs equal)
    b >= 0 (x >= +0.0)  -> b
    b <  0 (x <= -0.0)  -> -(b & 0x7FFFFFFF)  (so -0.0 -> 0, equal to +0.0)
pack(x, i) = key << 32 | (0x7FFFFFFF - i): larger key first, then lower index.
"""
import triton
import triton.language as tl

from ._common import cdiv, interpreter_active, nearest_pow2, next_pow2

PACKED_EMPTY = tl.constexpr(-(2**63))  # INT64_MIN: the resting value of a stage-2 slot


@triton.jit
def lane_update(x, tile, best, best_tile):
    """Per-lane running argmax: `x` arrives at a later tile than `best`, so only a
    strictly better value (or a first NaN) replaces it. Lanes remember the tile, not the
    index (a scalar select instead of an index add per element).
    `not (x <= best)` is "x > best, or x is NaN"; `best == best` keeps a NaN once held:
    two predicates per element."""
    take = (~(x <= best)) & (best == best)
    return tl.where(take, x, best), tl.where(take, tile, best_tile)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


# One tile of the lane-max scan: each lane (a row of `x`, the VEC elements of one load)
# takes the NaN-propagating max of its elements, and only a strictly better one (or a
# first NaN: `lane_update`'s rule) replaces the lane's best and tile. Compiled, the max
# is one reduce with `_max_nan`. The interpreter would run that combine element by
# element in Python (and a nested device call costs it more than the tile's arithmetic),
# but runs the tie-break-left argmax combine as numpy's max, which propagates NaN: the
# same values in one array operation.
if interpreter_active():
    @triton.jit
    def lane_fold(x, tile, best, best_tile):
        m = tl.reduce(x.to(tl.float32), 1, tl.standard._argmax_combine_tie_break_left)
        take = (~(m <= best)) & (best == best)
        return tl.where(take, m, best), tl.where(take, tile, best_tile)
else:
    @triton.jit
    def lane_fold(x, tile, best, best_tile):
        m = tl.reduce(x.to(tl.float32), 1, _max_nan)
        take = (~(m <= best)) & (best == best)
        return tl.where(take, m, best), tl.where(take, tile, best_tile)


@triton.jit
def _tile_offsets(lo, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Offsets of a tile from lo as [BLOCK // VEC, VEC]: a row is one lane's load."""
    return lo + tl.arange(0, BLOCK // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]


@triton.jit
def chunk_first(row_ptr, lo, hi, BLOCK: tl.constexpr, UNROLL: tl.constexpr = 1,
                VEC: tl.constexpr = 1):
    """The first step's loads of `chunk_scan` (UNROLL tiles from lo; the second is a
    copy of the first when UNROLL is 1 and never read). A caller issues them itself
    when it has other loads to put in flight with them before the scan."""
    o0 = _tile_offsets(lo, BLOCK, VEC)
    x0 = tl.load(row_ptr + o0, mask=o0 < hi, other=float("-inf"),
                 eviction_policy="evict_first")
    x1 = x0
    if UNROLL > 1:
        o1 = o0 + BLOCK
        x1 = tl.load(row_ptr + o1, mask=o1 < hi, other=float("-inf"),
                     eviction_policy="evict_first")
    return x0, x1


@triton.jit
def chunk_scan(row_ptr, x0, x1, lo, hi, n_tiles, BLOCK: tl.constexpr,
               UNROLL: tl.constexpr = 1, VEC: tl.constexpr = 1):
    """Argmax of row_ptr[lo:hi] as one packed int64 (see `pack`), scanning n_tiles tiles
    of BLOCK from lo, UNROLL tiles per step (their loads in flight together, the lane
    state shared), the first step's tiles x0, x1 already loaded (`chunk_first`).

    A lane is one load of VEC consecutive elements (16 bytes; `lane_vec`). It keeps the
    best of its per-tile maxima and the tile it came from (`lane_fold`: one compare a
    load, not one an element). The lanes fold with one int64 max over pack(best, first
    index of the lane's load in that tile), whose order is the order of the elements
    they stand for (lanes cover disjoint index ranges), and the program reads the
    winning load once more to find the first element equal to the best (or the first
    NaN). Software-pipelined: the next step's loads are issued before this step's tiles
    are folded (docs/performance.md, section "The split argmax scan"); each logit is
    read once, so its loads are marked evict_first (the winner's reload is not). Lanes
    past `hi` load -inf and can only tie, at a higher index than lane lo, so they never
    win; a chunk with no element left (lo >= hi) gives pack(-inf, lo), which loses to
    any real element and ties behind index 0."""
    R: tl.constexpr = BLOCK // VEC
    best = tl.full([R], float("-inf"), tl.float32)
    best_tile = tl.zeros([R], tl.int32)
    o0 = _tile_offsets(lo, BLOCK, VEC)
    if UNROLL == 1:
        for t in range(0, n_tiles):
            on = o0 + (t + 1) * BLOCK
            xn = tl.load(row_ptr + on, mask=on < hi, other=float("-inf"),
                         eviction_policy="evict_first")
            best, best_tile = lane_fold(x0, t, best, best_tile)
            x0 = xn
    else:
        for t in range(0, n_tiles, 2):
            n0 = o0 + (t + 2) * BLOCK
            n1 = n0 + BLOCK
            y0 = tl.load(row_ptr + n0, mask=n0 < hi, other=float("-inf"),
                         eviction_policy="evict_first")
            y1 = tl.load(row_ptr + n1, mask=n1 < hi, other=float("-inf"),
                         eviction_policy="evict_first")
            best, best_tile = lane_fold(x0, t, best, best_tile)
            best, best_tile = lane_fold(x1, t + 1, best, best_tile)
            x0 = y0
            x1 = y1
    win = tl.max(pack(best, lo + best_tile * BLOCK + tl.arange(0, R) * VEC), 0)
    at = unpack_index(win)
    value = unpack_value(win)
    k = tl.arange(0, VEC)
    v = tl.load(row_ptr + at + k, mask=at + k < hi, other=float("-inf")).to(tl.float32)
    hit = tl.where(value != value, v != v, v == value)
    return pack(value, at + tl.min(tl.where(hit, k, VEC), 0))


@triton.jit
def chunk_argmax_packed(row_ptr, lo, hi, n_tiles, BLOCK: tl.constexpr,
                        UNROLL: tl.constexpr = 1, VEC: tl.constexpr = 1):
    """`chunk_scan` of row_ptr[lo:hi] from its own first loads."""
    x0, x1 = chunk_first(row_ptr, lo, hi, BLOCK, UNROLL, VEC)
    return chunk_scan(row_ptr, x0, x1, lo, hi, n_tiles, BLOCK, UNROLL, VEC)


def lane_vec(itemsize: int, block: int, num_warps: int) -> int:
    """Host side: the elements of one lane of `chunk_scan` for a config: a 16-byte load,
    or fewer where the tile gives each thread fewer (so a lane's max stays in a thread)."""
    return max(1, min(16 // itemsize, block // (32 * num_warps)))


@triton.jit
def pack(value, index):
    """One int64 whose signed order is the argmax order of (value, index)."""
    bits = value.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, -(bits & 0x7FFFFFFF))
    key = tl.where(value != value, 0x7FFFFFFF, key)
    return (key.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def unpack_index(packed):
    """The index of a packed candidate, as int32."""
    return (0x7FFFFFFF - (packed & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def unpack_value(packed):
    """The value of a packed candidate (inverse of the order key), as float32."""
    key = (packed >> 32).to(tl.int32)
    bits = tl.where(key >= 0, key, (-key) | -0x80000000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def publish_packed(packed, acc_slot_ptr, cnt_ptr):
    """Stage 2 arrival: fold this chunk's packed candidate into its row slot and count in;
    returns how many programs of the group arrived before this one. The max needs no
    ordering of its own: the counter's acq_rel add releases it, and the last arrival's
    acquire sees every max."""
    tl.atomic_max(acc_slot_ptr, packed, sem="relaxed")
    return tl.atomic_add(cnt_ptr, 1, sem="acq_rel")


@triton.jit
def spin_collect(packed, slot_ptr, n_others, SP: tl.constexpr):
    """Stage 2 without a counter, for the finishing program of a group whose other
    n_others programs each `atomic_xchg` their packed candidate into slot_ptr[0:n_others]
    (resting at PACKED_EMPTY): exchange those slots back to rest until every one has given
    a candidate, and return the max of them and `packed`. Each slot is read by the atomic
    that also resets it, so no fence or arrival counter is needed (a candidate is one
    64-bit word). The caller must guarantee the other programs can run while this one
    waits: a grid of at most one program per multiprocessor (all resident at once), or
    the waited-for programs earlier in launch order. The interpreter runs programs in order,
    so the finisher must be the group's last program there."""
    lanes = tl.arange(0, SP)
    got = lanes >= n_others
    best = packed
    while tl.min(got.to(tl.int32), 0) == 0:
        v = tl.atomic_xchg(slot_ptr + lanes, PACKED_EMPTY, mask=~got, sem="relaxed")
        new = (v != PACKED_EMPTY) & ~got
        best = tl.maximum(best, tl.max(tl.where(new, v, PACKED_EMPTY), 0))
        got = got | new
    return best


def split_plan(V: int, block: int, split: int):
    """Host side: (programs per row, tiles per program) for a requested split, with no
    program left without a tile."""
    n_tiles = cdiv(V, block)
    split = max(1, min(int(split), n_tiles))
    tiles_per = cdiv(n_tiles, split)
    return cdiv(n_tiles, tiles_per), tiles_per


# --- the search space every split-argmax kernel shares ----------------------------------
# SPLIT is the number of programs per row (clamped to the number of tiles). num_stages
# stays at 1: Triton does not pipeline these loads (no dot), so other values compile to
# the same loop, and the cp.async pipelining that tl.range(num_stages=S) would ask for is
# slower (docs/performance.md, section "The split argmax scan").
SPLIT_SPACE = {
    "BLOCK_V": (1024, 2048, 4096, 8192),
    "SPLIT": (1, 2, 4, 8, 16, 32, 64, 128),
    "num_warps": (4, 8, 16),
    "num_stages": (1,),
    "UNROLL": (1, 2),
}


def split_constraint(config: dict, V: int) -> bool:
    """Static limits: at least 4 elements a thread (one 8- or 16-byte load), and SPLIT
    no larger than the tile count rounded up to a power of two (larger ones clamp to the
    same launch)."""
    if config["BLOCK_V"] < 4 * 32 * config["num_warps"]:
        return False
    return config["SPLIT"] <= next_pow2(cdiv(V, config["BLOCK_V"]))


def split_heuristic(dtype_name: str, V: int, rows: int, sms: int) -> dict:
    """The split config for `rows` rows of V elements on `sms` multiprocessors. With
    fewer rows than SMs the scan is latency-bound: small tiles (1024 elements, 2048 from
    V = 65536; 2-8 KB a load) and chunks for about two programs per SM, on 4 warps below
    16 rows and 8 from 16, two tiles in flight from 16 rows when a chunk has two. With a
    row for every SM the scan is bandwidth-bound and what matters is how evenly the SMs
    end. One program a row on 16 warps (16-byte loads, the fewest programs) where that
    is even: the rows fill two programs an SM to within 5% (one wave), or there are 12
    rows an SM or more (many waves). Elsewhere small programs, 1024 elements on 4 warps,
    about 8 an SM for 16-bit dtypes and 6 for float32 (SPLIT the nearest power of two),
    so that no SM is left with a last row while the others idle; where that comes to one
    program a row and the rows fit one wave of them, 8 warps a program. Two tiles in
    flight wherever a chunk has two. Always a config `split_constraint` admits. Measured
    basis: docs/performance.md, section "The shared split heuristic"."""
    wide = dtype_name in ("bfloat16", "float16")
    if rows < sms:
        block = 2048 if V >= 65536 else 1024
        split = min(next_pow2(cdiv(2 * sms, max(1, rows))), 128, next_pow2(cdiv(V, block)))
        if split > 1:
            tiles_per = split_plan(V, block, split)[1]
            return {"BLOCK_V": block, "SPLIT": split, "num_warps": 4 if rows < 16 else 8,
                    "num_stages": 1, "UNROLL": 2 if rows >= 16 and tiles_per >= 2 else 1}
    # (fewer rows than SMs get here only with rows of one tile)
    if rows < sms or 0.95 * 2 * sms <= rows <= 2 * sms or rows >= 12 * sms:
        block = 4096 if wide else 2048
        return {"BLOCK_V": block, "SPLIT": 1, "num_warps": 16, "num_stages": 1,
                "UNROLL": 2 if cdiv(V, block) >= 2 else 1}
    block = 1024
    per_sm = 8 if wide else 6
    split = min(nearest_pow2(per_sm * sms / rows), 128, next_pow2(cdiv(V, block)))
    # One program a row that all fit at once: 8 warps, twice the loads in flight a row
    one_wave = split == 1 and rows <= per_sm * sms
    return {"BLOCK_V": block, "SPLIT": split, "num_warps": 8 if one_wave else 4,
            "num_stages": 1, "UNROLL": 2 if split_plan(V, block, split)[1] >= 2 else 1}
