"""Benchmark of `recipes.tp` on one GPU: the per-rank launches at 1/TP of the vocabulary
against single-GPU chain_verify on the whole of it.

A vocabulary-parallel chain_verify is, on each rank: the scan of its 1/TP of the columns
(`tp.local_keys`), an all-reduce of B*(K+1) int64 over the group, and the accept launch
(`tp.finish_verify`). On one GPU the two launches can be timed at the shard's size
without a collective; the link traffic is given as bytes instead, next to what gathering
the logits would move.

Cases:

* label: {"TP", "mode", "dtype", "B", "K", "V", "gather_bytes", "keys_bytes"}, the last two
  the link traffic per rank and step (below);
* make(device, seed) -> state: the shard of rank 1 ([B, K+1, ceil(V/TP)] bf16, the last
  rank's padding not modelled: rank 1 is a full shard), the full logits [B*(K+1), V],
  drafts, sampling inputs (mode "sampled"), preallocated keys and outputs;
* variants (graph-capturable, nothing allocated):
    "ours"              local_keys, then finish_verify on those keys (both launches of a
                        rank, the collective left out)
    "ours: keys only"   local_keys of the shard (the per-rank scan)
    "one GPU"           recipes.chain_verify on the full vocabulary (what a rank runs
                        after all-gathering the logits)
* bytes: the fewest bytes "ours" moves (the shard read once, keys, drafts and outputs);
* gather_bytes: what a rank receives to assemble the full logits, R*(V - V/TP)*2;
  keys_bytes: what a rank sends in a ring all-reduce of the keys, 2*(TP-1)/TP*R*8,
  R = B*(K+1).

Presets: "full" TP in {2, 4, 8} x B in {1, 8, 64, 256} x K=3 x V in {151936, 262144} x
mode in {greedy, sampled}, bf16; "quick" a handful; "smoke" tiny shapes (CPU-safe).
"""
from __future__ import annotations

import torch

import recipes
from autotune.declare import BenchCase, BenchSuite, BenchVariant
from recipes import tp

DTYPE = torch.bfloat16


def _shapes(preset: str):
    if preset == "smoke":
        return [(2, "greedy", 2, 3, 4096), (2, "sampled", 2, 3, 4096)]
    if preset == "quick":
        return [(t, m, b, 3, 151936) for t in (2, 8) for m in ("greedy", "sampled")
                for b in (1, 64)]
    return [(t, m, b, 3, v) for v in (151936, 262144) for m in ("greedy", "sampled")
            for t in (2, 4, 8) for b in (1, 8, 64, 256)]


def _make(TP: int, mode: str, B: int, K: int, V: int):
    width = -(-V // TP)
    vs = width                                  # rank 1: a full shard

    def make(device, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        R = B * (K + 1)
        full = torch.randn(R, V, generator=g, device=device).to(DTYPE)
        local = full[:, vs:vs + width].contiguous().view(B, K + 1, width)
        t = torch.argmax(full, 1).view(B, K + 1)
        d = t[:, :K].clone()                    # accept everything: the longest accept
        kw = {}
        if mode == "sampled":
            kw = {"temperature": 0.5 + torch.rand(B, generator=g, device=device),
                  "seeds": torch.randint(-2**62, 2**62, (B,), generator=g, device=device),
                  "positions": torch.randint(0, 2**20, (B,), generator=g, device=device)}
        out = recipes.chain_verify(full, d, **kw)
        return {"local": local, "full": full, "d": d, "kw": kw, "vs": vs, "V": V,
                "keys": torch.empty(R, dtype=torch.int64, device=device),
                "out": recipes.VerifyResult(*[x.clone() for x in out]),
                "out_full": recipes.VerifyResult(*[x.clone() for x in out])}

    return make


def _keys(s):
    tp.local_keys(s["local"], vocab_start=s["vs"], vocab_size=s["V"], out=s["keys"],
                  **s["kw"])


def _keys_finish(s):
    _keys(s)
    tp.finish_verify(s["keys"], s["d"], out=s["out"])


def _one_gpu(s):
    recipes.chain_verify(s["full"], s["d"], out=s["out_full"], **s["kw"])


def _cases(preset: str) -> list[BenchCase]:
    cases = []
    for TP, mode, B, K, V in _shapes(preset):
        R = B * (K + 1)
        width = -(-V // TP)
        es = DTYPE.itemsize
        sampling = B * 24 if mode == "sampled" else 0       # temperature, seed, position
        cases.append(BenchCase(
            label={"TP": TP, "mode": mode, "dtype": "bfloat16", "B": B, "K": K, "V": V,
                   "gather_bytes": R * (V - width) * es,
                   "keys_bytes": 2 * (TP - 1) * R * 8 // TP},
            make=_make(TP, mode, B, K, V),
            variants={"ours": BenchVariant(_keys_finish), "ours: keys only": BenchVariant(_keys),
                      "one GPU": BenchVariant(_one_gpu, peer=True)},
            bytes=R * width * es + 2 * R * 8 + B * K * 8 + R * 4 + B * 16 + sampling))
    return cases


SUITES = [
    BenchSuite(
        name="tp", cases=_cases, title="tp.chain_verify per rank (one GPU)",
        notes="ours: a rank's two launches at 1/TP of the vocabulary (the scan into packed "
              "keys, then the accept launch; the all-reduce of the keys is not on one GPU: "
              "keys_bytes is what it sends per rank); ours: keys only: the scan alone; one "
              "GPU: chain_verify on the whole vocabulary, what a rank runs after an "
              "all-gather that receives gather_bytes. Bytes: the shard read once, keys, "
              "drafts and outputs."),
]
