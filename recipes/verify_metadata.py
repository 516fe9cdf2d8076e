"""verify_metadata: the attention "head" metadata of a target-verify step, one launch.

Per request b (B requests, N = num_tokens verify tokens each), with
L_b = seq_lens[b] (tokens already cached), r_b = req_pool_indices[b] and
req_to_token int32 [P, C] (any strides):

    kv_start_b = 0                                  (no window)
               = floor(max(0, L_b + N - window) / page_size) * page_size
    seqlens_k[b]    = L_b + N - kv_start_b
    pages_b         = min(ceil(seqlens_k[b] / page_size), max_pages)
    positions[b*N + j]      = L_b + j                               int64 [B*N]
    out_cache_loc[b*N + j]  = req_to_token[r_b, L_b + j]            int64 [B*N]
    cu_seqlens_q[b]  = b*N,  cu_seqlens_k = [0, cumsum(seqlens_k)]  int32 [B+1]
    max_seqlen_k     = [max_b seqlens_k[b]] (0 when B = 0)          int32 [1]
    page_table[b, p] = req_to_token[r_b, kv_start_b + p*page_size] // page_size
                       for p < pages_b, else -1                     int32 [B, max_pages]
    kv_indptr        = [0, cumsum(pages_b)]                         int32 [B+1]
    kv_indices[kv_indptr[b] + p] = page_table[b, p] for p < pages_b int32 [B*max_pages]
    kv_last_page_len[b] = seqlens_k[b] - (ceil(seqlens_k[b]/page_size) - 1) * page_size
                        = (seqlens_k[b] - 1) % page_size + 1                int32 [B]

`//` is floor division (torch's, so a negative slot id -1 maps to page -1). max_pages
defaults to ceil(C / page_size). layout "fa3" fills page_table, "flashinfer" fills
kv_indptr/kv_indices/kv_last_page_len, "both" fills all; the fields of a layout not
asked for are None. kv_indices entries at and past kv_indptr[B] are unspecified (the
kernel leaves them untouched; `reference` writes -1 there).

Out-of-range values (callers guarantee 0 <= L_b and L_b + N <= C and 0 <= r_b < P;
these rules only make a broken caller safe and deterministic):
  * seq_lens are clamped first: L_b := min(max(L_b, 0), max(C - N, 0)); every output
    (positions included) is computed from the clamped value.
  * a slot lookup req_to_token[r, c] with r outside [0, P) or c outside [0, C) reads -1
    (so out_cache_loc is -1 and the page id is -1 // page_size = -1). c >= C happens only
    when N > C.
  * a request needing more than max_pages pages keeps its first max_pages pages:
    pages_b is clamped to max_pages (page_table row full, kv_indptr counts the clamped
    lists), kv_last_page_len still follows the unclamped seqlens_k.
  * sums are int32: cu_seqlens_k (and cu_seqlens_q) wrap modulo 2^32 exactly as torch's
    int64 cumsum followed by .to(int32) does (only reachable past 2^31 total tokens).

Kernel: one launch on a (B + 1, SPLIT) grid. Program (b, s) for b < B handles request b:
it loads r_b and L_b, and program (b, 0) writes the request's N positions and
out_cache_loc; every (b, s) fills its share of the request's page-table row (tiles of
BLOCK_P pages, gathered from req_to_token with stride page_size) and, for the
flashinfer layout, the same page ids into kv_indices at kv_indptr[b] + p, where the
program computes kv_indptr[b] itself by summing pages over seq_lens[:b] (BLOCK_B at a
time; B is at most a few thousand, so these O(B) reads from L2 are cheap). Program
(B, 0) is the batch program: it loops over the whole batch in BLOCK_B blocks and writes
seqlens_k, cu_seqlens_q, cu_seqlens_k (tl.cumsum + carry), max_seqlen_k, kv_indptr and
kv_last_page_len. All sums are exact integer sums, so every config gives the same
bits. No host sync; B = 0 still launches the batch program once (the [1]-shaped
prefix/max outputs must be written) so that a call with out= buffers allocates nothing
and is graph capturable at any B.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _common as C
from ._argmax_core import split_plan
from ._tuning import Tuning

NAME = "verify_metadata"
LAYOUTS = ("fa3", "flashinfer", "both")
INT32_MAX = 2**31 - 1


class VerifyMetadata(NamedTuple):
    """Outputs of `verify_metadata`, in this order (fields of a layout not asked for are
    None). Also the type of `out=`: build one with preallocated tensors (any field may be
    None, to be allocated), e.g. the result of an earlier call."""
    positions: torch.Tensor | None = None         # int64 [B*N]
    out_cache_loc: torch.Tensor | None = None     # int64 [B*N]
    seqlens_k: torch.Tensor | None = None         # int32 [B]
    cu_seqlens_q: torch.Tensor | None = None      # int32 [B+1]
    cu_seqlens_k: torch.Tensor | None = None      # int32 [B+1]
    max_seqlen_k: torch.Tensor | None = None      # int32 [1]
    page_table: torch.Tensor | None = None        # int32 [B, max_pages]   (fa3, both)
    kv_indptr: torch.Tensor | None = None         # int32 [B+1]            (flashinfer, both)
    kv_indices: torch.Tensor | None = None        # int32 [B*max_pages]    (flashinfer, both)
    kv_last_page_len: torch.Tensor | None = None  # int32 [B]              (flashinfer, both)


_COMMON = ("positions", "out_cache_loc", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k",
           "max_seqlen_k")
_FA3 = ("page_table",)
_FI = ("kv_indptr", "kv_indices", "kv_last_page_len")


def _fields(layout: str) -> tuple:
    return _COMMON + (_FA3 if layout in ("fa3", "both") else ()) \
        + (_FI if layout in ("flashinfer", "both") else ())


def _default_max_pages(C_: int, page_size: int) -> int:
    return -(-C_ // page_size)


# --- the semantics in plain torch ------------------------------------------------------
def reference(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
              req_to_token: torch.Tensor, num_tokens: int, *, page_size: int = 1,
              window: int | None = None, max_pages: int | None = None,
              layout: str = "fa3") -> VerifyMetadata:
    """The semantics (see the module docstring), out-of-range rules included.
    kv_indices entries past kv_indptr[B] are -1 here (unspecified by the contract)."""
    dev = req_to_token.device
    B = req_pool_indices.shape[0]
    P, Cap = req_to_token.shape
    N, ps = int(num_tokens), int(page_size)
    mp = _default_max_pages(Cap, ps) if max_pages is None else int(max_pages)
    i64 = torch.int64
    r = req_pool_indices.to(i64)
    L = seq_lens.to(i64).clamp(0, max(Cap - N, 0))

    def lookup(cols):  # req_to_token[r_b, cols[b, k]] as int64, -1 outside the table
        ok = (r[:, None] >= 0) & (r[:, None] < P) & (cols >= 0) & (cols < Cap)
        if P == 0 or Cap == 0:
            return torch.full(cols.shape, -1, dtype=i64, device=dev)
        v = req_to_token[r.clamp(0, P - 1)[:, None], cols.clamp(0, Cap - 1)].to(i64)
        return torch.where(ok, v, torch.full_like(v, -1))

    j = torch.arange(N, device=dev, dtype=i64)
    pos = L[:, None] + j[None, :]
    positions = pos.reshape(-1)
    out_cache_loc = lookup(pos).reshape(-1)
    if window is None:
        kv_start = torch.zeros_like(L)
    else:
        kv_start = torch.div((L + N - int(window)).clamp(min=0), ps,
                             rounding_mode="floor") * ps
    seqk = L + N - kv_start
    pages = torch.div(seqk + ps - 1, ps, rounding_mode="floor").clamp(max=mp)
    zero = torch.zeros(1, dtype=i64, device=dev)
    i32 = torch.int32
    res = {
        "positions": positions,
        "out_cache_loc": out_cache_loc,
        "seqlens_k": seqk.to(i32),
        "cu_seqlens_q": (torch.arange(B + 1, device=dev, dtype=i64) * N).to(i32),
        "cu_seqlens_k": torch.cat([zero, torch.cumsum(seqk, 0)]).to(i32),
        "max_seqlen_k": (seqk.max().reshape(1) if B > 0 else zero).to(i32),
    }
    p = torch.arange(mp, device=dev, dtype=i64)
    valid = p[None, :] < pages[:, None]
    ids = torch.div(lookup(kv_start[:, None] + p[None, :] * ps), ps, rounding_mode="floor")
    if layout in ("fa3", "both"):
        res["page_table"] = torch.where(valid, ids, torch.full_like(ids, -1)).to(i32)
    if layout in ("flashinfer", "both"):
        res["kv_indptr"] = torch.cat([zero, torch.cumsum(pages, 0)]).to(i32)
        kv_indices = torch.full((B * mp,), -1, dtype=i32, device=dev)
        flat = ids[valid].to(i32)                 # b-major, p ascending
        kv_indices[: flat.numel()] = flat
        res["kv_indices"] = kv_indices
        res["kv_last_page_len"] = ((seqk - 1) % ps + 1).to(i32)
    return VerifyMetadata(**res)


def engine_torch(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 req_to_token: torch.Tensor, num_tokens: int, *, page_size: int = 1,
                 window: int | None = None, max_pages: int | None = None,
                 layout: str = "fa3") -> VerifyMetadata:
    """The torch sequence a serving engine runs for this metadata (arange, gather,
    cumsum, page-table slice), in fixed shapes so it can be graph captured. The peer in
    benchmarks. Equal to `reference` for in-range inputs (0 <= L_b, L_b + N <= C, valid
    r_b, pages within max_pages); it has no out-of-range rules."""
    dev = req_to_token.device
    B = req_pool_indices.shape[0]
    P, Cap = req_to_token.shape
    N, ps = int(num_tokens), int(page_size)
    mp = _default_max_pages(Cap, ps) if max_pages is None else int(max_pages)
    rpi = req_pool_indices.to(torch.int64)
    positions = (seq_lens.to(torch.int64)[:, None]
                 + torch.arange(N, device=dev, dtype=torch.int64)).reshape(-1)
    out_cache_loc = req_to_token[rpi[:, None], positions.view(B, N)].to(torch.int64) \
        .reshape(-1)
    seqk = (seq_lens + N).to(torch.int32)
    if window is None:
        kv_start = None
    else:
        kv_start = ((seq_lens.to(torch.int32) + N - window).clamp(min=0) // ps) * ps
        seqk = seqk - kv_start
    cu_q = torch.arange(0, (B + 1) * N, N, device=dev, dtype=torch.int32)
    cu_k = torch.nn.functional.pad(torch.cumsum(seqk, 0, dtype=torch.int32), (1, 0))
    max_k = seqk.max().reshape(1) if B > 0 else torch.zeros(1, dtype=torch.int32, device=dev)
    res = dict(positions=positions, out_cache_loc=out_cache_loc, seqlens_k=seqk,
               cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_k=max_k)
    rows = req_to_token[rpi]                                   # [B, C]: the request rows
    cols = torch.arange(mp, device=dev, dtype=torch.int64) * ps
    if kv_start is None:
        cols = cols.clamp(max=Cap - 1)
        strided = rows[:, cols]                                # the page-table slice
    else:
        strided = rows.gather(1, (kv_start.to(torch.int64)[:, None] + cols).clamp(max=Cap - 1))
    pages = (seqk + ps - 1) // ps
    valid = torch.arange(mp, device=dev)[None, :] < pages[:, None]
    ids = torch.where(valid, strided // ps, -1)
    if layout in ("fa3", "both"):
        res["page_table"] = ids
    if layout in ("flashinfer", "both"):
        indptr = torch.nn.functional.pad(torch.cumsum(pages, 0, dtype=torch.int32), (1, 0))
        dest = indptr[:-1, None].to(torch.int64) + torch.arange(mp, device=dev)
        dest = torch.where(valid, dest, B * mp)                # invalid -> a dropped slot
        buf = torch.full((B * mp + 1,), -1, dtype=torch.int32, device=dev)
        buf.scatter_(0, dest.reshape(-1), ids.reshape(-1))
        res["kv_indptr"] = indptr
        res["kv_indices"] = buf[: B * mp]
        res["kv_last_page_len"] = seqk - (pages - 1) * ps
    return VerifyMetadata(**res)


# --- kernel ----------------------------------------------------------------------------
@triton.jit
def _page_of(x, PAGE: tl.constexpr):
    """floor(x / PAGE) of int32 x (torch's `//`), dividing only non-negative numbers:
    for x < 0, floor(x / P) = ~(~x // P) with ~x = -x - 1 >= 0."""
    if PAGE == 1:
        return x
    else:
        neg = x < 0
        q = tl.where(neg, ~x, x) // PAGE
        return tl.where(neg, ~q, q)


@triton.jit
def _geometry(L, N, L_hi, window, max_pages, PAGE: tl.constexpr, WINDOW: tl.constexpr):
    """(clamped L, kv_start, seqlens_k, pages clamped to max_pages), all int32."""
    Lc = tl.minimum(tl.maximum(L, 0), L_hi).to(tl.int32)
    end = Lc + N
    if WINDOW:
        kv_start = (tl.maximum(end - window, 0) // PAGE) * PAGE
    else:
        kv_start = Lc * 0
    seqk = end - kv_start
    pages = tl.minimum((seqk + (PAGE - 1)) // PAGE, max_pages)
    return Lc, kv_start, seqk, pages


@triton.jit
def _verify_metadata_kernel(
        rpi_ptr, sl_ptr, r2t_ptr, stride_rpi, stride_sl, stride_r, stride_c,
        B, P, Cap, N, L_hi, window, max_pages, n_tiles, tiles_per,
        pos_ptr, loc_ptr, seqk_ptr, cuq_ptr, cuk_ptr, maxk_ptr,
        pt_ptr, indptr_ptr, idx_ptr, last_ptr,
        PAGE: tl.constexpr, WINDOW: tl.constexpr, FA3: tl.constexpr, FI: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
        PDL: tl.constexpr):
    C.pdl_enter(PDL)
    b = tl.program_id(0)
    s = tl.program_id(1)
    lanes_b = tl.arange(0, BLOCK_B)
    if b == B:
        # the batch program: per-request scalars, prefix sums and the max
        if s == 0:
            carry_k = tl.full([], 0, tl.int32)
            carry_p = tl.full([], 0, tl.int32)
            top = tl.full([], 0, tl.int32)
            for i in range(0, tl.cdiv(B, BLOCK_B)):
                offs = i * BLOCK_B + lanes_b
                m = offs < B
                L = tl.load(sl_ptr + offs.to(tl.int64) * stride_sl, mask=m, other=0)
                Lc, kv_start, seqk, pages = _geometry(L, N, L_hi, window, max_pages,
                                                      PAGE, WINDOW)
                seqk = tl.where(m, seqk, 0)
                tl.store(seqk_ptr + offs, seqk, mask=m)
                tl.store(cuq_ptr + 1 + offs, (offs + 1) * N, mask=m)
                tl.store(cuk_ptr + 1 + offs, tl.cumsum(seqk, 0) + carry_k, mask=m)
                carry_k += tl.sum(seqk, 0)
                top = tl.maximum(top, tl.max(seqk, 0))
                if FI:
                    pages = tl.where(m, pages, 0)
                    tl.store(indptr_ptr + 1 + offs, tl.cumsum(pages, 0) + carry_p, mask=m)
                    carry_p += tl.sum(pages, 0)
                    tl.store(last_ptr + offs, (seqk - 1) % PAGE + 1, mask=m)
            tl.store(cuq_ptr, 0)
            tl.store(cuk_ptr, 0)
            tl.store(maxk_ptr, top)
            if FI:
                tl.store(indptr_ptr, 0)
    else:
        b64 = b.to(tl.int64)
        r = tl.load(rpi_ptr + b64 * stride_rpi).to(tl.int64)
        L = tl.load(sl_ptr + b64 * stride_sl)
        Lc, kv_start, seqk, pages = _geometry(L, N, L_hi, window, max_pages, PAGE, WINDOW)
        row_ok = (r >= 0) & (r < P)
        row_ptr = r2t_ptr + tl.where(row_ok, r, 0) * stride_r
        if s == 0:
            j = tl.arange(0, BLOCK_N)
            col = Lc + j
            mj = j < N
            tl.store(pos_ptr + b64 * N + j, col.to(tl.int64), mask=mj)
            loc = tl.load(row_ptr + col.to(tl.int64) * stride_c,
                          mask=mj & row_ok & (col < Cap), other=-1)
            tl.store(loc_ptr + b64 * N + j, loc.to(tl.int64), mask=mj)
        base = tl.full([], 0, tl.int32)
        if FI:
            # kv_indptr[b]: this request's offset in kv_indices
            for i in range(0, tl.cdiv(b, BLOCK_B)):
                offs = i * BLOCK_B + lanes_b
                m = offs < b
                Ls = tl.load(sl_ptr + offs.to(tl.int64) * stride_sl, mask=m, other=0)
                _, _, _, pg = _geometry(Ls, N, L_hi, window, max_pages, PAGE, WINDOW)
                base += tl.sum(tl.where(m, pg, 0), 0)
        t_lo = s * tiles_per
        t_hi = tl.minimum(t_lo + tiles_per, n_tiles)
        if not FA3:
            t_hi = tl.minimum(t_hi, tl.cdiv(pages, BLOCK_P))   # no -1 row to write
        lanes = tl.arange(0, BLOCK_P)
        for t in range(t_lo, t_hi):
            p = t * BLOCK_P + lanes
            valid = p < pages
            col = kv_start + p * PAGE
            x = tl.load(row_ptr + col.to(tl.int64) * stride_c,
                        mask=valid & row_ok & (col < Cap), other=-1)
            ids = _page_of(x, PAGE)
            if FA3:
                tl.store(pt_ptr + b64 * max_pages + p, tl.where(valid, ids, -1),
                         mask=p < max_pages)
            if FI:
                tl.store(idx_ptr + base.to(tl.int64) + p, ids, mask=valid)


# --- search space and heuristic -------------------------------------------------------
# BLOCK_P: pages per tile; SPLIT: programs per request along the page row (clamped to the
# tiles); BLOCK_B: requests per step of the prefix loops (clamped to the batch).
SPACE = {
    "BLOCK_P": (128, 256, 512, 1024, 2048, 4096),
    "SPLIT": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "BLOCK_B": (32, 128, 512, 2048),
    "num_warps": (1, 2, 4, 8),
    "num_stages": (1,),          # the tile loops have runtime bounds and one gather each
}


def _block_b(cfg_block_b: int, B: int) -> int:
    return max(16, min(int(cfg_block_b), C.next_pow2(max(B, 1))))


def constraint(config: dict, key: dict) -> bool:
    """The tuner's prune, for performance only (SPLIT and BLOCK_B are clamped to the call
    and every config of SPACE gives the same bits), so an explicit config need only be
    in SPACE. 1 to 32 pages a thread and at most 16 requests a thread in the prefix
    loops (no register spills on sm_90); SPLIT at most the tiles rounded up to a power
    of two and BLOCK_B no larger than the batch needs (larger ones run exactly like a
    smaller one)."""
    lanes = 32 * config["num_warps"]
    if not lanes <= config["BLOCK_P"] <= 32 * lanes:
        return False
    if _block_b(config["BLOCK_B"], key["B"]) > 16 * lanes:
        return False
    if config["SPLIT"] > C.next_pow2(C.cdiv(key["max_pages"], config["BLOCK_P"])):
        return False
    smallest = min(SPACE["BLOCK_B"])
    return config["BLOCK_B"] == smallest or config["BLOCK_B"] <= C.next_pow2(max(key["B"], 1))


def heuristic(key: dict, device: torch.device) -> dict:
    """Tiles of 256 gathered pages for short rows (page 64: 2560 pages of 160K tokens
    over ~10 programs), 1024 for long rows; about four programs per SM over the batch."""
    mp, B = max(1, key["max_pages"]), max(1, key["B"])
    block = 256 if mp <= 8192 else 1024
    warps = 4
    want = C.cdiv(4 * C.sm_count(device), B)
    split = min(C.next_pow2(want), 256, C.next_pow2(C.cdiv(mp, block)))
    block_b = max(v for v in SPACE["BLOCK_B"] if v <= max(32, min(512, C.next_pow2(B))))
    return {"BLOCK_P": block, "SPLIT": split, "BLOCK_B": block_b, "num_warps": warps,
            "num_stages": 1}


def tune_key(layout: str, page_size: int, B: int, max_pages: int) -> dict:
    return {"layout": layout, "page_size": int(page_size), "B": int(B),
            "max_pages": int(max_pages)}


def resolve_config(config: dict | None, key: dict, device: torch.device) -> dict:
    return C.resolve_config(TUNING, config, key, device)


# --- launcher --------------------------------------------------------------------------
def _validate(req_pool_indices, seq_lens, req_to_token, num_tokens, page_size, window,
              max_pages, layout):
    C.check_tensor("req_pool_indices", req_pool_indices, dtypes=C.INDEX_DTYPES, ndim=1)
    dev = req_pool_indices.device
    C.check_tensor("seq_lens", seq_lens, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    C.check_tensor("req_to_token", req_to_token, dtypes=(torch.int32,), ndim=2, device=dev)
    C.check_runnable("req_pool_indices", req_pool_indices)   # mixed devices: ValueError
    if seq_lens.shape != req_pool_indices.shape:
        raise ValueError(f"seq_lens: expected shape {tuple(req_pool_indices.shape)} (that of "
                         f"req_pool_indices), got {tuple(seq_lens.shape)}")
    num_tokens = C.check_int("num_tokens", num_tokens, 1, C.MAX_BLOCK,
                             why="a request's verify tokens are one Triton block")
    page_size = C.check_int("page_size", page_size, 1)
    window = C.check_int("window", window, 1, none_ok=True)
    max_pages = C.check_int("max_pages", max_pages, 0, INT32_MAX, none_ok=True,
                            why="page-table offsets are int32")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, "
                         f"got {layout!r}")
    B = req_pool_indices.shape[0]
    Cap = req_to_token.shape[1]
    if Cap + num_tokens > INT32_MAX:
        raise ValueError(f"req_to_token: expected a capacity C with C + num_tokens < 2^31, "
                         f"got C={Cap}, num_tokens={num_tokens}")
    # a request's tokens (at most max(C, N)) round up to whole pages in int32
    C.check_int("page_size", page_size, 1, INT32_MAX + 1 - max(Cap, num_tokens),
                why=f"max(C, num_tokens) + page_size <= 2^31 with C={Cap}: int32 page "
                    "arithmetic")
    mp = _default_max_pages(Cap, page_size) if max_pages is None else max_pages
    if B * mp > INT32_MAX:
        raise ValueError(f"max_pages: expected batch x max_pages < 2^31 (int32 page "
                         f"offsets), got {B} x {mp}")
    return dev, B, Cap, mp, num_tokens, page_size, window


def _outputs(out, layout, B, N, mp, dev) -> tuple[dict, list]:
    shapes = {"positions": ((B * N,), torch.int64), "out_cache_loc": ((B * N,), torch.int64),
              "seqlens_k": ((B,), torch.int32), "cu_seqlens_q": ((B + 1,), torch.int32),
              "cu_seqlens_k": ((B + 1,), torch.int32), "max_seqlen_k": ((1,), torch.int32),
              "page_table": ((B, mp), torch.int32), "kv_indptr": ((B + 1,), torch.int32),
              "kv_indices": ((B * mp,), torch.int32),
              "kv_last_page_len": ((B,), torch.int32)}
    if out is not None and not isinstance(out, VerifyMetadata):
        raise TypeError(f"out: expected a VerifyMetadata (of preallocated tensors, fields may "
                        f"be None) or None, got {type(out).__name__}")
    want = _fields(layout)
    res = {}
    given = []                           # (name, buffer) of the out= buffers passed
    for f in VerifyMetadata._fields:
        buf = None if out is None else getattr(out, f)
        if f not in want:
            if buf is not None:
                raise ValueError(f"out.{f}: layout {layout!r} does not produce {f}; "
                                 f"expected None, got a tensor")
            continue
        shape, dtype = shapes[f]
        if buf is None:
            buf = torch.empty(shape, dtype=dtype, device=dev)
        else:
            C.check_out(f"out.{f}", buf, shape, dtype, dev)
            given.append((f"out.{f}", buf))
        res[f] = buf
    return res, given


def launch_verify_metadata(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                           req_to_token: torch.Tensor, N: int, page_size: int,
                           window: int | None, mp: int, layout: str, o: dict,
                           cfg: dict) -> None:
    """Launch on validated inputs and output buffers `o` (a field -> tensor dict)."""
    B = req_pool_indices.shape[0]
    P, Cap = req_to_token.shape
    fa3 = layout in ("fa3", "both")
    fi = layout in ("flashinfer", "both")
    block_p = int(cfg["BLOCK_P"])
    n_tiles = C.cdiv(mp, block_p)
    split, tiles_per = split_plan(max(mp, 1), block_p, cfg["SPLIT"])   # mp = 0: one tile
    dummy = o["positions"] if o["positions"].numel() else o["cu_seqlens_q"]
    win = 0 if window is None else min(int(window), Cap + N)   # larger windows act alike
    pdl = C.pdl(req_pool_indices.device)   # short programs: release at start, any grid
    _verify_metadata_kernel[(B + 1, split)](
        req_pool_indices, seq_lens, req_to_token, req_pool_indices.stride(0),
        seq_lens.stride(0), req_to_token.stride(0), req_to_token.stride(1),
        B, P, Cap, N, max(Cap - N, 0), win, mp, n_tiles, tiles_per,
        o["positions"], o["out_cache_loc"], o["seqlens_k"], o["cu_seqlens_q"],
        o["cu_seqlens_k"], o["max_seqlen_k"],
        o.get("page_table", dummy), o.get("kv_indptr", dummy), o.get("kv_indices", dummy),
        o.get("kv_last_page_len", dummy),
        PAGE=int(page_size), WINDOW=window is not None, FA3=fa3, FI=fi,
        BLOCK_P=block_p, BLOCK_B=_block_b(cfg["BLOCK_B"], B),
        BLOCK_N=max(2, C.next_pow2(N)), PDL=pdl,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), launch_pdl=pdl > 0)


def verify_metadata(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                    req_to_token: torch.Tensor, num_tokens: int, *, page_size: int = 1,
                    window: int | None = None, max_pages: int | None = None,
                    layout: str = "fa3", out: VerifyMetadata | None = None,
                    config: dict | None = None) -> VerifyMetadata:
    """Attention metadata of a target-verify step (N = num_tokens tokens per request) in
    one launch; see the module docstring for every field and the out-of-range rules.

    req_pool_indices, seq_lens: int32/int64 [B] (any stride); req_to_token: int32 [P, C]
    (any strides). layout: "fa3" (page_table), "flashinfer" (kv_indptr, kv_indices,
    kv_last_page_len) or "both". out: a VerifyMetadata of preallocated contiguous
    tensors (exact shapes and dtypes; a field may be None to allocate it; fields of a
    layout not asked for must be None); with every field of the layout given, the
    call allocates nothing, and the returned tuple holds those very tensors.
    """
    dev, B, Cap, mp, num_tokens, page_size, window = _validate(
        req_pool_indices, seq_lens, req_to_token, num_tokens, page_size, window, max_pages,
        layout)
    o, given = _outputs(out, layout, B, num_tokens, mp, dev)
    if given:                            # out= buffers share no memory with the inputs
        C.check_no_overlap(given, (("req_pool_indices", req_pool_indices),
                                   ("seq_lens", seq_lens), ("req_to_token", req_to_token)))
    cfg = resolve_config(config, tune_key(layout, page_size, B, mp), dev)
    launch_verify_metadata(req_pool_indices, seq_lens, req_to_token, num_tokens, page_size,
                           window, mp, layout, o, cfg)
    return VerifyMetadata(**o)


# --- what dispatch knows (read by the autotuner too) ---------------------------------
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_verify_metadata_kernel, _geometry, _page_of, launch_verify_metadata))


verify_metadata.reference = reference
