"""The torch-exact argmax, shared by every recipe that reduces over a vocabulary.

`torch.argmax` semantics, which every piece below keeps:

* the largest value wins, ties go to the lowest index;
* NaN is larger than every number, so the first NaN wins;
* a row of all -inf gives index 0 (every element ties);
* -0.0 and +0.0 are equal (they tie, the lower index wins).

The reduction has two stages. Stage 1: each program scans a chunk of one row, keeping
a running best value and index *per lane* (a strict `>` keeps the earlier element on a
tie, since a lane sees its indices in increasing order), then folds its lanes
(`lanes_argmax`). Stage 2 folds the chunks of a row: every program turns its
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

PACKED_EMPTY = tl.constexpr(-(2**63))  # INT64_MIN: the resting value of a stage-2 slot


@triton.jit
def lane_update(x, idx, best, best_idx):
    """Per-lane running argmax: `x` arrives at a higher index than `best`, so only a
    strictly better value (or a first NaN) replaces it."""
    take = (x > best) | ((x != x) & (best == best))
    return tl.where(take, x, best), tl.where(take, idx, best_idx)


@triton.jit
def chunk_argmax(row_ptr, lo, hi, n_tiles, BLOCK: tl.constexpr):
    """Argmax of row_ptr[lo:hi] (float32 value, int32 index), scanning n_tiles tiles of
    BLOCK starting at lo. Lanes past `hi` load -inf and can only tie, at a higher index
    than lane lo, so they never win; a chunk with no element left (lo >= hi) returns
    (-inf, lo), which loses to any real element and ties behind index 0."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = lo + lanes
    for t in range(0, n_tiles):
        offs = lo + t * BLOCK + lanes
        x = tl.load(row_ptr + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
        best, best_idx = lane_update(x, offs, best, best_idx)
    return lanes_argmax(best, best_idx)


@triton.jit
def lanes_argmax(best, best_idx):
    """Fold per-lane candidates into one (value, index) with the argmax rules: if any
    lane holds a NaN the lowest-index NaN wins, else the lowest index holding the max.
    (Two plain reductions instead of a custom `tl.reduce` combine: the same answer,
    and far cheaper under the interpreter.)"""
    is_nan = best != best
    has_nan = tl.max(is_nan.to(tl.int32), 0) > 0
    top = tl.max(tl.where(is_nan, float("-inf"), best), 0)
    hit = tl.where(has_nan, is_nan, best == top)
    index = tl.min(tl.where(hit, best_idx, 0x7FFFFFFF), 0)
    return tl.where(has_nan, float("nan"), top), index


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
def publish(value, index, acc_slot_ptr, cnt_ptr):
    """Stage 2 arrival: fold this chunk's candidate into its row slot and count in.
    Returns the number of programs of the group that arrived before this one."""
    tl.atomic_max(acc_slot_ptr, pack(value, index))
    return tl.atomic_add(cnt_ptr, 1)


def split_plan(V: int, block: int, split: int):
    """Host side: (programs per row, tiles per program) for a requested split, with no
    program left without a tile."""
    n_tiles = -(-V // block)
    split = max(1, min(int(split), n_tiles))
    tiles_per = -(-n_tiles // split)
    return -(-n_tiles // tiles_per), tiles_per
