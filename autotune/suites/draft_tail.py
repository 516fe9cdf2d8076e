"""Benchmark of draft_tail against the torch ops an engine runs for a draft step's tail."""
import torch

from autotune.registry import BenchCase, BenchSuite, BenchVariant
from autotune.suites import with_pdl
from recipes.draft_tail import TUNING, DraftTail, draft_tail, tune_key


def _call(inp: dict, out=None) -> DraftTail:
    return draft_tail(inp["logits"], rows=inp["rows"], hidden=inp["hidden"],
                      token_map=inp["token_map"], positions=inp["positions"],
                      draft_tokens=inp["draft_tokens"], column=inp["column"], out=out)


def _bench_cases(preset: str):
    if preset == "smoke":
        shapes = [(1, 4096, 256), (3, 1000, 64)]
    elif preset == "quick":
        shapes = [(1, 32000, 4096), (8, 151936, 4096), (64, 128256, 7168),
                  (256, 151936, 4096)]
    else:
        shapes = [(b, v, h) for v in (32000, 128256, 151936) for h in (4096, 7168)
                  for b in (1, 8, 64, 256)]
    cases = []
    for B, V, H in shapes:
        key = tune_key(torch.bfloat16, V, B, H)

        def make(device, seed, key=key):
            return TUNING.make_inputs(key, device, seed)    # with out=, as the tuner times

        cases.append(BenchCase(
            label={"dtype": "bfloat16", "B": B, "V": V, "H": H},
            make=make, bytes=TUNING.bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: _call(s, out=s["out"])),
                **with_pdl(lambda s: _call(s, out=s["out"])),
                "torch eager": BenchVariant(TUNING.torch_peer, eager=True, peer=True),
                "torch graph": BenchVariant(TUNING.torch_peer, peer=True),
            }))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="draft_tail (top-1 draft tail)",
        notes="ours: one launch (argmax of the selected rows read in place, token map, "
              "probs, positions += 1, draft_tokens column, hidden-row gather), without "
              "programmatic dependent launch (PDL, off by default); 'ours, PDL on': the "
              "same launch with PDL (`pdl_on`), behind the plain kernel and back to "
              "back; torch: "
              "index the rows, argmax, map, gather hidden, positions += 1, column write. "
              "Bytes: the selected logits rows read once plus the hidden rows read and "
              "written once (bf16)."),


]
