"""Benchmarks of chain_verify, greedy and sampled, against torch pipelines."""
import torch

from autotune.registry import BenchCase, BenchSuite, BenchVariant
from autotune.suites import dtype_name, with_pdl
from recipes.chain_verify import (
    TUNING,
    VerifyResult,
    chain_verify,
    make_inputs,
    reference,
    torch_sampling,
    tune_key,
)


def _greedy_shapes(preset: str):
    if preset == "smoke":
        return [(torch.bfloat16, 1, 3, 4096)]
    if preset == "quick":
        return [(torch.bfloat16, b, k, 151936) for b, k in ((1, 3), (64, 4), (256, 7))]
    return [(dt, b, k, v) for dt in (torch.bfloat16, torch.float32)
            for v in (32000, 128256, 129280, 151936, 262144)
            for k in (1, 3, 4, 7) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)
            if k != 4 or b >= 64 or b == 1]


def _sampled_shapes(preset: str):
    if preset == "smoke":
        return [(torch.bfloat16, 1, 3, 4096)]
    if preset == "quick":
        return [(torch.bfloat16, b, k, 151936) for b, k in ((1, 3), (64, 4), (256, 7))]
    vocab = (32000, 128256, 129280, 151936, 262144)
    shapes = [(torch.bfloat16, b, 3, v) for v in vocab for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    shapes += [(dt, b, 4, v) for dt in (torch.bfloat16, torch.float32) for v in vocab
               for b in (1, 64)]
    shapes += [(torch.bfloat16, b, k, 151936) for k in (1, 7) for b in (1, 8, 64, 256)]
    shapes += [(torch.float32, b, 3, 151936) for b in (1, 8, 64, 256)]
    return list(dict.fromkeys(shapes))


def _bench_cases(preset: str):
    cases = []
    for dt, B, K, V in _greedy_shapes(preset):
        key = tune_key(dt, V, B, K)

        def make(device, seed, key=key):
            x, d, _ = make_inputs(key, device, seed)
            out = reference(x, d)
            return {"x": x, "d": d, "out": VerifyResult(*[t.clone() for t in out])}

        ours = lambda s: chain_verify(s["x"], s["d"], out=s["out"])    # noqa: E731
        variants = {"ours": BenchVariant(ours)}
        if B <= 16 and V == 151936 and dt == torch.bfloat16:   # where launch latency shows
            variants.update(with_pdl(ours))
        cases.append(BenchCase(
            label={"dtype": dtype_name(dt), "B": B, "K": K, "V": V},
            make=make, bytes=TUNING.bytes_moved(key),
            variants={
                **variants,
                "torch eager": BenchVariant(lambda s: reference(s["x"], s["d"]),
                                            eager=True, peer=True),
                "torch graph": BenchVariant(lambda s: reference(s["x"], s["d"]), peer=True),
            }))
    return cases


def _sampled_bench_cases(preset: str):
    cases = []
    for dt, B, K, V in _sampled_shapes(preset):
        key = tune_key(dt, V, B, K, True)

        def make(device, seed, key=key):
            x, d, kw = make_inputs(key, device, seed)
            out = reference(x, d)
            return {"x": x, "d": d, "kw": kw, "out": VerifyResult(*[t.clone() for t in out])}

        cases.append(BenchCase(
            label={"dtype": dtype_name(dt), "B": B, "K": K, "V": V},
            make=make, bytes=TUNING.bytes_moved(key),
            variants={
                "ours": BenchVariant(
                    lambda s: chain_verify(s["x"], s["d"], out=s["out"], **s["kw"])),
                # the same launch on the same logits, greedy: the ratio ours / this is the
                # price of the random numbers
                "ours (greedy)": BenchVariant(
                    lambda s: chain_verify(s["x"], s["d"], out=s["out"])),
                "torch eager": BenchVariant(
                    lambda s: torch_sampling(s["x"], s["d"], s["kw"]["temperature"]),
                    eager=True, peer=True),
                "torch graph": BenchVariant(
                    lambda s: torch_sampling(s["x"], s["d"], s["kw"]["temperature"]),
                    peer=True),
            }))
    return cases


CONTROLS = {"topk_topp": {"top_k": 20, "top_p": 0.95}, "topp": {"top_p": 0.9},
            "minp": {"min_p": 0.05}, "off": {"top_k": 0, "top_p": 1.0, "min_p": 0.0}}


def _controls_bench_cases(preset: str):
    """The issue's target shapes: K=3, V=151936 bf16, every request at T=0.7 with one
    set of controls; "ours (temperature only)" is the same call without them."""
    shapes = [(1, 4096)] if preset == "smoke" else [(b, 151936) for b in (1, 8, 64)]
    cases = []
    for B, V in shapes:
        key = tune_key(torch.bfloat16, V, B, 3, True)
        for name, ctl in CONTROLS.items():
            def make(device, seed, key=key, ctl=ctl, B=B):
                x, d, kw = make_inputs(key, device, seed)
                kw["temperature"] = torch.full((B,), 0.7, device=device)
                c = {n: torch.full((B,), v, device=device,
                                   dtype=torch.int64 if n == "top_k" else torch.float32)
                     for n, v in ctl.items()}
                out = reference(x, d)
                return {"x": x, "d": d, "kw": kw, "c": c,
                        "out": VerifyResult(*[t.clone() for t in out])}

            cases.append(BenchCase(
                label={"dtype": "bfloat16", "B": B, "K": 3, "V": V, "controls": name},
                make=make, bytes=TUNING.bytes_moved(key),
                variants={
                    "ours": BenchVariant(lambda s: chain_verify(
                        s["x"], s["d"], out=s["out"], **s["kw"], **s["c"])),
                    "ours (temperature only)": BenchVariant(lambda s: chain_verify(
                        s["x"], s["d"], out=s["out"], **s["kw"])),
                }))
    return cases


SUITES = [
    BenchSuite(
        name=TUNING.name, cases=_bench_cases, title="chain_verify (greedy)",
        notes="ours: one launch (argmax of every row fused with the accept logic), "
              "without programmatic dependent launch (PDL, off by default); 'ours, PDL "
              "on' (bfloat16, V=151936, B <= 16): the same launch with PDL (`pdl_on`), "
              "behind the plain kernel and back to back; torch: argmax over the "
              "rows, then cumprod/where/gather for the accept logic. Bytes: the logits "
              "read once plus drafts and outputs.",
        extra={"plot": {"x": "B", "panel": "V", "fixed": {"K": 3, "dtype": "bfloat16"}},
               "readme": True}),      # the plot the README shows
    BenchSuite(
        name=TUNING.name + "_sampled", cases=_sampled_bench_cases, title="chain_verify (sampled)",
        notes="ours: one launch, every request sampled (temperature in [0.5, 1.5]): "
              "Gumbel-max on Triton's Philox stream fused with the accept logic; "
              "ours (greedy): the same launch without temperature; torch: softmax(logits / "
              "T), exponential race argmax(probs / Exp(1)), accept logic (a different "
              "random stream: same distribution, not the same tokens). Bytes: the logits "
              "read once plus drafts, sampling inputs and outputs."),
    BenchSuite(
        name=TUNING.name + "_controls", cases=_controls_bench_cases,
        title="chain_verify (sampling controls)",
        notes="ours: chain_verify with top_k/top_p/min_p tensors (every request the same "
              "values, T=0.7): the per-row threshold launch, then the restricted scan; "
              "ours (temperature only): the same call without the control tensors."),
]
