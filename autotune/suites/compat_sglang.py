"""recipes.compat.sglang beyond dispatch: the tuning inputs of its three launches (each
its own table), and the benchmark of the three SGLang top-1 adapters against torch.

Shapes are the drop-in targets': the verifier at B = 1..256 (N = 4, V = 151936, bf16),
at B = 1 over other vocabularies, N and dtypes, and at B = 32, N = 6, V = 154880 fp32;
the two draft adapters at B in {1, 8, 64, 256} and Vd in {32000, 151936}, H = 4096
(draft_extend with hidden states, draft_topk1 writing a draft_tokens column). Where an
adapter takes `out=` (preallocated outputs, the structure it returns), the bench passes
it; otherwise each call allocates its outputs, as an engine calling it would.
"""
import inspect

import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from autotune.suites import chain_verify as CV
from autotune.suites import draft_tail as DT
from autotune.suites import dtype_name, with_pdl
from autotune.suites.chain_verify import make_inputs as verify_inputs
from recipes.chain_verify import VerifyResult, chain_verify, reference, tune_key
from recipes.chain_verify import accept as CV_accept
from recipes.compat import sglang as S
from recipes.draft_tail import tune_key as draft_key


def verify_tune_inputs(key: dict, device: torch.device, seed: int) -> tuple:
    """chain_verify's greedy inputs for the key in SGLang's arguments: candidates = a last
    committed token then the drafts, the chain's retrieve tensors, seq_lens < 32768."""
    logits, drafts, _ = CV.make_inputs(key, device, seed)
    B, N = drafts.shape[0], key["K"] + 1
    g = torch.Generator(device="cpu").manual_seed(seed)
    last = torch.randint(0, key["V"], (B, 1), generator=g).to(device)
    cand = torch.cat([last, drafts.to(torch.int64)], dim=1)
    ridx = torch.arange(B * N, device=device).view(B, N)
    rnext = torch.arange(1, N + 1, device=device).repeat(B, 1)
    rnext[:, -1] = -1
    seq = torch.randint(1, 32768, (B,), generator=g).to(device)
    return logits, cand, ridx, rnext, seq


def _verify_bytes(key: dict) -> int:
    """chain_verify's bytes plus the SGLang fields: seq_lens and the last token read,
    accept_index, draft_tokens, accept_lens and new_seq_lens written."""
    B, N = key["B"], key["K"] + 1
    return CV.bytes_moved(key) + B * 16 + B * N * 12 + B * 12


def _verify_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures: bfloat16 V=151936 N=4 at every power-of-two B from 1
    to 256, and at B=1 the other vocabularies (129280, 262144), N (2, 8) and float32 of
    SGLang's verify table (`python -m autotune bench --suite compat_sglang`), with its
    float32 B=32 N=6 V=154880; 15 keys. "smoke": one small key."""
    if preset == "smoke":
        return [tune_key(torch.bfloat16, 4096, 2, 3)]
    bf16, f32 = torch.bfloat16, torch.float32
    keys = [tune_key(bf16, 151936, b, 3) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    keys += [tune_key(bf16, v, 1, 3) for v in (129280, 262144)]
    keys += [tune_key(bf16, 151936, 1, k) for k in (1, 7)]
    return keys + [tune_key(f32, 151936, 1, 3), tune_key(f32, 154880, 32, 5)]


def _extend_inputs(key: dict, device: torch.device, seed: int) -> tuple:
    """draft_tail's tuning inputs for the key in SGLang's arguments (logits [2B, Vd] with
    planted ties, B rows selected out of order, hidden rows), and `out=`: draft_tail's
    poisoned outputs (a check must write them) in SGLang's [B, 1] fields, so each rotated
    input set writes its own buffers, as an engine's step does."""
    inp = DT.tune_inputs(key, device, seed)
    o = inp["out"]
    out = (o.probs.unsqueeze(1), o.tokens.unsqueeze(1), o.hidden, None)
    return inp["logits"], inp["rows"], inp["hidden"], out


