"""recipes.compat.vllm beyond dispatch: the tuning inputs of the ragged launch (MRv2's
layout), and the benchmark of vLLM's rejection samplers, drop-in, against our own
chain_verify on the same shape (B requests, K = 3, V = 151936 bf16) and, where vLLM is
importable on the GPU, against vLLM's own functions.

Layouts: "uniform" (every request drafts K tokens) and "ragged" (drafts 3, 1, 0, 2 in
turn, so the logits hold fewer rows than B x (K + 1)). Ops: v1 greedy, MRv2 greedy,
MRv2 sampled (temperatures in [0.5, 1.5], the logits taken as already divided, as vLLM
passes them) and MRv2 with top_k/top_p through the controls (B <= 64). "ours:
chain_verify" is recipes.chain_verify on the uniform batch of the same B (greedy,
sampled, or sampled with the same controls): the yardstick of the drop-in targets.
"""
import importlib.util
import types

import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from autotune.suites.chain_verify import make_inputs as verify_inputs
from recipes._common import dtype_size
from recipes.chain_verify import chain_verify, tune_key
from recipes.compat.vllm import _ragged as RG
from recipes.compat.vllm import mrv2, v1


def mrv2_inputs(key: dict, device: torch.device, seed: int) -> tuple:
    """A ragged MRv2 batch of key["N"] rows: requests of 1..4 rows (0..3 drafts, K = 3),
    drafts accepting a random prefix of the argmax, positions, states in shuffled order;
    sampled keys give every state a temperature in [0.5, 1.5] and a seed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    N, V, K = key["N"], key["V"], 3
    lens = []
    while sum(lens) < N:
        lens.append(min(int(torch.randint(1, K + 2, (1,), generator=g)), N - sum(lens)))
    R = len(lens)
    x = torch.randn(N, V, generator=torch.Generator(device=device).manual_seed(seed),
                    device=device).to(getattr(torch, key["dtype"]))
    t = torch.argmax(x, dim=1).cpu()
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(lens).cumsum(0)])
    ds = torch.randint(0, V, (N,), generator=g)
    for b in range(R):
        s, n = int(cu[b]), lens[b] - 1
        keep = int(torch.randint(0, n + 1, (1,), generator=g))
        ds[s + 1:s + 1 + n] = t[s:s + n]
        if keep < n:
            ds[s + 1 + keep] = (t[s + keep] + 1) % V
    pos = torch.cat([torch.arange(n) + int(torch.randint(0, 2**20, (1,), generator=g))
                     for n in lens])
    idx = torch.randperm(R, generator=g)
    elp = torch.cat([torch.arange(n) for n in lens])
    eidx = torch.repeat_interleave(idx, torch.tensor(lens))
    if key.get("mode") == "sampled":
        temp = 0.5 + torch.rand(R, generator=g)
        sd = torch.randint(-2**62, 2**62, (R,), generator=g)
    else:
        temp, sd = torch.zeros(R), torch.zeros(R, dtype=torch.int64)
    return (x, None, *(v.to(device) for v in (ds, cu, pos, idx, eidx, elp, temp, sd)), K)


def _mrv2_run(inp: tuple, cfg: dict):
    return mrv2.rejection_sample(*inp, config=cfg)


def bytes_moved(key: dict) -> int:
    """The logits once, the per-row ids and positions, the outputs (K = 3)."""
    N = key["N"]
    return N * key["V"] * dtype_size(key["dtype"]) + N * 16 + N * 12


def default_keys(preset: str) -> list[dict]:
    """bfloat16 V = 151936 at N = 4B rows for B = 1, 4, 16, 64, 256 (the compat_vllm
    bench's uniform batches; its ragged ones lie within a factor 2 in N), greedy and
    sampled; "smoke": one small key of each."""
    if preset == "smoke":
        return [RG.tune_key(torch.bfloat16, 4096, 6, s) for s in (False, True)]
    return [RG.tune_key(torch.bfloat16, 151936, 4 * b, s) for s in (False, True)
            for b in (1, 4, 16, 64, 256)]


TUNABLES = [Tunable(
    RG.TUNING, make_inputs=mrv2_inputs, run=_mrv2_run,
    reference=lambda inp: mrv2.reference(*inp), bytes_moved=bytes_moved,
    default_keys=default_keys)]


K, V, DT = 3, 151936, torch.bfloat16
RAGGED = (3, 1, 0, 2)
CONTROLS = {"top_k": 20, "top_p": 0.95}     # mrv2_controls: every state's


def _shapes(preset: str):
    if preset == "smoke":
        return [(2, 4096)]
    if preset == "quick":
        return [(1, V), (64, V)]
    return [(b, V) for b in (1, 4, 16, 64, 256)]


def _drafts(B: int, layout: str) -> list[int]:
    return [K] * B if layout == "uniform" else [RAGGED[i % 4] for i in range(B)]


def _vllm(path: str):
    """vLLM's module at `path`, or None where vLLM is not importable (or not on CUDA)."""
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        return None
    try:
        return importlib.import_module(path)
    except Exception:  # noqa: BLE001 - an unusable install is not timed
        return None


def _make(B, Vv, layout, op):
    def make(device, seed):
        nd = _drafts(B, layout)
        g = torch.Generator(device="cpu").manual_seed(seed)
        sampled = op in ("mrv2_sampled", "mrv2_controls")
        x, d, kw = verify_inputs(tune_key(DT, Vv, B, K, sampled), device, seed)
        s = {"cv": (x, d, kw), "kw": {}}
        if op == "mrv2_controls":
            c = {n: torch.full((B,), v, device=device,
                               dtype=torch.int32 if n == "top_k" else torch.float32)
                 for n, v in CONTROLS.items()}
            s["cv"] = (x, d, {**kw, **c})
            s["kw"] = {"apply_temperature": True, **c}
        rows = [j for b, n in enumerate(nd)
                for j in range(b * (K + 1), b * (K + 1) + n + (0 if op == "v1" else 1))]
        logits = x[torch.tensor(rows, device=device)].contiguous()
        N = logits.shape[0]
        if op == "v1":
            dt = torch.cat([d[b, :n] for b, n in enumerate(nd)]).to(torch.int32)
            s["args"] = (dt, nd, K, torch.tensor(nd, device=device).cumsum(0).to(torch.int32),
                         None, logits, torch.randint(0, Vv, (B, 1), generator=g).to(device)
                         .to(torch.int32),
                         types.SimpleNamespace(all_greedy=True, all_random=False,
                                               temperature=None, top_k=None, top_p=None,
                                               generators={}))
            s["out"] = torch.empty(B, K + 1, dtype=torch.int32, device=device)
        else:
            L = [n + 1 for n in nd]
            cu = torch.cat([torch.zeros(1, dtype=torch.int64),
                            torch.tensor(L).cumsum(0)]).to(device).to(torch.int32)
            ds = torch.cat([torch.cat([d[b, :1] * 0, d[b, :n]]) for b, n in enumerate(nd)])
            pos = torch.cat([torch.arange(n) + 1000 * i for i, n in enumerate(L)]).to(device)
            idx = torch.arange(B, device=device, dtype=torch.int32)
            eidx = torch.repeat_interleave(idx, torch.tensor(L, device=device))
            elp = torch.cat([torch.arange(n) for n in L]).to(device).to(torch.int32)
            temp = (kw["temperature"] if sampled else torch.zeros(B, device=device)).float()
            seeds = kw["seeds"] if sampled else torch.zeros(B, dtype=torch.int64,
                                                            device=device)
            s["args"] = (logits, None, ds, cu, pos, idx, eidx, elp, temp, seeds, K)
            s["out"] = (torch.empty(B, K + 1, dtype=torch.int64, device=device),
                        torch.empty(B, dtype=torch.int32, device=device))
        s["N"] = N
        return s
    return make


def _cases(preset: str):
    v1_ref = _vllm("vllm.v1.sample.rejection_sampler")
    m2_ref = _vllm("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
    cases = []
    for B, Vv in _shapes(preset):
        for layout in ("uniform", "ragged"):
            ops = ("v1", "mrv2", "mrv2_sampled") + (("mrv2_controls",) if B <= 64 else ())
            for op in ops:
                fn = v1.rejection_sample if op == "v1" else mrv2.rejection_sample
                ref = v1_ref if op == "v1" else m2_ref
                rows = sum(n + (op != "v1") for n in _drafts(B, layout))
                variants = {
                    "ours": BenchVariant(lambda s, fn=fn: fn(*s["args"], out=s["out"],
                                                             **s["kw"])),
                    "ours: chain_verify": BenchVariant(
                        lambda s: chain_verify(s["cv"][0], s["cv"][1], **s["cv"][2])),
                }
                if ref is not None and op != "mrv2_controls":
                    variants["vllm"] = BenchVariant(
                        lambda s, ref=ref: ref.rejection_sample(*s["args"]), peer=True)
                cases.append(BenchCase(
                    label={"op": op, "layout": layout, "dtype": "bfloat16", "B": B, "K": K,
                           "V": Vv},
                    make=_make(B, Vv, layout, op),
                    bytes=rows * Vv * 2 + rows * 16 + B * (K + 1) * 8, variants=variants))
    return cases


SUITES = [
    BenchSuite(
        name="compat_vllm", cases=_cases,
        title="compat.vllm (vLLM's rejection samplers, drop-in)",
        notes="op v1: v1.rejection_sample (greedy batch, all_greedy); op mrv2 / "
              "mrv2_sampled: mrv2.rejection_sample with temperature 0 / in [0.5, 1.5] "
              "(the logits as vLLM passes them, divided already); op mrv2_controls (B <= "
              "64): the raw logits with apply_temperature=True and top_k = 20, top_p = "
              "0.95 per state (the controls' threshold launch, then the verify), against "
              "chain_verify with the same controls. layout uniform: K = 3 "
              "drafts a request; ragged: 3, 1, 0, 2 in turn. 'ours: chain_verify': "
              "recipes.chain_verify on the uniform batch of the same B (sampled for "
              "mrv2_sampled); 'vllm': vLLM's own function where importable on the GPU. "
              "Bytes: the rows read once plus ids and outputs.",
        extra={"plot": {"x": "B", "panel": "op",
                        "fixed": {"dtype": "bfloat16", "layout": "uniform", "V": V}}}),
]
