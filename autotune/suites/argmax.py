"""Benchmark of argmax: our split reduction against torch.argmax."""
import torch

from autotune.registry import BenchCase, BenchSuite, BenchVariant
from autotune.suites import dtype_name
from recipes.argmax import TUNING, argmax, tune_key


def _bench_cases(preset: str):
    if preset == "smoke":
        shapes = [(torch.bfloat16, 2, 4096)]
    elif preset == "quick":
        shapes = [(torch.bfloat16, r, 151936) for r in (1, 4, 256)]
    else:
        shapes = [(dt, r, v) for dt in (torch.bfloat16, torch.float32)
                  for v in (32000, 128256, 129280, 151936, 262144)
                  for r in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    cases = []
    for dt, R, V in shapes:
        key = tune_key(dt, V, R)

        def make(device, seed, key=key):
            x = TUNING.make_inputs(key, device, seed)
            return {"x": x, "out": torch.empty(x.shape[0], dtype=torch.int64, device=device)}

        cases.append(BenchCase(
            label={"dtype": dtype_name(dt), "R": R, "V": V}, make=make,
            bytes=TUNING.bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: argmax(s["x"], out=s["out"])),
                "torch eager": BenchVariant(lambda s: torch.argmax(s["x"], 1), eager=True,
                                            peer=True),
                "torch graph": BenchVariant(lambda s: torch.argmax(s["x"], 1), peer=True),
            }))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="argmax",
        notes="ours: one launch, split reduction with in-kernel stage 2; "
              "torch: torch.argmax(dim=1). Bytes: the logits read once."),


]
