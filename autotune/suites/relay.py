"""Benchmark of relay_scatter / relay_gather against torch's index_copy_ / index_select."""
from autotune.registry import BenchCase, BenchSuite, BenchVariant
from recipes.relay import (
    MODES,
    POOL,
    TUNING,
    bytes_moved,
    heuristic,
    make_inputs,
    relay_gather,
    relay_scatter,
    torch_peer,
    tune_key,
)


def _bench_cases(preset: str):
    if preset == "smoke":
        shapes = [(m, 2, 64) for m in MODES]
    elif preset == "quick":
        shapes = [(m, b, 7168) for m in MODES for b in (1, 256)]
    else:
        shapes = [(m, b, h) for m in MODES for h in (4096, 7168) for b in (1, 8, 64, 256)]
    cases = []
    for mode, B, H in shapes:
        key = tune_key(mode, B, H, 5)
        fn = relay_scatter if mode == "scatter" else relay_gather

        def make(device, seed, key=key):
            return make_inputs(key, device, seed)

        variants = {
            "ours": BenchVariant(lambda s, fn=fn: fn(s.index, s.fields)),
            "torch eager": BenchVariant(torch_peer, eager=True, peer=True),
            "torch graph": BenchVariant(torch_peer, peer=True),
        }
        if B == 1 and preset != "smoke":   # the scalar-slot path, on and off
            for single in (0, 1):
                def call(s, fn=fn, single=single, key=key):
                    cfg = {**heuristic(key, s.index.device), "SINGLE": single}
                    fn(s.index, s.fields, config=cfg)
                variants[f"ours SINGLE={single}"] = BenchVariant(call)
        cases.append(BenchCase(label={"mode": mode, "B": B, "H": H, "P": POOL},
                               make=make, bytes=bytes_moved(key), variants=variants))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="relay (scatter/gather of decode-step state)",
        notes="Fields: bonus int64 [B], top-1 id int64 [B], top-1 prob float32 [B], hidden "
              "bfloat16 [B, H], new seq len int64 [B]; pool of 1024 slots. ours: all five "
              "fields in one launch; torch: one index_copy_ (scatter) / index_select "
              "(gather) per field. Bytes: every field's bytes read + written, plus the "
              "int64 index. 'ours SINGLE=0/1' (B = 1): the scalar-slot path off/on."),


]
