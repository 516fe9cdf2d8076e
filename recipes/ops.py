"""Every public recipe as a torch custom op (`torch.library`), namespace `spec_cookbook`.

A custom op is opaque to `torch.compile`: Dynamo records one node for it (no graph break,
no tracing into the launcher's Python), and the fake ("meta") implementation below tells
the compiler the output shapes and dtypes without running a kernel. Ops that write into
their arguments declare them in `mutates_args`, so functionalization keeps the writes.
The kernels never synchronise with the host, so compiled graphs that call them can also
be captured as CUDA graphs (`torch.compile(mode="reduce-overhead")`).

    torch.ops.spec_cookbook.argmax(logits) -> Tensor
    torch.ops.spec_cookbook.chain_verify(logits, draft_tokens, temperature, seeds,
                                         positions) -> (tokens, accept_len, bonus, select_index)
    torch.ops.spec_cookbook.draft_tail(logits, rows, hidden, token_map, positions,
                                       draft_tokens, column) -> (tokens, probs, hidden)
                                       # column: an int, or None for the default
    torch.ops.spec_cookbook.relay_scatter(index, srcs, dsts) -> ()        # writes dsts
    torch.ops.spec_cookbook.relay_gather(index, srcs, dsts) -> ()         # writes dsts
    torch.ops.spec_cookbook.verify_metadata(req_pool_indices, seq_lens, req_to_token,
                                            num_tokens, page_size, window, max_pages,
                                            layout) -> 10 tensors (SPEC order)
    torch.ops.spec_cookbook.copy_inputs(srcs, dsts) -> ()                 # writes dsts

Ops return plain tuples of tensors. A field that the recipe returns as None (the hidden
rows when `hidden` is None; the fields of a `verify_metadata` layout not asked for) is
an empty tensor in the op. The Python wrappers of this module (`ops.argmax`,
`ops.chain_verify`, ...) take the public functions' arguments (minus `out=`/`config=`:
a compiled call always dispatches its launch configuration from the tuned table) and
give back the same NamedTuples with the same Nones, so

    from recipes import ops
    step = torch.compile(lambda x, d: ops.chain_verify(x, d), fullgraph=True)

is a drop-in for `recipes.chain_verify` inside compiled code. Outputs equal the eager
recipes' bit for bit (they run the same kernels).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .argmax import argmax as _argmax
from .chain_verify import VerifyResult
from .chain_verify import chain_verify as _chain_verify
from .copy_inputs import copy_inputs as _copy_inputs
from .draft_tail import DraftTail, column_error
from .draft_tail import draft_tail as _draft_tail
from .relay import relay_gather as _relay_gather
from .relay import relay_scatter as _relay_scatter
from .verify_metadata import VerifyMetadata
from .verify_metadata import verify_metadata as _verify_metadata

NAMESPACE = "spec_cookbook"
_LIB = f"{NAMESPACE}::"


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


# --- argmax ----------------------------------------------------------------------------
@torch.library.custom_op(_LIB + "argmax", mutates_args=())
def _argmax_op(logits: torch.Tensor) -> torch.Tensor:
    return _argmax(logits)


@_argmax_op.register_fake
def _(logits):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """`recipes.argmax` as a custom op: int64 [R]."""
    return torch.ops.spec_cookbook.argmax(logits)


# --- chain_verify ----------------------------------------------------------------------
@torch.library.custom_op(_LIB + "chain_verify", mutates_args=())
def _chain_verify_op(logits: torch.Tensor, draft_tokens: torch.Tensor,
                     temperature: Optional[torch.Tensor] = None,
                     seeds: Optional[torch.Tensor] = None,
                     positions: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r = _chain_verify(logits, draft_tokens, temperature=temperature, seeds=seeds,
                      positions=positions)
    return tuple(r)                # fresh tensors (out=None): no alias of an input


@_chain_verify_op.register_fake
def _(logits, draft_tokens, temperature=None, seeds=None, positions=None):
    B, K = draft_tokens.shape
    new = logits.new_empty
    return (new((B, K + 1), dtype=torch.int32), new((B,), dtype=torch.int32),
            new((B,), dtype=torch.int32), new((B,), dtype=torch.int64))


def chain_verify(logits: torch.Tensor, draft_tokens: torch.Tensor, *,
                 temperature: torch.Tensor | None = None, seeds: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None) -> VerifyResult:
    """`recipes.chain_verify` as a custom op: a `VerifyResult`."""
    return VerifyResult(*torch.ops.spec_cookbook.chain_verify(
        logits, draft_tokens, temperature, seeds, positions))


# --- draft_tail ------------------------------------------------------------------------
@torch.library.custom_op(_LIB + "draft_tail", mutates_args=("positions", "draft_tokens"))
def _draft_tail_op(logits: torch.Tensor, rows: Optional[torch.Tensor] = None,
                   hidden: Optional[torch.Tensor] = None,
                   token_map: Optional[torch.Tensor] = None,
                   positions: Optional[torch.Tensor] = None,
                   draft_tokens: Optional[torch.Tensor] = None,
                   column: Optional[int] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _draft_tail_impl(logits, rows, hidden, token_map, positions, draft_tokens, column)


def _draft_tail_impl(logits, rows, hidden, token_map, positions, draft_tokens, column):
    """The body of both draft_tail ops (one op must not call the other: torch 2.11's
    in-place bookkeeping of the mutating op fails when it is entered from another op).
    `column=None` is the recipe's default (so a column given without draft_tokens still
    raises there)."""
    kw = {} if column is None else {"column": column}
    r = _draft_tail(logits, rows=rows, hidden=hidden, token_map=token_map,
                    positions=positions, draft_tokens=draft_tokens, **kw)
    h = r.hidden if r.hidden is not None else _empty(logits)
    return r.tokens, r.probs, h    # fresh tensors (out=None): no alias of an input


@_draft_tail_op.register_fake
def _(logits, rows=None, hidden=None, token_map=None, positions=None, draft_tokens=None,
      column=None):
    B = logits.shape[0] if rows is None else rows.shape[0]
    tokens = logits.new_empty((B,), dtype=torch.int64)
    probs = logits.new_empty((B,), dtype=torch.float32)
    h = _empty(logits) if hidden is None else hidden.new_empty((B, hidden.shape[1]))
    return tokens, probs, h


@torch.library.custom_op(_LIB + "draft_tail_pure", mutates_args=())
def _draft_tail_pure_op(logits: torch.Tensor, rows: Optional[torch.Tensor] = None,
                        hidden: Optional[torch.Tensor] = None,
                        token_map: Optional[torch.Tensor] = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _draft_tail_impl(logits, rows, hidden, token_map, None, None, None)


@_draft_tail_pure_op.register_fake
def _(logits, rows=None, hidden=None, token_map=None):
    B = logits.shape[0] if rows is None else rows.shape[0]
    h = _empty(logits) if hidden is None else hidden.new_empty((B, hidden.shape[1]))
    return (logits.new_empty((B,), dtype=torch.int64),
            logits.new_empty((B,), dtype=torch.float32), h)


def draft_tail(logits: torch.Tensor, *, rows: torch.Tensor | None = None,
               hidden: torch.Tensor | None = None, token_map: torch.Tensor | None = None,
               positions: torch.Tensor | None = None,
               draft_tokens: torch.Tensor | None = None,
               column: int | None = None) -> DraftTail:
    """`recipes.draft_tail` as a custom op (writes `positions`/`draft_tokens` in place):
    a `DraftTail`, whose `hidden` is None when `hidden` is None. Without in-place
    arguments it calls a variant that declares no mutation (torch 2.11's Dynamo failed
    on mutated optional arguments passed as None). `column`
    (default None: the recipe's 0) is only for `draft_tokens`, as in the recipe."""
    if column is not None and draft_tokens is None:
        raise column_error(column)
    if positions is None and draft_tokens is None:
        tokens, probs, h = torch.ops.spec_cookbook.draft_tail_pure(logits, rows, hidden,
                                                                   token_map)
        return DraftTail(tokens, probs, None if hidden is None else h)
    tokens, probs, h = torch.ops.spec_cookbook.draft_tail(
        logits, rows, hidden, token_map, positions, draft_tokens, column)
    return DraftTail(tokens, probs, None if hidden is None else h)


# --- relay -----------------------------------------------------------------------------
@torch.library.custom_op(_LIB + "relay_scatter", mutates_args=("dsts",))
def _relay_scatter_op(index: torch.Tensor, srcs: list[torch.Tensor],
                      dsts: list[torch.Tensor]) -> None:
    _relay_scatter(index, _zip_pairs(srcs, dsts, "srcs", "dsts"))


@_relay_scatter_op.register_fake
def _(index, srcs, dsts):
    return None


@torch.library.custom_op(_LIB + "relay_gather", mutates_args=("dsts",))
def _relay_gather_op(index: torch.Tensor, srcs: list[torch.Tensor],
                     dsts: list[torch.Tensor]) -> None:
    _relay_gather(index, _zip_pairs(srcs, dsts, "srcs", "dsts"))


@_relay_gather_op.register_fake
def _(index, srcs, dsts):
    return None


def _zip_pairs(a: list, b: list, name_a: str, name_b: str) -> list:
    """The ops take two parallel lists; a pair per position, or an error when the lists
    differ in length (zip would drop the extra ones silently)."""
    if len(a) != len(b):
        raise ValueError(f"{name_a}, {name_b}: expected lists of the same length, got "
                         f"{len(a)} and {len(b)}")
    return list(zip(a, b, strict=True))


def _split_pairs(pairs, name: str, what: str):
    """[(x, y), ...] -> ([x, ...], [y, ...]), each item checked to be a pair."""
    pairs = list(pairs)
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise TypeError(f"{name}[{i}]: expected a {what} pair of tensors, "
                            f"got {type(p).__name__}")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def relay_scatter(index: torch.Tensor,
                  fields: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """`recipes.relay_scatter` as a custom op: `dst[index[b]] = src[b]` for each
    (src, dst) pair, in place."""
    srcs, dsts = _split_pairs(fields, "fields", "(src, dst)")
    torch.ops.spec_cookbook.relay_scatter(index, srcs, dsts)


def relay_gather(index: torch.Tensor,
                 fields: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """`recipes.relay_gather` as a custom op: `dst[b] = src[index[b]]` (zeros for an
    index out of range) for each (src, dst) pair, in place."""
    srcs, dsts = _split_pairs(fields, "fields", "(src, dst)")
    torch.ops.spec_cookbook.relay_gather(index, srcs, dsts)


# --- verify_metadata -------------------------------------------------------------------
METADATA_FIELDS = ("positions", "out_cache_loc", "seqlens_k", "cu_seqlens_q",
                   "cu_seqlens_k", "max_seqlen_k", "page_table", "kv_indptr", "kv_indices",
                   "kv_last_page_len")
_LAYOUT_FIELDS = {"fa3": ("page_table",),
                  "flashinfer": ("kv_indptr", "kv_indices", "kv_last_page_len")}


def _metadata_fields(layout: str) -> set:
    """The fields a layout fills (the others are None)."""
    extra = _LAYOUT_FIELDS.get(layout)
    if extra is None:
        extra = _LAYOUT_FIELDS["fa3"] + _LAYOUT_FIELDS["flashinfer"] if layout == "both" \
            else ()
    return set(METADATA_FIELDS[:6]) | set(extra)


@torch.library.custom_op(_LIB + "verify_metadata", mutates_args=())
def _verify_metadata_op(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        req_to_token: torch.Tensor, num_tokens: int, page_size: int = 1,
                        window: Optional[int] = None, max_pages: Optional[int] = None,
                        layout: str = "fa3") -> list[torch.Tensor]:
    r = _verify_metadata(req_pool_indices, seq_lens, req_to_token, num_tokens,
                         page_size=page_size, window=window, max_pages=max_pages,
                         layout=layout)
    outs = [getattr(r, f) for f in METADATA_FIELDS]
    outs = [_empty(seq_lens) if t is None else t for t in outs]
    return outs                    # fresh tensors (out=None): no alias of an input


@_verify_metadata_op.register_fake
def _(req_pool_indices, seq_lens, req_to_token, num_tokens, page_size=1, window=None,
      max_pages=None, layout="fa3"):
    B = req_pool_indices.shape[0]
    N = num_tokens
    mp = max_pages if max_pages is not None else -(-req_to_token.shape[1] // page_size)
    new = seq_lens.new_empty
    i32, i64 = torch.int32, torch.int64
    shapes = {"positions": ((B * N,), i64), "out_cache_loc": ((B * N,), i64),
              "seqlens_k": ((B,), i32), "cu_seqlens_q": ((B + 1,), i32),
              "cu_seqlens_k": ((B + 1,), i32), "max_seqlen_k": ((1,), i32),
              "page_table": ((B, mp), i32), "kv_indptr": ((B + 1,), i32),
              "kv_indices": ((B * mp,), i32), "kv_last_page_len": ((B,), i32)}
    have = _metadata_fields(layout)
    return [new(shapes[f][0], dtype=shapes[f][1]) if f in have else new((0,))
            for f in METADATA_FIELDS]


def verify_metadata(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                    req_to_token: torch.Tensor, num_tokens: int, *, page_size: int = 1,
                    window: int | None = None, max_pages: int | None = None,
                    layout: str = "fa3") -> VerifyMetadata:
    """`recipes.verify_metadata` as a custom op: a `VerifyMetadata` (fields of a layout
    not asked for are None)."""
    outs = torch.ops.spec_cookbook.verify_metadata(
        req_pool_indices, seq_lens, req_to_token, num_tokens, page_size, window, max_pages,
        layout)
    have = _metadata_fields(layout)
    return VerifyMetadata(**{f: (t if f in have else None)
                                        for f, t in zip(METADATA_FIELDS, outs, strict=False)})


# --- copy_inputs -----------------------------------------------------------------------
@torch.library.custom_op(_LIB + "copy_inputs", mutates_args=("dsts",))
def _copy_inputs_op(srcs: list[torch.Tensor], dsts: list[torch.Tensor]) -> None:
    _copy_inputs(src=srcs, dst=dsts)


@_copy_inputs_op.register_fake
def _(srcs, dsts):
    return None


def copy_inputs(*args, src: Sequence[torch.Tensor] | None = None,
                dst: Sequence[torch.Tensor] | None = None) -> None:
    """`recipes.copy_inputs` as a custom op: copies src[i] into dst[i], in place.
    Keyword-only, as the recipe (a positional call raises its TypeError)."""
    if args:
        from .copy_inputs import positional_error

        raise positional_error(args)
    torch.ops.spec_cookbook.copy_inputs(_list("src", src), _list("dst", dst))


def _list(name: str, v) -> list:
    """A sequence argument as the op's list (a tensor or None is an error here, not a
    list of rows)."""
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list or tuple of tensors, got "
                        f"{type(v).__name__}")
    return list(v)


OPS = ("argmax", "chain_verify", "draft_tail", "relay_scatter", "relay_gather",
       "verify_metadata", "copy_inputs")

__all__ = list(OPS) + ["NAMESPACE", "METADATA_FIELDS"]
