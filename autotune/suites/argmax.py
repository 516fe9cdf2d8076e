"""argmax beyond dispatch: its tuning inputs and keys, and the benchmark of our split
reduction against torch.argmax."""
import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from autotune.suites import dtype_name
from recipes import _common as C
from recipes.argmax import TUNING, argmax, reference, tune_key


def make_inputs(key: dict, device: torch.device, seed: int):
    """Random logits (drawn on the device: benchmarks make GBs of them) with a planted
    tie for each row's max, so configs are compared on rows where the lowest-index rule
    decides."""
    g = torch.Generator(device=device).manual_seed(seed)
    R, V = key["R"], key["V"]
    x = torch.randn(R, V, generator=g, device=device).to(getattr(torch, key["dtype"]))
    if R and V > 1:
        top = x.max(dim=1, keepdim=True).values
        j = torch.randint(0, V, (R, 1), generator=g, device=device)
        x.scatter_(1, j, top)
    return x


def bytes_moved(key: dict) -> int:
    es = C.dtype_size(key["dtype"])
    return key["R"] * key["V"] * es + key["R"] * 8


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": one small key for the interpreter).
    Both dtypes of the benchmark, V = 32000, 151936 and 262144, and every power-of-two R
    from 1 to 256: each benchmark shape is a tuned key, or (V = 128256, 129280) within
    a factor 1.2 of tuned ones at its own R and the rows either side, so dispatch never
    lends a config from farther than a factor of 2 (and then only one measured no slower
    there). 54 keys; the compiled binaries do not depend on R and V but for their
    divisibility, so the tune compiles ~600 for ~7400 (key, config) pairs."""
    if preset == "smoke":
        return [{"dtype": "bfloat16", "V": 4096, "R": 2}]
    return [{"dtype": d, "V": v, "R": r} for d in ("bfloat16", "float32")
            for v in (32000, 151936, 262144) for r in (1, 2, 4, 8, 16, 32, 64, 128, 256)]


TUNABLES = [Tunable(
    TUNING, make_inputs=make_inputs, run=lambda x, cfg: argmax(x, config=cfg),
    reference=reference, torch_peer=reference, bytes_moved=bytes_moved,
    default_keys=default_keys)]


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
            x = make_inputs(key, device, seed)
            return {"x": x, "out": torch.empty(x.shape[0], dtype=torch.int64, device=device)}

        cases.append(BenchCase(
            label={"dtype": dtype_name(dt), "R": R, "V": V}, make=make,
            bytes=bytes_moved(key),
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