def _extend_run(inp: tuple, cfg: dict) -> tuple:
    x, rows, hid, out = inp
    return S.draft_extend_topk1_postprocess(x, rows, hid, out=out, config=cfg)


def _topk1_keys(preset: str) -> list[dict]:
    return [{**k, "H": 0} for k in DT.default_keys(preset)]


def _topk1_inputs(key: dict, device: torch.device, seed: int) -> tuple:
    """The first B rows of draft_tail's tuning logits (a planted tie in every row) as
    SGLang's draft step passes them, [B, Vd]; positions; a 4-column draft_tokens written
    at column 1; `out=`: poisoned (topk_p, topk_index), which a check must write."""
    inp = DT.tune_inputs({**key, "H": 0}, device, seed)
    B, o = key["B"], inp["out"]
    x = inp["logits"][:B].clone()
    return x, inp["positions"], inp["draft_tokens"], inp["column"], \
        (o.probs.unsqueeze(1), o.tokens.unsqueeze(1))


def _topk1_run(inp: tuple, cfg: dict) -> tuple:
    x, pos, drafts, column, out = inp
    return (*S.draft_topk1_postprocess(x, pos, drafts, column, out=out, config=cfg), pos,
            drafts)


def _topk1_reference(inp: tuple) -> tuple:
    x, pos, drafts, column, _ = inp
    return (*S.draft_topk1_reference(x, pos, drafts, column), pos, drafts)


TUNABLES = [
    Tunable(S.TUNING, make_inputs=verify_tune_inputs,
            run=lambda inp, cfg: S.target_verify_topk1_postprocess(*inp, config=cfg),
            reference=lambda inp: S.target_verify_reference(*inp),
            bytes_moved=_verify_bytes, default_keys=_verify_keys),
    Tunable(S.EXTEND_TUNING, make_inputs=_extend_inputs, run=_extend_run,
            reference=lambda inp: S.draft_extend_reference(*inp[:3]),
            bytes_moved=DT.bytes_moved, default_keys=DT.default_keys),
    Tunable(S.TOPK1_TUNING, make_inputs=_topk1_inputs, run=_topk1_run,
            reference=_topk1_reference,
            bytes_moved=lambda key: DT.bytes_moved({**key, "H": 0}),
            default_keys=_topk1_keys),
]


def _takes_out(fn) -> bool:
    return "out" in inspect.signature(fn).parameters


def _like(res):
    """Buffers of the structure and layout of an adapter's result, for `out=`."""
    parts = [None if t is None else torch.empty_like(t) for t in res]
    return type(res)(*parts) if hasattr(res, "_fields") else tuple(parts)


