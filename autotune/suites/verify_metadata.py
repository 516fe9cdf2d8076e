"""Benchmark of verify_metadata against the torch ops an engine runs for the same fields."""
import triton

from autotune.registry import BenchCase, BenchSuite, BenchVariant
from recipes.verify_metadata import (
    TUNE_N,
    TUNING,
    engine_torch,
    tune_key,
    verify_metadata,
)


def _bench_cases(preset: str):
    if preset == "smoke":
        shapes = [(2, 512, 16, "fa3"), (2, 512, 1, "both")]
    elif preset == "quick":
        shapes = [(1, 163840, 64, "fa3"), (1, 163840, 1, "fa3"), (64, 32768, 64, "fa3"),
                  (256, 4096, 1, "fa3"), (8, 32768, 64, "both")]
    else:
        shapes = [(b, ctx, ps, "fa3") for ps in (64, 1) for ctx in (4096, 32768, 163840)
                  for b in (1, 8, 64, 256)] + [(8, 32768, 64, "both")]
    cases = []
    for B, ctx, ps, layout in shapes:
        key = tune_key(layout, ps, B, triton.cdiv(ctx, ps))

        def make(device, seed, key=key):
            inp, out = TUNING.make_inputs(key, device, seed)    # as the tuner times
            return {"inp": inp, "out": out}

        cases.append(BenchCase(
            label={"B": B, "context": ctx, "page_size": ps, "layout": layout, "N": TUNE_N},
            make=make, bytes=TUNING.bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: verify_metadata(**s["inp"], out=s["out"])),
                "torch eager": BenchVariant(lambda s: engine_torch(**s["inp"]),
                                            eager=True, peer=True),
                "torch graph": BenchVariant(lambda s: engine_torch(**s["inp"]), peer=True),
            }))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="verify_metadata (target-verify attention "
        "metadata)",
        notes="ours: one launch writing positions, out_cache_loc, seqlens/cu_seqlens/max "
              "and the page table (and flashinfer indices for layout both); torch: the "
              "engine's sequence (arange, gather, cumsum, page-table slice and where) in "
              "fixed shapes. Context = req_to_token capacity C; seq_lens near C - N; "
              "max_pages = C / page_size. Bytes: indices, gathered slots (4 B each) and "
              "every output written once."),


]
