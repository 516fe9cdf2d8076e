"""chain_verify: verification of top-1 ("chain") drafts fused with the final argmax.

One request per batch row b, with K drafted tokens d[b, 0..K-1] and K+1 logits rows:
row j is the target's distribution for the token after input j (input 0 is the last
committed token, input j >= 1 is d[b, j-1]).

    t[b, j] = argmax_v logits[b, j, v]            (greedy rows; torch's argmax rules)
    m[b]    = #leading j < K with d[b, j] == t[b, j]
    tokens[b, j] = t[b, j] for j <= m[b], else -1
    accept_len[b] = m[b],  bonus[b] = t[b, m[b]],  select_index[b] = b*(K+1) + m[b]

A draft id outside [0, V) never matches (t is always in [0, V), and the comparison is
in int64, so no id wraps onto a real one): -1 pads a request that drafted fewer tokens.

Kernel: one launch. Every program scans one chunk of one row (the shared stage 1,
`chunk_argmax`) and folds its candidate into the row's stage-2 slot; a per-request
arrival counter elects the last of the request's (K+1) x SPLIT programs, which reads
the K+1 slots, runs the accept logic (`_verify_finalize`) and writes all four outputs,
leaving slots and counter at rest for the next call. K = 0 is the plain argmax row with
m = 0. B = 0 launches nothing.
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
    chunk_argmax_packed,
    publish_packed,
    split_constraint,
    split_heuristic,
    split_plan,
    unpack_index,
)

NAME = "chain_verify"


class VerifyResult(NamedTuple):
    tokens: torch.Tensor        # int32 [B, K+1]: t[b, j] for j <= m[b], -1 after
    accept_len: torch.Tensor    # int32 [B]: m[b]
    bonus: torch.Tensor         # int32 [B]: t[b, m[b]]
    select_index: torch.Tensor  # int64 [B]: b*(K+1) + m[b]


# --- the semantics in plain torch ------------------------------------------------------
def accept(t: torch.Tensor, draft_tokens: torch.Tensor) -> VerifyResult:
    """The accept logic on target tokens t (int64 [B, K+1])."""
    B, K1 = t.shape
    K = K1 - 1
    match = draft_tokens.to(torch.int64) == t[:, :K]
    m = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
    j = torch.arange(K1, device=t.device)
    tokens = torch.where(j[None, :] <= m[:, None], t, torch.full_like(t, -1))
    bonus = t.gather(1, m[:, None]).squeeze(1)
    select = torch.arange(B, device=t.device, dtype=torch.int64) * K1 + m
    return VerifyResult(tokens.to(torch.int32), m.to(torch.int32), bonus.to(torch.int32),
                        select)


def target_tokens(logits: torch.Tensor, B: int, K: int, temperature=None, seeds=None,
                  positions=None) -> torch.Tensor:
    """t[b, j] (int64 [B, K+1]): the argmax of each row."""
    x = logits.reshape(B, K + 1, logits.shape[-1])
    return torch.argmax(x, dim=-1)


def reference(logits, draft_tokens, temperature=None, seeds=None, positions=None):
    B, K = draft_tokens.shape
    return accept(target_tokens(logits, B, K, temperature, seeds, positions), draft_tokens)


# --- kernels ---------------------------------------------------------------------------
@triton.jit
def _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                     b, K, KP1: tl.constexpr):
    """The last program of request b: read its K+1 argmaxes, accept against the drafts
    `d` (int64 [KP1], loaded up front), write, reset."""
    j = tl.arange(0, KP1)
    in_row = j <= K
    row0 = b.to(tl.int64) * (K + 1)
    packed = tl.atomic_xchg(acc_ptr + row0 + j, tl.full([KP1], PACKED_EMPTY, tl.int64),
                            mask=in_row)
    t = unpack_index(packed)
    is_draft = j < K
    miss = is_draft & (d != t.to(tl.int64))
    m = tl.min(tl.where(miss, j, K), 0)
    tl.store(tokens_ptr + row0 + j, tl.where(j <= m, t, -1), mask=in_row)
    tl.store(accept_ptr + b, m.to(tl.int32))
    tl.store(bonus_ptr + b, tl.sum(tl.where(j == m, t, 0), 0).to(tl.int32))
    tl.store(select_ptr + b, row0 + m)
    tl.atomic_xchg(cnt_ptr + b, 0)


@triton.jit
def _verify_kernel(logits_ptr, draft_ptr, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                   acc_ptr, cnt_ptr, V, K, stride_b, stride_j, stride_db, stride_dk,
                   n_split, tiles_per, BLOCK_V: tl.constexpr, KP1: tl.constexpr,
                   UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    per_req = (K + 1) * n_split
    b = pid // per_req
    rem = pid - b * per_req
    j = rem // n_split
    lo = (rem - j * n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    row_ptr = logits_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_j
    # the drafts are loaded before the scan (a few L2 hits per program), so the last
    # program's accept step waits on no memory but the stage-2 slots
    jd = tl.arange(0, KP1)
    d = tl.load(draft_ptr + b.to(tl.int64) * stride_db + jd * stride_dk, mask=jd < K,
                other=-1).to(tl.int64)
    packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL)
    row = b.to(tl.int64) * (K + 1) + j
    arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + b)
    if arrived == per_req - 1:
        _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                         b, K, KP1)


# --- search space and heuristic (shared by every split-argmax kernel) -----------------
SPACE = SPLIT_SPACE


def constraint(config: dict, key: dict) -> bool:
    return split_constraint(config, key["V"])


def heuristic(key: dict, device: torch.device) -> dict:
    return split_heuristic(key["dtype"], key["V"], key["B"] * (key["K"] + 1), C.sm_count(device))


def tune_key(dtype: torch.dtype, V: int, B: int, K: int, sampled: bool = False) -> dict:
    return {"dtype": C._dtype_name(dtype), "mode": "sampled" if sampled else "greedy",
            "V": int(V), "B": int(B), "K": int(K)}


# --- launcher --------------------------------------------------------------------------
def _validate(logits, draft_tokens, out):
    C.check_tensor("draft_tokens", draft_tokens, dtypes=C.INDEX_DTYPES, ndim=2)
    device = draft_tokens.device
    C.check_tensor("logits", logits, dtypes=C.FLOAT_DTYPES, ndim=(2, 3), device=device)
    C.check_runnable("logits", logits)
    C.check_logits_rows("logits", logits)
    B, K = draft_tokens.shape
    V = logits.shape[-1]
    if logits.dim() == 2:
        if logits.shape[0] != B * (K + 1):
            raise ValueError(f"logits: expected {B * (K + 1)} rows (B*(K+1) with B={B}, "
                             f"K={K} from draft_tokens), got shape {tuple(logits.shape)}")
        stride_b, stride_j = (K + 1) * logits.stride(0), logits.stride(0)
    else:
        if tuple(logits.shape[:2]) != (B, K + 1):
            raise ValueError(f"logits: expected shape ({B}, {K + 1}, V) from draft_tokens "
                             f"[B={B}, K={K}], got {tuple(logits.shape)}")
        stride_b, stride_j = logits.stride(0), logits.stride(1)
    if out is None:
        out = VerifyResult(
            torch.empty((B, K + 1), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))
    else:
        if not isinstance(out, tuple) or len(out) != 4:
            raise TypeError("out: expected a VerifyResult (tokens, accept_len, bonus, "
                            f"select_index) of tensors, got {type(out).__name__}")
        out = VerifyResult(*out)
        C.check_out("out.tokens", out.tokens, (B, K + 1), torch.int32, device)
        C.check_out("out.accept_len", out.accept_len, (B,), torch.int32, device)
        C.check_out("out.bonus", out.bonus, (B,), torch.int32, device)
        C.check_out("out.select_index", out.select_index, (B,), torch.int64, device)
    return B, K, V, stride_b, stride_j, out


def launch_verify(logits, draft_tokens, out, cfg, B, K, V, stride_b, stride_j) -> None:
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    acc, cnt = C.WORKSPACE.get(logits.device, B * (K + 1), B)
    _verify_kernel[(B * (K + 1) * split,)](
        logits, draft_tokens, out.tokens, out.accept_len, out.bonus, out.select_index,
        acc, cnt, V, K, stride_b, stride_j, draft_tokens.stride(0), draft_tokens.stride(1),
        split, tiles_per, BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"],
        KP1=C.next_pow2(K + 1),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def resolve_config(config, key, device) -> dict:
    if config is None:
        return C.pick_config(NAME, key, heuristic, device)
    C.check_config(NAME, config, SPACE)
    return {**heuristic(key, device), **config}


def chain_verify(logits: torch.Tensor, draft_tokens: torch.Tensor, *, temperature=None,
                 seeds=None, positions=None, out=None, config=None) -> VerifyResult:
    """Verify top-1 drafts against target logits in one launch; see the module doc."""
    B, K, V, stride_b, stride_j, out = _validate(logits, draft_tokens, out)
    if temperature is not None:
        raise NotImplementedError("chain_verify: the sampled mode (temperature=) is not "
                                  "built yet")
    if B == 0:
        return out
    cfg = resolve_config(config, tune_key(logits.dtype, V, B, K), logits.device)
    launch_verify(logits, draft_tokens, out, cfg, B, K, V, stride_b, stride_j)
    return out


chain_verify.reference = reference


# --- registration for tuning and benchmarks --------------------------------------------
def make_inputs(key: dict, device: torch.device, seed: int):
    """Logits with planted ties, drafts that accept a random prefix of each request."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, K, V = key["B"], key["K"], key["V"]
    dtype = getattr(torch, key["dtype"])
    x = torch.randn(B * (K + 1), V, generator=g).to(dtype)
    t = torch.argmax(x, dim=1).view(B, K + 1)
    keep = torch.randint(0, K + 1, (B,), generator=g)
    d = t[:, :K].clone()
    for b in range(B):
        if keep[b] < K:
            d[b, keep[b]] = (d[b, keep[b]] + 1) % V
    return x.to(device), d.to(device)


