"""draft_tail: the top-1 tail of a draft step, in one launch.

For b in [0, B), with r[b] = rows[b] (every row when rows is None, so B = R):

    t[b]      = argmax_v logits[r[b], v]          (torch.argmax rules, see argmax.py)
    tokens[b] = token_map[t[b]]   (int64; t[b] itself when token_map is None)
    probs[b]  = 1.0               (float32: a top-1 draft has unit probability)
    hidden[b] = hidden_in[r[b]]   (hidden's dtype; None when hidden is None)
    positions[b] += 1             (in place, when positions is given)
    draft_tokens[b, column] = tokens[b]   (in place, when draft_tokens is given)

Edge cases and choices:

* A row index outside [0, R) never reads out of bounds: it is clamped to the nearest
  valid row (a negative index reads row 0, an index >= R reads row R - 1), in the
  argmax and in the hidden gather alike. `reference` clamps the same way.
  `rows` may repeat and come in any order; int32 rows are accepted too.
* `hidden` has one row per logits row ([R, H], float16/bfloat16/float32, last dim
  contiguous, any row stride); H = 0 gives an empty [B, 0] copy.
* `token_map` (int32/int64 [Vd], any stride) is read at t[b] < Vd only; its values are
  copied as they are (widened to int64), in or out of any vocabulary.
* `column` is a Python int in [-K, K) for draft_tokens [B, K] (negative counts from the
  end), 0 by default; passing it without draft_tokens is an error (it would be
  dropped). `positions` and `draft_tokens` may be strided views, but not expanded
  (stride-0) or otherwise self-overlapping ones (`_common.check_written`); neither may
  share memory with an input, an out= buffer or each other (ValueError, from the
  address ranges: `_common.check_no_overlap`).
* B = 0 returns empty outputs and launches nothing; R = 0 with rows non-empty is an error.

One launch. The grid is [argmax programs | hidden-copy programs]:

* Argmax programs (the first B * SPLIT program ids): each selected row is cut into SPLIT
  chunks of whole BLOCK_V tiles read in place (the row is never copied out); one program
  scans one chunk with the shared torch-exact `chunk_first` + `chunk_scan` (UNROLL tiles
  in flight a step). With one chunk per row the program finishes the row itself;
  otherwise the chunks of a row meet in one of two ways, which give the same bits:
  - spin (the whole grid fits one program a multiprocessor, e.g. B=1): each chunk but
    the last exchanges its packed candidate into its own workspace slot; the row's last
    chunk, after its own scan, exchanges those slots back to rest until it has them all
    (`spin_collect`: no fence, no counter);
  - counter (larger grids): `publish_packed` (atomic_max of the packed candidate into
    the per-b slot, then an arrival counter) and the last program of the row to arrive
    reads the slot and puts slot and counter back to rest.
  The finishing program maps the token and writes tokens[b] and draft_tokens[b, column].
  Slots are per output b, not per logits row, so repeated rows do not share one. The
  first chunk's program of each b writes probs[b] = 1 and positions[b] += 1 (its
  positions load is issued before the scan, so it is off the critical path).
* The hidden rows, by config (FUSE_H): copy programs (B * cdiv(H, BLOCK_H) ids after
  the argmax ones, one BLOCK_H tile of hidden[r[b]] each, so that the scan starts at once),
  or the argmax programs themselves, chunk s copying slice s of its row with the load
  issued next to its first logits tiles and the store before the scan, so nothing is
  held through the loop (the choice where a full grid of scans leaves copy programs no
  slot until it ends).
* A second gathered tensor, when the launcher is given one (`launch_draft_tail`'s
  `gather`, which `recipes.compat.sglang` uses for SGLang's DSA top-k indices): copy
  programs after the hidden ones, out-of-range rows giving zeros instead of clamping.

With PDL on (`recipes.pdl_on`, sm_90+; off by default) a launch is a programmatic
dependent launch (`_common.pdl`): the kernel may start while the previous one on the
stream runs, and waits for it before its first load. A grid of at most a program an SM
lets the next launch begin at once; a larger one after each program's scan
(`pdl_release`).

No program waits on one that cannot run (the spin finisher only where every program
of the grid is resident at once), and every config gives the same bits: the chunk
answers are combined by an order-exact max. The measurements behind the grid layout,
FUSE_H, the spin finisher and the B=256 read floor: docs/performance.md, section
"draft_tail".
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _common as C
from ._argmax_core import (
    PACKED_EMPTY,
    SPLIT_SPACE,
    chunk_first,
    chunk_scan,
    lane_vec,
    publish_packed,
    spin_collect,
    split_constraint,
    split_heuristic,
    split_plan,
    unpack_index,
)
from ._common import cdiv, next_pow2
from ._tuning import Tuning

NAME = "draft_tail"


class _DefaultColumn(int):
    """The default of `column`: the int 0, told apart from an explicit 0 by identity."""

    def __repr__(self) -> str:
        return "0"


COLUMN_DEFAULT = _DefaultColumn(0)


class DraftTail(NamedTuple):
    tokens: torch.Tensor                 # int64 [B]
    probs: torch.Tensor                  # float32 [B], all 1.0
    hidden: torch.Tensor | None          # [B, H] in hidden's dtype, or None


# --- the semantics ---------------------------------------------------------------------
def reference(logits: torch.Tensor, rows: torch.Tensor | None = None,
              hidden: torch.Tensor | None = None, token_map: torch.Tensor | None = None,
              positions: torch.Tensor | None = None,
              draft_tokens: torch.Tensor | None = None, column: int = 0) -> DraftTail:
    """Plain torch. Updates `positions` and `draft_tokens` in place like `draft_tail`."""
    R = logits.shape[0]
    dev = logits.device
    if rows is None:
        idx = torch.arange(R, device=dev)
    else:
        idx = rows.to(torch.int64).clamp(0, R - 1)
    B = idx.numel()
    t = torch.argmax(logits[idx], dim=1)
    tokens = t if token_map is None else token_map[t].to(torch.int64)
    probs = torch.ones(B, dtype=torch.float32, device=dev)
    h = None if hidden is None else hidden[idx]
    if positions is not None:
        positions.add_(1)
    if draft_tokens is not None:
        draft_tokens[:, column] = tokens
    return DraftTail(tokens, probs, h)


# --- kernels ---------------------------------------------------------------------------
@triton.jit
def _selected_row(rows_ptr, b, stride_rows, R, HAS_ROWS: tl.constexpr):
    """The logits/hidden row of output b (int64), clamped into [0, R)."""
    if HAS_ROWS:
        r = tl.load(rows_ptr + b.to(tl.int64) * stride_rows).to(tl.int64)
        r = tl.minimum(tl.maximum(r, 0), R - 1)
    else:
        r = b.to(tl.int64)
    return r


@triton.jit
def _copy_rows(pid, rows_ptr, h_ptr, hout_ptr, R, stride_rows, H, stride_h, h_tiles,
               HAS_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, ZERO_OUTSIDE: tl.constexpr):
    """One BLOCK_H tile of output row b = pid // h_tiles: hout[b] = h[r[b]], r[b] clamped
    into [0, R) (`_selected_row`: the hidden rows); with ZERO_OUTSIDE, zeros where
    rows[b] is outside [0, R) instead (the second gathered tensor: relay_gather's rule)."""
    b = pid // h_tiles
    cols = (pid % h_tiles) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < H
    if ZERO_OUTSIDE:
        r = b.to(tl.int64)
        if HAS_ROWS:
            r = tl.load(rows_ptr + b.to(tl.int64) * stride_rows).to(tl.int64)
        inside = (r >= 0) & (r < R)
        v = tl.load(h_ptr + tl.where(inside, r, 0) * stride_h + cols, mask=m & inside,
                    other=0)
    else:
        r = _selected_row(rows_ptr, b, stride_rows, R, HAS_ROWS)
        v = tl.load(h_ptr + r * stride_h + cols, mask=m)
    tl.store(hout_ptr + b.to(tl.int64) * H + cols, v, mask=m)


@triton.jit
def _finish(b, index, map_ptr, tok_ptr, dt_ptr, stride_map, stride_dt, dt_col,
            HAS_MAP: tl.constexpr, HAS_DT: tl.constexpr):
    """Map the winning draft id and write tokens[b] (and the draft_tokens column)."""
    if HAS_MAP:
        token = tl.load(map_ptr + index.to(tl.int64) * stride_map).to(tl.int64)
    else:
        token = index.to(tl.int64)
    tl.store(tok_ptr + b, token)
    if HAS_DT:
        tl.store(dt_ptr + b.to(tl.int64) * stride_dt + dt_col, token)


@triton.jit
def _argmax_tail(q, x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr,
                 h_ptr, hout_ptr, acc_ptr, cnt_ptr, R, V, stride_x, stride_rows,
                 stride_map, stride_pos, stride_dt, dt_col, n_split, tiles_per, H,
                 stride_h, h_slice,
                 HAS_ROWS: tl.constexpr, HAS_MAP: tl.constexpr, HAS_POS: tl.constexpr,
                 HAS_DT: tl.constexpr, ONE_CHUNK: tl.constexpr, SPIN: tl.constexpr,
                 FUSE_H: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                 UNROLL: tl.constexpr, VEC: tl.constexpr, SP: tl.constexpr,
                 PDL: tl.constexpr):
    b = q // n_split
    s = q % n_split
    first = s == 0
    if HAS_POS:   # issued before the scan; stored after it
        pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos, mask=first, other=0)
    r = _selected_row(rows_ptr, b, stride_rows, R, HAS_ROWS)
    lo = s * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    row = x_ptr + r * stride_x
    if FUSE_H:    # slice s of the hidden row: loaded with the first tiles, stored before
        hl = tl.arange(0, BLOCK_H)          # the scan (no registers held through it)
        hc = s * h_slice + hl
        hm = (hl < h_slice) & (hc < H)
        hv = tl.load(h_ptr + r * stride_h + hc, mask=hm)
    x0, x1 = chunk_first(row, lo, hi, BLOCK_V, UNROLL, VEC)
    if FUSE_H:
        tl.store(hout_ptr + b.to(tl.int64) * H + hc, hv, mask=hm)
    packed = chunk_scan(row, x0, x1, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
    C.pdl_release(PDL)
    tl.store(probs_ptr + b, 1.0, mask=first)
    if HAS_POS:
        tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1, mask=first)
    if ONE_CHUNK:
        _finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map, stride_dt,
                dt_col, HAS_MAP, HAS_DT)
    elif SPIN:
        # the row's last chunk collects the others' slots (b * n_split + s) itself
        slots = acc_ptr + b.to(tl.int64) * n_split
        if s == n_split - 1:
            packed = spin_collect(packed, slots, n_split - 1, SP)
            _finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map,
                    stride_dt, dt_col, HAS_MAP, HAS_DT)
        else:
            tl.atomic_xchg(slots + s, packed, sem="relaxed")
    else:
        arrived = publish_packed(packed, acc_ptr + b, cnt_ptr + b)
        if arrived == n_split - 1:
            # The counter's acq_rel add above made every chunk's max visible here, so
            # the slot read needs no fence of its own (a default acq_rel exchange costs
            # a MEMBAR.ALL.GPU before it and the counter reset another, both on the
            # critical path); the counter goes back to rest with a plain store (the
            # next launch on the stream is ordered after this one).
            packed = tl.atomic_xchg(acc_ptr + b, PACKED_EMPTY, sem="relaxed")
            _finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map,
                    stride_dt, dt_col, HAS_MAP, HAS_DT)
            tl.store(cnt_ptr + b, 0)


