"""chain_verify beyond dispatch: its tuning inputs, keys and torch peers, and the
benchmarks of it, greedy and sampled, against torch pipelines."""
import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from autotune.suites import dtype_name, with_pdl
from recipes import _common as C
from recipes.chain_verify import (
    TUNING,
    VerifyResult,
    accept,
    chain_verify,
    reference,
    tune_key,
)


def torch_controls(probs, top_k=None, top_p=None, min_p=None):
    """probs [R, V] filtered by the sampling controls ([R] each, None: not given) as
    engines' torch samplers filter them, by one sort: probabilities below min_p times
    the row's largest dropped, then all but the top_k largest (<= 0: off), then the
    smallest prefix holding top_p of what is left (renormalised; >= 1: off) kept."""
    ps, idx = torch.sort(probs, dim=-1, descending=True)
    if min_p is not None:
        ps = torch.where(ps >= min_p[:, None] * ps[:, :1], ps, 0.0)
    if top_k is not None:
        j = torch.arange(ps.shape[1], device=ps.device)[None, :]
        ps = torch.where((j < top_k[:, None]) | (top_k[:, None] <= 0), ps, 0.0)
    if top_p is not None:
        ps = ps / ps.sum(dim=-1, keepdim=True)
        keep = (torch.cumsum(ps, dim=-1) - ps < top_p[:, None]) | (top_p[:, None] >= 1)
        ps = torch.where(keep, ps, 0.0)
    return torch.zeros_like(probs).scatter_(1, idx, ps)


def torch_sampling(logits, draft_tokens, temperature, **controls):
    """The usual torch sampling pipeline as a peer (not the same random stream, so not
    the same tokens): softmax(logits / T) per row, the controls (`torch_controls`,
    per-request tensors top_k / top_p / min_p) where given, the exponential race
    argmax(probs / Exp(1) noise), then the accept logic."""
    B, K = draft_tokens.shape
    x = logits.reshape(B * (K + 1), logits.shape[-1]).float()
    t = temperature.float().repeat_interleave(K + 1)[:, None]
    probs = torch.softmax(x / t, dim=-1)
    if controls:
        probs = torch_controls(probs, **{n: c.repeat_interleave(K + 1)
                                         for n, c in controls.items()})
    tok = torch.argmax(probs / torch.empty_like(probs).exponential_(), dim=-1)
    return accept(tok.view(B, K + 1), draft_tokens)


def make_inputs(key: dict, device: torch.device, seed: int):
    """(logits, drafts, sampling kwargs): logits with drafts that accept a random prefix of
    each request's argmax; sampled keys add per-request temperatures in [0.5, 1.5], seeds
    and positions (the drafts then match the sampled targets about as often as the argmax
    is drawn). Controls keys add the sampling controls, request b the MIX[b % 3] set."""
    g = torch.Generator(device=device).manual_seed(seed)
    B, K, V = key["B"], key["K"], key["V"]
    dtype = getattr(torch, key["dtype"])
    x = torch.randn(B * (K + 1), V, generator=g, device=device).to(dtype)   # GBs: on device
    kw = {}
    if key.get("mode") in ("sampled", "controls"):
        kw = {"temperature": 0.5 + torch.rand(B, generator=g, device=device),
              "seeds": torch.randint(-2**62, 2**62, (B,), generator=g, device=device),
              "positions": torch.randint(0, 2**20, (B,), generator=g, device=device)}
    if key.get("mode") == "controls":
        kw.update(mixed_controls(B, device))
    t = torch.argmax(x, dim=1).view(B, K + 1)
    d = t[:, :K].clone()
    if K:
        keep = torch.randint(0, K + 1, (B, 1), generator=g, device=device)
        col = torch.arange(K, device=device)[None, :]
        d = torch.where(col == keep, (d + 1) % V, d)     # first miss at `keep` (none if K)
    return x, d, kw


# a tuned controls key's requests, in turn: the chat default, top_p alone, min_p alone
MIX = ({"top_k": 20, "top_p": 0.95, "min_p": 0.0}, {"top_k": 0, "top_p": 0.9, "min_p": 0.0},
       {"top_k": 0, "top_p": 1.0, "min_p": 0.05})


def mixed_controls(B: int, device) -> dict:
    """top_k / top_p / min_p tensors of B requests, request b with MIX[b % 3]."""
    pick = [MIX[b % len(MIX)] for b in range(B)]
    return {n: torch.tensor([m[n] for m in pick], device=device,
                            dtype=torch.int64 if n == "top_k" else torch.float32)
            for n in MIX[0]}


def _peer(inp):
    x, d, kw = inp
    if not kw:
        return reference(x, d)
    return torch_sampling(x, d, kw["temperature"],
                          **{n: kw[n] for n in ("top_k", "top_p", "min_p") if n in kw})


def bytes_moved(key: dict) -> int:
    es = C.dtype_size(key["dtype"])
    B, K = key["B"], key["K"]
    # temperature, seed, position (and the controls: top_k, top_p, min_p)
    extra = {"sampled": B * 20, "controls": B * 36}.get(key.get("mode"), 0)
    return B * (K + 1) * key["V"] * es + B * K * 8 + B * (K + 1) * 4 + B * 16 + extra


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": a greedy and a sampled small key).
    Greedy: both dtypes of the benchmark x V = 32000, 151936, 262144 x every power-of-two
    B from 1 to 256, at K = 3; sampled: bfloat16 likewise, and float32 at V = 151936 for
    B = 1, 4, 16, 64, 256 (the benchmark's float32 sampled shapes). The benchmark's other
    draft lengths (K = 1, 4, 7) and vocabularies (128256, 129280) lie within a factor of
    2 of tuned keys in K + 1 and V, with tuned B either side, so dispatch borrows a config
    there only from neighbours where it was measured no slower than the heuristic, and
    never from farther. 86 keys, ~11600 (key, config) pairs on ~960 binaries (V and B
    reach the kernel as runtime sizes). Then 3 controls keys (`mixed_controls`):
    bfloat16 at V = 151936 for B = 1, 8, 64, the shapes of the controls targets."""
    if preset == "smoke":
        return [tune_key(torch.bfloat16, 4096, 2, 3), tune_key(torch.bfloat16, 4096, 2, 3, True)]
    pow2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    vocab = (32000, 151936, 262144)
    greedy = [tune_key(d, v, b, 3) for d in (torch.bfloat16, torch.float32) for v in vocab
              for b in pow2]
    sampled = [tune_key(torch.bfloat16, v, b, 3, True) for v in vocab for b in pow2]
    sampled += [tune_key(torch.float32, 151936, b, 3, True) for b in (1, 4, 16, 64, 256)]
    controls = [tune_key(torch.bfloat16, 151936, b, 3, True, True) for b in (1, 8, 64)]
    return greedy + sampled + controls


TUNABLES = [Tunable(
    TUNING, make_inputs=make_inputs,
    run=lambda inp, cfg: chain_verify(inp[0], inp[1], config=cfg, **inp[2]),
    reference=lambda inp: reference(inp[0], inp[1], **inp[2]), torch_peer=_peer,
    bytes_moved=bytes_moved, default_keys=default_keys)]


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
            make=make, bytes=bytes_moved(key),
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
            make=make, bytes=bytes_moved(key),
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
                make=make, bytes=bytes_moved(key),
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
              "values, T=0.7), one launch: top_k <= 32 by the chunks' candidate lists, "
              "top_p alone by the row's best candidates, else the threshold search, then "
              "the restricted scan; ours (temperature only): the same call without the "
              "control tensors."),
]