def _verify_shapes(preset: str):
    bf, f32 = torch.bfloat16, torch.float32
    if preset == "smoke":
        return [(bf, 2, 4, 4096)]
    if preset == "quick":
        return [(bf, b, 4, 151936) for b in (1, 32, 256)]
    shapes = [(bf, b, 4, 151936) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    shapes += [(bf, 1, 4, v) for v in (129280, 262144)]
    shapes += [(bf, 1, n, 151936) for n in (2, 8)]
    return shapes + [(f32, 1, 4, 151936), (f32, 32, 6, 154880)]


def _draft_shapes(preset: str):
    if preset == "smoke":
        return [(2, 4096, 256)]
    if preset == "quick":
        return [(1, 32000, 4096), (256, 151936, 4096)]
    return [(b, v, 4096) for v in (32000, 151936) for b in (1, 8, 64, 256)]


def _verify_inputs(key: dict, device, seed: int) -> dict:
    """The verifier's SGLang arguments as the tuner makes them (`verify_tune_inputs`:
    logits whose argmax accepts a random prefix of the drafts, candidates = [last
    committed token, drafts], the chain layout, seq_lens), plus the drafts alone
    (contiguous) for chain_verify."""
    x, cand, ridx, rnext, seq = verify_tune_inputs(key, device, seed)
    return {"logits": x, "candidates": cand, "retrieve_index": ridx,
            "retrieve_next_token": rnext, "seq_lens": seq,
            "drafts": cand[:, 1:].contiguous()}


def _verify_args(s: dict):
    return (s["logits"], s["candidates"], s["retrieve_index"], s["retrieve_next_token"],
            s["seq_lens"])


def _torch_verify(s: dict):
    """Torch's way: argmax of every row, the accept logic, then SGLang's output layout
    (`S.target_verify_reference`)."""
    return S.target_verify_reference(*_verify_args(s))


def _verify_cases(preset: str):
    out = _takes_out(S.target_verify_topk1_postprocess)
    cases = []
    for dtype, B, N, V in _verify_shapes(preset):
        key = tune_key(dtype, V, B, N - 1)

        def make(device, seed, key=key):
            s = _verify_inputs(key, device, seed)
            s["cv_out"] = VerifyResult(*[t.clone() for t in reference(s["logits"],
                                                                              s["drafts"])])
            if out:
                s["out"] = _like(S.target_verify_topk1_postprocess(*_verify_args(s)))
            return s

        def ours(s):
            kw = {"out": s["out"]} if "out" in s else {}
            return S.target_verify_topk1_postprocess(*_verify_args(s), **kw)

        # the logits once, candidates, retrieve tensors and seq_lens read, the 8 outputs
        nbytes = (B * N * V * torch.tensor([], dtype=dtype).element_size()
                  + B * N * 8 * 3 + B * 8 + B * N * (4 + 4 + 8) + B * (4 * 3 + 8 * 2))
        cases.append(BenchCase(
            label={"op": "target_verify", "dtype": dtype_name(dtype), "B": B, "N": N,
                   "V": V},
            make=make, bytes=nbytes,
            variants={
                "ours": BenchVariant(ours),
                **(with_pdl(ours) if B <= 8 else {}),
                "ours: chain_verify": BenchVariant(
                    lambda s: chain_verify(s["logits"], s["drafts"], out=s["cv_out"])),
                "torch eager": BenchVariant(_torch_verify, eager=True, peer=True),
                "torch graph": BenchVariant(_torch_verify, peer=True),
            }))
    return cases


def _torch_draft(s: dict):
    t = torch.argmax(s["logits"], dim=1)
    s["positions"].add_(1)
    s["draft_tokens"][:, s["column"]] = t
    return torch.ones(t.shape[0], 1, dtype=torch.float32, device=t.device), t[:, None]


def _torch_draft_extend(s: dict):
    rows = s["rows"]
    t = torch.argmax(s["logits"][rows], dim=1)
    return (torch.ones(t.shape[0], 1, dtype=torch.float32, device=t.device), t[:, None],
            s["hidden"][rows])


def _draft_cases(preset: str):
    topk1_out = _takes_out(S.draft_topk1_postprocess)
    extend_out = _takes_out(S.draft_extend_topk1_postprocess)
    cases = []
    for B, V, H in _draft_shapes(preset):
        key = draft_key(torch.bfloat16, V, B, H)

        def make_extend(device, seed, key=key):
            inp = DT.make_inputs(key, device, seed)     # logits [2B, V], B rows selected
            s = {"logits": inp["logits"], "rows": inp["rows"], "hidden": inp["hidden"]}
            if extend_out:
                s["out"] = _like(S.draft_extend_topk1_postprocess(
                    s["logits"], s["rows"], s["hidden"]))
            return s

        def extend(s):
            kw = {"out": s["out"]} if "out" in s else {}
            return S.draft_extend_topk1_postprocess(s["logits"], s["rows"], s["hidden"],
                                                    **kw)

        def make_topk1(device, seed, key=key, B=B):
            inp = DT.make_inputs(key, device, seed)
            s = {"logits": inp["logits"][:B].clone(), "positions": inp["positions"],
                 "draft_tokens": inp["draft_tokens"], "column": inp["column"]}
            if topk1_out:
                s["out"] = _like(S.draft_topk1_postprocess(
                    s["logits"], s["positions"], s["draft_tokens"], s["column"]))
            return s

        def topk1(s):
            kw = {"out": s["out"]} if "out" in s else {}
            return S.draft_topk1_postprocess(s["logits"], s["positions"], s["draft_tokens"],
                                             s["column"], **kw)

        label = {"dtype": "bfloat16", "B": B, "V": V}
        cases.append(BenchCase(
            label={"op": "draft_extend", **label, "H": H}, make=make_extend,
            bytes=DT.bytes_moved(key),
            variants={"ours": BenchVariant(extend),
                      "torch eager": BenchVariant(_torch_draft_extend, eager=True,
                                                  peer=True),
                      "torch graph": BenchVariant(_torch_draft_extend, peer=True)}))
        cases.append(BenchCase(
            label={"op": "draft_topk1", **label}, make=make_topk1,
            bytes=DT.bytes_moved({**key, "H": 0}),
            variants={"ours": BenchVariant(topk1),
                      "torch eager": BenchVariant(_torch_draft, eager=True, peer=True),
                      "torch graph": BenchVariant(_torch_draft, peer=True)}))
    return cases


def _bench_cases(preset: str):
    return _verify_cases(preset) + _draft_cases(preset)


SAMPLED_T = 0.7
SAMPLED_CONTROLS = {"off": {}, "topk_topp": {"top_ks": 20, "top_ps": 0.95}}


def _sampled_shapes(preset: str):
    if preset == "smoke":
        return [(1, 4096)]
    if preset == "quick":
        return [(1, 151936), (64, 151936)]
    return [(b, 151936) for b in (1, 8, 64)]


def _sampled_make(B: int, V: int, ctl: dict):
    def make(device, seed):
        """chain_verify's sampled inputs (drafts accepting a random prefix of the argmax,
        seeds, positions) in SGLang's arguments, every request at T = 0.7 ([B, 1]) with
        the case's controls; `out=` for the adapter and for chain_verify."""
        N = 4
        x, d, kw = verify_inputs(tune_key(torch.bfloat16, V, B, N - 1, True), device, seed)
        g = torch.Generator(device="cpu").manual_seed(seed)
        last = torch.randint(0, V, (B, 1), generator=g).to(device)
        ridx = torch.arange(B * N, device=device).view(B, N)     # the chain layout
        rnext = torch.arange(1, N + 1, device=device).repeat(B, 1)
        rnext[:, -1] = -1
        c = {n: torch.full((B,), v, device=device,
                           dtype=torch.int32 if n == "top_ks" else torch.float32)
             for n, v in ctl.items()}
        s = {"x": x, "drafts": d, "cand": torch.cat([last, d.to(torch.int64)], dim=1),
             "ridx": ridx, "rnext": rnext, "seq": kw["positions"], "seeds": kw["seeds"],
             "T": torch.full((B, 1), SAMPLED_T, device=device), "c": c,
             "cv_c": {n[:-1]: t for n, t in c.items()}}
        s["out"] = _like(_sampled(s))
        s["cv_out"] = VerifyResult(*[t.clone() for t in reference(x, d)])
        return s
    return make


def _sampled(s: dict, **kw):
    return S.target_verify_topk1_sample_postprocess(
        s["x"], s["cand"], s["ridx"], s["rnext"], s["seq"], s["T"], **s["c"],
        seeds=s["seeds"], **kw)


def _sampled_chain_verify(s: dict):
    B = s["T"].shape[0]
    return chain_verify(s["x"], s["drafts"], temperature=s["T"].view(B), seeds=s["seeds"],
                        positions=s["seq"], out=s["cv_out"], **s["cv_c"])


def _torch_sampled(s: dict):
    """SGLang's pipeline in torch: softmax(logits / T), the top-k and top-p
    renormalisations by a sort, a sample of every row (exponential race), the accept
    logic and SGLang's layout (another random stream: the same distribution)."""
    B, N = s["cand"].shape
    x = s["x"].float() / s["T"].repeat_interleave(N, dim=0)
    p = torch.softmax(x, dim=-1)
    if s["c"]:
        p = CV.torch_controls(p, **{n[:-1]: t.repeat_interleave(N) for n, t in s["c"].items()})
    tok = torch.argmax(p / torch.empty_like(p).exponential_(), dim=-1)
    return S._sglang_fields(CV_accept(tok.view(B, N), s["drafts"]), s["cand"], s["seq"])


def _sampled_cases(preset: str):
    cases = []
    for B, V in _sampled_shapes(preset):
        for name, ctl in SAMPLED_CONTROLS.items():
            N = 4
            cases.append(BenchCase(
                label={"op": "target_verify_sampled", "dtype": "bfloat16", "B": B, "N": N,
                       "V": V, "controls": name},
                make=_sampled_make(B, V, ctl),
                bytes=B * N * V * 2 + B * N * 8 * 3 + B * 8 * 4 + B * N * (4 + 4 + 8)
                + B * (4 * 3 + 8 * 2),
                variants={
                    "ours": BenchVariant(lambda s: _sampled(s, out=s["out"])),
                    "ours: chain_verify": BenchVariant(_sampled_chain_verify),
                    "torch graph": BenchVariant(_torch_sampled, peer=True),
                }))
    return cases


SUITES = [
    BenchSuite(
        name="compat_sglang", cases=_bench_cases,
        title="compat.sglang (SGLang's top-1 helpers, drop-in)",
        notes="op target_verify: target_verify_topk1_postprocess on logits [B*N, V] "
              "(N = K+1), the chain layout; 'ours, PDL on' (B <= 8): the same launch with "
              "programmatic dependent launch (`pdl_on`; off by default), behind the plain "
              "kernel and back to back; 'ours: chain_verify': recipes.chain_verify on "
              "the same logits (the verification without SGLang's output layout); torch: "
              "argmax of every row, the accept logic, the layout. op draft_extend: "
              "draft_extend_topk1_postprocess on logits [2B, Vd] with B rows selected "
              "and their hidden rows (H) gathered; op draft_topk1: "
              "draft_topk1_postprocess on logits [B, Vd], positions += 1 and a "
              "draft_tokens column written; torch: index, argmax, gather, add_, column "
              "write. Bytes: the logits read once plus the small tensors (and the hidden "
              "rows read and written once).",
        extra={"plot": {"x": "B", "panel": "op",
                        "fixed": {"dtype": "bfloat16", "N": 4, "V": 151936}}}),
    BenchSuite(
        name="compat_sglang_sampled", cases=_sampled_cases,
        title="compat.sglang sampled chain verify (drop-in)",
        notes="target_verify_topk1_sample_postprocess on logits [B*N, V] (N = 4), every "
              "request at T = 0.7 ([B, 1] temperatures), controls off (no control "
              "tensors: one launch) or top_k = 20 with top_p = 0.95 (chain_verify's "
              "controls path), out= given; 'ours: chain_verify': recipes.chain_verify "
              "sampled on the same inputs and controls (the yardstick of "
              "dropin.sglang_sampled); torch: SGLang's pipeline (softmax, top-k and top-p "
              "renormalisation by a sort, a sample per row, accept, layout). Bytes: the "
              "logits read once plus the small tensors.",
        extra={"plot": {"x": "B", "panel": "controls",
                        "fixed": {"dtype": "bfloat16", "N": 4, "V": 151936}}}),
]