@triton.jit
def _draft_tail_kernel(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr,
                       h_ptr, hout_ptr, acc_ptr, cnt_ptr,
                       R, V, stride_x, stride_rows, stride_map, stride_pos, stride_dt,
                       dt_col, n_split, tiles_per, H, stride_h, h_tiles, h_slice, n_arg,
                       g_ptr, gout_ptr, G, stride_g, g_tiles, n_hid,
                       HAS_ROWS: tl.constexpr, HAS_MAP: tl.constexpr,
                       HAS_POS: tl.constexpr, HAS_DT: tl.constexpr,
                       HAS_HIDDEN: tl.constexpr, ONE_CHUNK: tl.constexpr,
                       SPIN: tl.constexpr, FUSE_H: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                       UNROLL: tl.constexpr, VEC: tl.constexpr, SP: tl.constexpr,
                       PDL: tl.constexpr,
                       HAS_GATHER: tl.constexpr, BLOCK_G: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    if (HAS_HIDDEN and not FUSE_H) or HAS_GATHER:
        if pid < n_arg:
            _argmax_tail(pid, x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr,
                         dt_ptr, h_ptr, hout_ptr, acc_ptr, cnt_ptr, R, V, stride_x,
                         stride_rows, stride_map, stride_pos, stride_dt, dt_col, n_split,
                         tiles_per, H, stride_h, h_slice, HAS_ROWS, HAS_MAP, HAS_POS,
                         HAS_DT, ONE_CHUNK, SPIN, HAS_HIDDEN and FUSE_H, BLOCK_V, BLOCK_H,
                         UNROLL, VEC, SP, PDL)
        elif HAS_GATHER:
            # copy programs: the n_hid hidden tiles first (none when fused or absent),
            # then the gathered rows
            q = pid - n_arg
            if q < n_hid:
                if HAS_HIDDEN and not FUSE_H:
                    _copy_rows(q, rows_ptr, h_ptr, hout_ptr, R, stride_rows, H, stride_h,
                               h_tiles, HAS_ROWS, BLOCK_H, False)
            else:
                _copy_rows(q - n_hid, rows_ptr, g_ptr, gout_ptr, R, stride_rows, G,
                           stride_g, g_tiles, HAS_ROWS, BLOCK_G, True)
        else:
            _copy_rows(pid - n_arg, rows_ptr, h_ptr, hout_ptr, R, stride_rows, H,
                       stride_h, h_tiles, HAS_ROWS, BLOCK_H, False)
    else:
        _argmax_tail(pid, x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr,
                     h_ptr, hout_ptr, acc_ptr, cnt_ptr, R, V, stride_x, stride_rows,
                     stride_map, stride_pos, stride_dt, dt_col, n_split, tiles_per, H,
                     stride_h, h_slice, HAS_ROWS, HAS_MAP, HAS_POS, HAS_DT, ONE_CHUNK,
                     SPIN, HAS_HIDDEN and FUSE_H, BLOCK_V, BLOCK_H, UNROLL, VEC, SP, PDL)


# --- search space and heuristic -------------------------------------------------------
# The shared split-argmax space (BLOCK_V, SPLIT, UNROLL, num_warps) plus:
# * BLOCK_V 256 and 512 and 1-2 warps, for the latency-bound small batches (B <= 8): at
#   B=1 the row is cut into ~60-120 programs of one warp or two, each folding its lanes
#   without shared memory (docs/performance.md, "draft_tail");
# * BLOCK_V = 16384 (a whole 32000-entry bf16 row in one step of one 16-warp program);
# * BLOCK_H, the elements of a hidden row one copy program moves, and FUSE_H: 1 copies
#   the hidden row in the argmax programs instead (slice s of the row by chunk s, its
#   load issued with the first logits tiles and its store before the scan: at B=256 one
#   program a row, 1 us faster than separate copy programs, which find every slot taken
#   by the scan and run after it).
# num_stages has one choice: the loops have no dot, so Triton does not pipeline them
# (sm_90 SASS identical for 1, 2 and 3). A loop under tl.range(num_stages=S), which
# Triton pipelines through cp.async copies to shared memory, was slower on every shape
# timed (docs/performance.md, "draft_tail"), so it is not in the space.
SMALL_B = 8     # the batches where 1-2 warp programs and sub-1024 tiles are searched
SPACE = {
    "BLOCK_V": (256, 512) + tuple(SPLIT_SPACE["BLOCK_V"]) + (16384,),
    "SPLIT": SPLIT_SPACE["SPLIT"],
    "UNROLL": SPLIT_SPACE["UNROLL"],
    "num_warps": (1, 2) + tuple(SPLIT_SPACE["num_warps"]),
    "num_stages": (1,),
    "BLOCK_H": (2048, 4096, 8192),
    "FUSE_H": (0, 1),
}


def _fused_block_h(H: int, split: int) -> int:
    """The hidden tile of a fused program: its slice of the row, a power of two."""
    return next_pow2(cdiv(H, split)) if H > 0 else 1


def _can_fuse(H: int, split: int, num_warps: int) -> bool:
    """Whether the argmax programs can copy the hidden row: there is one, and a slice
    of it is at most 64 elements a thread."""
    return H > 0 and _fused_block_h(H, split) <= 64 * 32 * num_warps


def constraint(config: dict, key: dict) -> bool:
    """The tuner's prune, for performance only (every config of SPACE gives the same
    bits, and the launcher falls back to copy programs where a FUSE_H=1 slice does not
    fit), so an explicit config need only be in SPACE. It admits 4..64 logits elements a
    thread per step; SPLIT up to the first power of two >= the row's tiles (that one is
    a tile a chunk; larger ones would repeat it); UNROLL 2 only with two tiles or more a
    chunk; 1-2 warps and tiles under 1024 only for B <= 8; copy programs: 1..64 hidden
    elements a thread and no tile beyond the row's next power of two (one BLOCK_H when
    H = 0: it is unused); fused copy: a hidden slice of at most 64 elements a thread,
    BLOCK_H at its first value (unused), and only with hidden rows (H > 0)."""
    threads = 32 * config["num_warps"]
    bv, unroll = config["BLOCK_V"], config["UNROLL"]
    if not split_constraint(config, key["V"]) or bv * unroll > 64 * threads:
        return False
    if (config["num_warps"] < 4 or bv < 1024) and key["B"] > SMALL_B:
        return False
    split, tiles_per = split_plan(key["V"], bv, config["SPLIT"])
    if unroll > 1 and tiles_per < 2:
        return False
    bh, H = config["BLOCK_H"], key["H"]
    if config["FUSE_H"]:
        return bh == SPACE["BLOCK_H"][0] and _can_fuse(H, split, config["num_warps"])
    if H <= 0:
        return bh == SPACE["BLOCK_H"][0]
    return threads <= bh <= 64 * threads and bh <= max(SPACE["BLOCK_H"][0], next_pow2(H))


def heuristic(key: dict, device: torch.device) -> dict:
    """The shared split-argmax heuristic measured on the H200 (`split_heuristic`: small
    tiles and chunks for about two programs per SM while the rows cannot fill the GPU,
    else a 16-warp program a row where that loads the SMs evenly, small programs
    elsewhere); the hidden rows copied by the argmax programs when there is a program a
    row and a row for every SM (B=256: 1 us faster), else by copy programs of one
    4096-element tile, or the row when shorter."""
    cfg = split_heuristic(key["dtype"], key["V"], max(1, key["B"]), C.sm_count(device))
    H = key["H"]
    lo = SPACE["BLOCK_H"][0]
    split = split_plan(key["V"], cfg["BLOCK_V"], cfg["SPLIT"])[0]
    fuse = (split == 1 and key["B"] >= C.sm_count(device)
            and _can_fuse(H, split, cfg["num_warps"]))
    cfg["FUSE_H"] = int(fuse)
    cfg["BLOCK_H"] = lo if H <= 0 or fuse else min(4096, max(lo, next_pow2(H)))
    return cfg


def tune_key(dtype: torch.dtype, V: int, B: int, H: int) -> dict:
    """dtype and Vd of the logits, selected rows B, hidden width H (0 without hidden)."""
    return {"dtype": C._dtype_name(dtype), "V": int(V), "B": int(B), "H": int(H)}


def resolve_config(config: dict | None, key: dict, device: torch.device,
                   tables: bool = True) -> dict:
    return C.resolve_config(TUNING, config, key, device, tables)


# --- launcher --------------------------------------------------------------------------
def _gather_block(width: int, itemsize: int, num_warps: int) -> int:
    """The tile of a gathered-row copy program: the row's next power of two, at most
    64 bytes a thread (a tile of BLOCK_G elements moves in one step)."""
    return max(2, min(next_pow2(width), 32 * num_warps * 64 // itemsize))


def launch_draft_tail(logits: torch.Tensor, rows: torch.Tensor | None,
                      hidden: torch.Tensor | None, token_map: torch.Tensor | None,
                      positions: torch.Tensor | None, draft_tokens: torch.Tensor | None,
                      column: int, tokens: torch.Tensor, probs: torch.Tensor,
                      hidden_out: torch.Tensor | None, cfg: dict,
                      gather: tuple | None = None) -> None:
    """Launch on validated tensors (B >= 1, R >= 1, column already in [0, K)).

    gather: None, or (src [R, G], dst [B, G]): a second row gather moved by copy
    programs of the same launch (after the hidden ones), bit for bit, with relay_gather's
    rule: dst[b] = src[rows[b]] when 0 <= rows[b] < R, else zeros. Any dtype of 1, 2, 4
    or 8 bytes (moved as same-size integers); src rows contiguous (any row stride), dst
    contiguous. `recipes.compat.sglang` gathers its DSA top-k indices with it."""
    dev = logits.device
    R, V = logits.shape
    B = tokens.shape[0]
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    H = hidden.shape[1] if hidden is not None else 0
    # an explicit FUSE_H whose slice does not fit falls back to copy programs (same bits)
    fuse = bool(cfg["FUSE_H"]) and _can_fuse(H, split, cfg["num_warps"])
    if fuse:
        h_slice, block_h, h_tiles = cdiv(H, split), _fused_block_h(H, split), 0
    else:
        h_slice, block_h, h_tiles = 0, cfg["BLOCK_H"], cdiv(H, cfg["BLOCK_H"])
    n_hidden = B * h_tiles
    G = gather[0].shape[1] if gather is not None else 0
    dummy = tokens
    g_src = g_dst = dummy
    block_g, g_tiles = 1, 0
    if G > 0:
        size = gather[0].element_size()
        g_src, g_dst = (t.view(C.SAME_SIZE_INT[size]) for t in gather)
        block_g = _gather_block(G, size, cfg["num_warps"])
        g_tiles = cdiv(G, block_g)
    grid = B * split + n_hidden + B * g_tiles
    # The spin finisher needs the whole grid co-resident: at most a program an SM.
    spin = split > 1 and grid <= C.sm_count(dev)
    acc = cnt = tokens              # never read with one chunk a row (see launch_argmax)
    if split > 1:
        acc, cnt = C.WORKSPACE.get(dev, B * split if spin else B, B)
    pdl = C.pdl(dev, grid)
    _draft_tail_kernel[(grid,)](
        logits, rows if rows is not None else dummy,
        token_map if token_map is not None else dummy, tokens, probs,
        positions if positions is not None else dummy,
        draft_tokens if draft_tokens is not None else dummy,
        hidden if H > 0 else dummy, hidden_out if H > 0 else dummy, acc, cnt,
        R, V, logits.stride(0),
        rows.stride(0) if rows is not None else 0,
        token_map.stride(0) if token_map is not None else 0,
        positions.stride(0) if positions is not None else 0,
        draft_tokens.stride(0) if draft_tokens is not None else 0,
        column * draft_tokens.stride(1) if draft_tokens is not None else 0,
        split, tiles_per, H, hidden.stride(0) if H > 0 else 0, max(1, h_tiles), h_slice,
        B * split, g_src, g_dst, G, g_src.stride(0) if G > 0 else 0, max(1, g_tiles),
        n_hidden,
        HAS_ROWS=rows is not None, HAS_MAP=token_map is not None,
        HAS_POS=positions is not None, HAS_DT=draft_tokens is not None,
        HAS_HIDDEN=H > 0, ONE_CHUNK=split == 1, SPIN=spin, FUSE_H=fuse,
        BLOCK_V=cfg["BLOCK_V"], BLOCK_H=block_h, UNROLL=cfg["UNROLL"],
        VEC=lane_vec(logits.element_size(), cfg["BLOCK_V"], cfg["num_warps"]),
        SP=next_pow2(split) if spin else 1, PDL=pdl, HAS_GATHER=G > 0, BLOCK_G=block_g,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl > 0)


def column_error(column: int) -> ValueError:
    """The error of a `column` given without `draft_tokens` (it would be dropped)."""
    return ValueError(f"column: expected only with draft_tokens (it picks the column "
                      f"written), got column={column} without draft_tokens")


def _check_out(out, B: int, hidden, device):
    """out= : a DraftTail (or 3-sequence) whose fields may each be None (allocated)."""
    if out is None:
        return None, None, None
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError("out: expected a DraftTail (tokens, probs, hidden) of preallocated "
                        f"tensors or None fields, got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    tokens, probs, h = out
    if tokens is not None:
        C.check_out("out.tokens", tokens, (B,), torch.int64, device)
    if probs is not None:
        C.check_out("out.probs", probs, (B,), torch.float32, device)
    if h is not None:
        if hidden is None:
            raise ValueError("out.hidden: expected None when hidden is None, got a tensor "
                             f"of shape {tuple(h.shape)}")
        C.check_out("out.hidden", h, (B, hidden.shape[1]), hidden.dtype, device)
    return tokens, probs, h


def draft_tail(logits: torch.Tensor, *, rows: torch.Tensor | None = None,
               hidden: torch.Tensor | None = None, token_map: torch.Tensor | None = None,
               positions: torch.Tensor | None = None,
               draft_tokens: torch.Tensor | None = None, column: int = COLUMN_DEFAULT,
               out: DraftTail | None = None, config: dict | None = None) -> DraftTail:
    """Top-1 tail of a draft step (see the module docstring), in one launch.

    logits [R, Vd] float16/bfloat16/float32 (last dim contiguous, any row stride);
    rows int64 (or int32) [B], default every row; hidden [R, H]; token_map int32/int64
    [Vd]; positions int64 [B] (+= 1 in place); draft_tokens int64 [B, K]
    (draft_tokens[:, column] = tokens in place; column only with draft_tokens). out: a
    DraftTail of preallocated tokens int64 [B], probs float32 [B], hidden [B, H]
    (hidden's dtype) - any field may be None to have it allocated; with every field
    given the call allocates nothing. No written tensor (out=, positions,
    draft_tokens) may share memory with an input or another written one.
    """
    c = check_call(logits, rows, hidden, token_map, positions, draft_tokens, column, out)
    if c.B > 0:
        key = tune_key(logits.dtype, c.V, c.B, 0 if hidden is None else hidden.shape[1])
        launch_draft_tail(logits, rows, hidden, token_map, positions, draft_tokens,
                          c.column, c.out.tokens, c.out.probs, c.out.hidden,
                          resolve_config(config, key, logits.device))
    return c.out


class CheckedCall(NamedTuple):
    B: int              # output rows
    V: int              # logits columns
    column: int         # the draft column, in [0, K) (0 without draft_tokens)
    out: DraftTail      # the outputs, allocated where `out=` left them None


def check_call(logits, rows, hidden, token_map, positions, draft_tokens, column,
               out) -> CheckedCall:
    """`draft_tail`'s argument checks, and its outputs allocated: what a launcher of the
    same kernel (`recipes.compat.sglang`'s draft_topk1, which dispatches on a table of
    its own) runs before `launch_draft_tail`."""
    C.check_tensor("logits", logits, dtypes=C.FLOAT_DTYPES, ndim=2)
    C.check_logits_rows("logits", logits)
    dev = logits.device
    R, V = logits.shape
    if rows is not None:
        C.check_tensor("rows", rows, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
        B = rows.shape[0]
        if B > 0 and R == 0:
            raise ValueError(f"logits: expected at least one row to select {B} rows from, "
                             f"got shape {tuple(logits.shape)}")
    else:
        B = R
    if hidden is not None:
        C.check_tensor("hidden", hidden, dtypes=C.FLOAT_DTYPES, ndim=2, device=dev)
        if hidden.shape[0] != R:
            raise ValueError(f"hidden: expected {R} rows (one per logits row), "
                             f"got shape {tuple(hidden.shape)}")
        if hidden.shape[1] > 1 and hidden.stride(1) != 1:
            raise ValueError("hidden: expected the last dim to be contiguous (stride 1), "
                             f"got strides {hidden.stride()}")
    if token_map is not None:
        C.check_tensor("token_map", token_map, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
        if token_map.shape[0] != V:
            raise ValueError(f"token_map: expected shape ({V},) (one entry per draft id), "
                             f"got {tuple(token_map.shape)}")
    if positions is not None:
        C.check_tensor("positions", positions, dtypes=(torch.int64,), ndim=1, device=dev)
        if positions.shape[0] != B:
            raise ValueError(f"positions: expected shape ({B},), got {tuple(positions.shape)}")
        C.check_written("positions", positions)
    if isinstance(column, bool) or not isinstance(column, int):
        raise TypeError(f"column: expected a Python int, got {type(column).__name__}")
    if draft_tokens is not None:
        C.check_tensor("draft_tokens", draft_tokens, dtypes=(torch.int64,), ndim=2,
                       device=dev)
        K = draft_tokens.shape[1]
        if draft_tokens.shape[0] != B:
            raise ValueError(f"draft_tokens: expected shape ({B}, K), "
                             f"got {tuple(draft_tokens.shape)}")
        C.check_written("draft_tokens", draft_tokens)
        if not -K <= column < K:
            raise ValueError(f"column: expected an index in [{-K}, {K}) for draft_tokens "
                             f"of shape {tuple(draft_tokens.shape)}, got {column}")
        column %= K
    elif column is not COLUMN_DEFAULT:
        raise column_error(column)
    tokens, probs, h_out = _check_out(out, B, hidden, dev)
    C.check_runnable("logits", logits)       # after the device checks: mixed devices
    if out is not None or positions is not None or draft_tokens is not None:
        C.check_no_overlap(
            (("out.tokens", tokens), ("out.probs", probs), ("out.hidden", h_out),
             ("positions", positions), ("draft_tokens", draft_tokens)),
            (("logits", logits), ("rows", rows), ("hidden", hidden),
             ("token_map", token_map)))
    if tokens is None:
        tokens = torch.empty((B,), dtype=torch.int64, device=dev)
    if probs is None:
        probs = torch.empty((B,), dtype=torch.float32, device=dev)
    if hidden is not None and h_out is None:
        h_out = torch.empty((B, hidden.shape[1]), dtype=hidden.dtype, device=dev)
    return CheckedCall(B, V, 0 if draft_tokens is None else column,
                       DraftTail(tokens, probs, h_out))


draft_tail.reference = reference


# --- what dispatch knows (read by the autotuner too) ---------------------------------
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_draft_tail_kernel, _argmax_tail, _copy_rows, _finish, _selected_row,
             chunk_first, chunk_scan, publish_packed, spin_collect, C.pdl_enter,
             C.pdl_release, launch_draft_tail))