def _bytes(key: dict) -> int:
    es = torch.empty((), dtype=getattr(torch, key["dtype"])).element_size()
    B, K = key["B"], key["K"]
    return B * (K + 1) * key["V"] * es + B * K * 8 + B * (K + 1) * 4 + B * 16


def _default_keys(preset: str) -> list[dict]:
    if preset == "smoke":
        return [tune_key(torch.bfloat16, 4096, 2, 3)]
    return [tune_key(d, v, b, k) for d in (torch.bfloat16,) for v in (32000, 151936)
            for b in (1, 8, 64) for k in (3,)]


def _register() -> None:
    from autotune.registry import Tunable, register

    register(Tunable(
        name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
        make_inputs=make_inputs,
        run=lambda inp, cfg: chain_verify(*inp, config=cfg),
        reference=lambda inp: reference(*inp), torch_peer=lambda inp: reference(*inp),
        bytes_moved=_bytes, default_keys=_default_keys,
        sources=(_verify_kernel, _verify_finalize, chunk_argmax_packed, publish_packed,
                 launch_verify)))


_register()


def _bench_cases(preset: str):
    from autotune.registry import BenchCase, BenchVariant

    if preset == "smoke":
        shapes = [(torch.bfloat16, 1, 3, 4096)]
    elif preset == "quick":
        shapes = [(torch.bfloat16, b, k, 151936) for b, k in ((1, 3), (64, 4), (256, 7))]
    else:
        shapes = [(dt, b, k, v) for dt in (torch.bfloat16, torch.float32)
                  for v in (32000, 128256, 129280, 151936, 262144)
                  for k in (1, 3, 4, 7) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)
                  if k != 4 or b >= 64 or b == 1]
    cases = []
    for dt, B, K, V in shapes:
        key = tune_key(dt, V, B, K)

        def make(device, seed, key=key):
            x, d = make_inputs(key, device, seed)
            out = reference(x, d)
            return {"x": x, "d": d, "out": VerifyResult(*[t.clone() for t in out])}

        cases.append(BenchCase(
            label={"dtype": C._dtype_name(dt), "B": B, "K": K, "V": V},
            make=make, bytes=_bytes(key),
            variants={
                "ours": BenchVariant(lambda s: chain_verify(s["x"], s["d"], out=s["out"])),
                "torch eager": BenchVariant(lambda s: reference(s["x"], s["d"]),
                                            eager=True, peer=True),
                "torch graph": BenchVariant(lambda s: reference(s["x"], s["d"]), peer=True),
            }))
    return cases


def _register_bench() -> None:
    from autotune.registry import BenchSuite, register_bench

    register_bench(BenchSuite(
        name=NAME, cases=_bench_cases, title="chain_verify (greedy)",
        notes="ours: one launch (argmax of every row fused with the accept logic); "
              "torch: argmax over the rows, then cumprod/where/gather for the accept "
              "logic. Bytes: the logits read once plus drafts and outputs."))


_register_bench()
