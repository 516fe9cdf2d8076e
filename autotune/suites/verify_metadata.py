"""verify_metadata beyond dispatch: its tuning inputs, keys and comparison, and the
benchmark of it against the torch ops an engine runs for the same fields."""
import torch
import triton

from autotune.bitwise import outputs_equal
from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from recipes.verify_metadata import (
    TUNING,
    VerifyMetadata,
    engine_torch,
    reference,
    tune_key,
    verify_metadata,
)


def metadata_equal(ours, ref) -> bool:
    """Bitwise equality of two VerifyMetadata, comparing kv_indices only up to
    ref.kv_indptr[B] (the entries past it are unspecified)."""
    ours, ref = list(ours), list(ref)
    k = VerifyMetadata._fields.index("kv_indices")
    if ref[k] is not None and ours[k] is not None:
        total = int(ref[VerifyMetadata._fields.index("kv_indptr")][-1])
        ours[k], ref[k] = ours[k][:total], ref[k][:total]
    return outputs_equal(tuple(ours), tuple(ref))


TUNE_N = 4   # verify tokens (K + 1) in tuning and benchmark inputs


def make_inputs(key: dict, device: torch.device, seed: int, *, N: int = TUNE_N,
                context: int | None = None, window: int | None = None) -> dict:
    """In-range inputs for a key: P = B + 5 pool rows (row stride C + 16), random slot
    ids in req_to_token, requests at random pool rows with seq_lens in [0, C - N]
    (or near `context` when given)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, ps, mp = key["B"], key["page_size"], key["max_pages"]
    Cap = mp * ps
    P = B + 5
    base = torch.randint(0, 1 << 24, (P, Cap + 16), generator=g, dtype=torch.int32)
    r2t = base.to(device)[:, :Cap]
    rpi = torch.randperm(P, generator=g)[:B].to(torch.int64)
    if context is None:
        seq = torch.randint(0, max(Cap - N, 0) + 1, (B,), generator=g)
    else:
        hi = max(min(context, Cap) - N, 0)
        seq = (hi - torch.randint(0, max(1, hi // 8) + 1, (B,), generator=g)).clamp(min=0)
    return {"req_pool_indices": rpi.to(device), "seq_lens": seq.to(device),
            "req_to_token": r2t, "num_tokens": N, "page_size": ps, "window": window,
            "max_pages": mp, "layout": key["layout"]}


def bytes_moved(key: dict, N: int = TUNE_N) -> int:
    """Inputs read (indices, lengths, N slots and one slot per page) and outputs written
    (the page table row in full for fa3)."""
    B, mp = key["B"], key["max_pages"]
    fa3 = key["layout"] in ("fa3", "both")
    fi = key["layout"] in ("flashinfer", "both")
    n = B * 16 + B * N * 4 + B * mp * 4                        # reads (pages at most mp)
    n += B * N * 16 + B * 4 + (B + 1) * 8 + 4                  # positions, loc, seqk, cu, max
    n += B * mp * 4 if fa3 else 0
    n += (B + 1) * 4 + B * mp * 4 + B * 4 if fi else 0
    return n


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": one small key): the benchmark's
    shapes, layout fa3 at page sizes 64 and 1 x contexts 4096, 32768, 163840 tokens
    (max_pages = context / page size) x B = 1, 8, 64, 256, and layout both at B = 8,
    32768 tokens, page size 64. 25 keys, ~2600 (key, config) pairs."""
    if preset == "smoke":
        return [tune_key("both", 16, 2, 64)]
    keys = [tune_key("fa3", ps, b, -(-ctx // ps)) for ps in (64, 1)
            for ctx in (4096, 32768, 163840) for b in (1, 8, 64, 256)]
    return keys + [tune_key("both", 64, 8, 32768 // 64)]


def tune_inputs(key: dict, device: torch.device, seed: int) -> tuple[dict, VerifyMetadata]:
    """What the tuner and `make bench` time at a key: (arguments, preallocated outputs).
    Requests near its full width (max_pages x page_size tokens), the heaviest call the
    key covers; the outputs passed as `out=`, so each rotated input set writes its own
    buffers, as an engine's step writes buffers that the rest of the step has evicted
    from L2. A key's best config depends on both: with lengths drawn over the whole
    range, or with every call writing one freshly allocated page table (a graph reuses
    the block, so it stays in L2), B=64 at 4096 one-token pages chose 4 programs a row,
    which ran full rows into rotated outputs 2-3% slower than the heuristic's 16."""
    inp = make_inputs(key, device, seed, context=key["max_pages"] * key["page_size"])
    out = verify_metadata(**inp)
    for t in out:                       # no answer left in them: a check must write it
        if isinstance(t, torch.Tensor):
            t.fill_(-0x5A5A5A5A)
    return inp, out


def _run(inp: tuple, cfg: dict) -> VerifyMetadata:
    return verify_metadata(**inp[0], out=inp[1], config=cfg)


TUNABLES = [Tunable(
    TUNING, make_inputs=tune_inputs, run=_run,
    reference=lambda inp: reference(**inp[0]), torch_peer=lambda inp: engine_torch(**inp[0]),
    compare=metadata_equal, bytes_moved=bytes_moved, default_keys=default_keys)]


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
            inp, out = tune_inputs(key, device, seed)    # as the tuner times
            return {"inp": inp, "out": out}

        cases.append(BenchCase(
            label={"B": B, "context": ctx, "page_size": ps, "layout": layout, "N": TUNE_N},
            make=make, bytes=bytes_moved(key),
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
