"""Benchmark of copy_inputs: one launch for a step graph's input copies against copy_ per pair."""
from autotune.registry import BenchCase, BenchSuite, BenchVariant
from recipes.copy_inputs import TUNING, copy_inputs, make_pairs, tune_key


def _bench_cases(preset: str):
    if preset == "smoke":
        shapes = [(3, 1024)]
    elif preset == "quick":
        shapes = [(8, 4096), (16, 4096), (8, 1 << 20)]
    else:
        shapes = [(1, 4096), (8, 256), (8, 4096), (16, 4096), (8, 1 << 20), (2, 64 << 20),
                  (16, 16 << 20)]
    cases = []
    for n_pairs, nbytes in shapes:
        key = tune_key(n_pairs, nbytes)

        def make(device, seed, key=key):
            return make_pairs(key, device, seed)

        def torch_copies(pairs):
            for s, d in zip(pairs["src"], pairs["dst"], strict=True):
                d.copy_(s)

        cases.append(BenchCase(
            label={"pairs": n_pairs, "pair_bytes": nbytes}, make=make,
            bytes=TUNING.bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: copy_inputs(**s)),
                "ours eager": BenchVariant(lambda s: copy_inputs(**s), eager=True),
                "torch eager": BenchVariant(torch_copies, eager=True, peer=True),
                "torch graph": BenchVariant(torch_copies, peer=True),
            }))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="copy_inputs (step-graph input copies)",
        notes="ours: one launch for every pair (bits, widest aligned int unit); torch: one "
              "dst.copy_(src) per pair. Mixed dtypes (fp32, bf16, int64, int32, fp16, bool, "
              "int8, fp64); the first pair has pair_bytes bytes, the others a few elements "
              "fewer. Bytes: every pair read and written once."),


]
