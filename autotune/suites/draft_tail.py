"""draft_tail beyond dispatch: its tuning inputs, keys and torch peer, and the benchmark
of it against the torch ops an engine runs for a draft step's tail."""
import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from autotune.suites import with_pdl
from recipes import _common as C
from recipes.draft_tail import TUNING, DraftTail, draft_tail, reference, tune_key


def make_inputs(key: dict, device: torch.device, seed: int) -> dict:
    """R = 2B logits rows with planted cross-row ties, B of them selected out of order,
    a non-monotone int64 map, hidden rows in the logits' dtype, positions and a
    4-column draft_tokens written at column 1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, V, H = key["B"], key["V"], key["H"]
    dtype = getattr(torch, key["dtype"])
    R = 2 * B
    x = torch.randn(R, V, generator=g).to(dtype)
    top = x.float().max(dim=1).values
    j = torch.randint(0, V, (R,), generator=g)
    x[torch.arange(R), j] = top.to(dtype)           # a tie for the max in every row
    rows = torch.randperm(R, generator=g)[:B]
    token_map = torch.randperm(V, generator=g) + torch.randint(0, 1000, (V,), generator=g)
    hidden = torch.randn(R, H, generator=g).to(dtype) if H > 0 else None
    return {"logits": x.to(device), "rows": rows.to(device), "token_map": token_map.to(device),
            "hidden": None if hidden is None else hidden.to(device),
            "positions": torch.randint(0, 4096, (B,), generator=g).to(device),
            "draft_tokens": torch.full((B, 4), -1, dtype=torch.int64).to(device),
            "column": 1}


def _call(inp: dict, cfg=None, out=None) -> DraftTail:
    return draft_tail(inp["logits"], rows=inp["rows"], hidden=inp["hidden"],
                      token_map=inp["token_map"], positions=inp["positions"],
                      draft_tokens=inp["draft_tokens"], column=inp["column"],
                      out=out, config=cfg)


def tune_inputs(key: dict, device: torch.device, seed: int) -> dict:
    """What the tuner and `make bench` time at a key: `make_inputs` plus `out`, the
    outputs passed as `out=` (poisoned: a check must write them), so each rotated input
    set writes its own buffers, as an engine's step writes buffers that the rest of the
    step has evicted from L2. Allocated in a graph instead, every call would write one
    reused block that stays in L2 (the gathered hidden rows: B x H, 2 MB at B=256
    H=4096), which ranks configs otherwise (docs/performance.md, *Dispatch*)."""
    inp = make_inputs(key, device, seed)
    B, hid = key["B"], inp["hidden"]
    inp["out"] = DraftTail(
        torch.full((B,), -7, dtype=torch.int64, device=device),
        torch.full((B,), float("nan"), dtype=torch.float32, device=device),
        None if hid is None else torch.full((B, hid.shape[1]), float("nan"),
                                            dtype=hid.dtype, device=device))
    return inp


def _tune_run(inp: dict, cfg: dict):
    """Everything the call writes, compared bit for bit: the DraftTail, positions and
    draft_tokens (the tuner runs each check on fresh copies of the inputs)."""
    res = _call(inp, cfg, out=inp["out"])
    return (*res, inp["positions"], inp["draft_tokens"])


def _tune_reference(inp: dict):
    res = reference(inp["logits"], inp["rows"], inp["hidden"], inp["token_map"],
                    inp["positions"], inp["draft_tokens"], inp["column"])
    return (*res, inp["positions"], inp["draft_tokens"])


def torch_tail(inp: dict):
    """Torch's way, as serving engines write it: index the rows, argmax, map, gather the
    hidden rows, positions += 1, write the column (several launches)."""
    idx = inp["rows"]
    t = torch.argmax(inp["logits"][idx], dim=1)
    tokens = inp["token_map"][t]
    probs = torch.ones(idx.shape[0], dtype=torch.float32, device=idx.device)
    h = None if inp["hidden"] is None else inp["hidden"][idx]
    inp["positions"].add_(1)
    inp["draft_tokens"][:, inp["column"]] = tokens
    return tokens, probs, h


def bytes_moved(key: dict, hidden_passes: int = 2) -> int:
    """Selected logits rows read once, hidden rows read and written once (hidden in the
    logits' dtype), plus the small per-row traffic. hidden_passes=1 counts the hidden
    rows once (the bandwidth target of `autotune/targets.py` counts them so)."""
    es = C.dtype_size(key["dtype"])
    B = key["B"]
    return B * key["V"] * es + hidden_passes * B * key["H"] * es + B * (8 + 8 + 4 + 16 + 8)


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": one small key): the benchmark's
    batch sizes B = 1, 8, 64, 256 at Vd = 32000 and 151936, H = 4096. This space
    compiles nearly a binary a config (8 keys: ~4200 (key, config) pairs on ~2400
    binaries, the most of any recipe), so the benchmark's H = 7168 and Vd = 128256 are
    not keys of their own: they lie within a factor 2 of one tuned key only (the B next
    to theirs are a factor 8 away), so dispatch gives them the heuristic, never a far
    config."""
    if preset == "smoke":
        return [tune_key(torch.bfloat16, 4096, 2, 256)]
    return [tune_key(torch.bfloat16, v, b, h) for v in (32000, 151936) for h in (4096,)
            for b in (1, 8, 64, 256)]


TUNABLES = [Tunable(
    TUNING, make_inputs=tune_inputs, run=_tune_run, reference=_tune_reference,
    torch_peer=torch_tail, bytes_moved=bytes_moved, default_keys=default_keys)]


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
            return tune_inputs(key, device, seed)    # with out=, as the tuner times

        cases.append(BenchCase(
            label={"dtype": "bfloat16", "B": B, "V": V, "H": H},
            make=make, bytes=bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: _call(s, out=s["out"])),
                **with_pdl(lambda s: _call(s, out=s["out"])),
                "torch eager": BenchVariant(torch_tail, eager=True, peer=True),
                "torch graph": BenchVariant(torch_tail, peer=True),
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
