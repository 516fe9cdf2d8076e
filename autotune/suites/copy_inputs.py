"""copy_inputs beyond dispatch: its tuning inputs (mixed-dtype pairs) and keys, and the
benchmark of one launch for a step graph's input copies against copy_ per pair."""
import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from recipes.copy_inputs import TUNING, copy_inputs, tune_key

_MIX = (torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.float16, torch.bool,
        torch.int8, torch.float64)


def _pair_sizes(key: dict):
    """(dtype, elements) of each pair: mixed dtypes, the first pair `pair_bytes` bytes,
    the others a few elements fewer (odd lengths)."""
    out = []
    for i in range(key["pairs"]):
        dt = _MIX[i % len(_MIX)]
        es = torch.empty((), dtype=dt).element_size()
        out.append((dt, max(1, key["pair_bytes"] // es - (0 if i == 0 else (i * 7) % 13))))
    return out


def make_pairs(key: dict, device: torch.device, seed: int, *, poison: bool = True) -> dict:
    """The pairs of `_pair_sizes(key)` as copy_inputs' arguments {"src": [...], "dst":
    [...]}: sources random bits, destinations poisoned."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pairs = {"src": [], "dst": []}
    for dt, n in _pair_sizes(key):
        es = torch.empty((), dtype=dt).element_size()
        bits = torch.randint(-128, 128, (n * es,), generator=g, dtype=torch.int8)
        if dt == torch.bool:                    # only 0 and 1 are bool values
            src, fill = (bits & 1).view(torch.bool), 1
        else:
            src, fill = bits.view(dt), 0x5A
        dst = torch.full((n * es,), fill if poison else 0, dtype=torch.uint8).view(dt)
        pairs["src"].append(src.to(device))
        pairs["dst"].append(dst.to(device))
    return pairs


def bytes_moved(key: dict) -> int:
    """Every pair read and written once."""
    return sum(2 * n * torch.empty((), dtype=dt).element_size() for dt, n in _pair_sizes(key))


def _bytes_view(ts):
    return tuple(t.reshape(-1).view(torch.int8) for t in ts)


def _run(pairs: dict, cfg: dict):
    """The tuner checks each config on fresh copies of the (poisoned) pairs."""
    copy_inputs(**pairs, config=cfg)
    return _bytes_view(pairs["dst"])


def _ref(pairs: dict):
    return tuple(t.clone() for t in _bytes_view(pairs["src"]))


def _peer(pairs: dict):
    for s, d in zip(pairs["src"], pairs["dst"], strict=True):
        d.copy_(s)
    return _bytes_view(pairs["dst"])


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": one small key): the benchmark's
    shapes, (pairs, largest pair's bytes) = (1, 4 KB), (8, 256 B), (8, 4 KB), (16, 4 KB),
    (8, 1 MB), (2, 64 MB), (16, 16 MB). 7 keys, ~370 (key, config) pairs."""
    if preset == "smoke":
        return [tune_key(3, 1024)]
    return [tune_key(p, n) for p, n in ((1, 4096), (8, 256), (8, 4096), (16, 4096),
                                        (8, 1 << 20), (2, 64 << 20), (16, 16 << 20))]


TUNABLES = [Tunable(
    TUNING, make_inputs=make_pairs, run=_run, reference=_ref, torch_peer=_peer,
    bytes_moved=bytes_moved, default_keys=default_keys)]


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

        cases.append(BenchCase(
            label={"pairs": n_pairs, "pair_bytes": nbytes}, make=make,
            bytes=bytes_moved(key),
            variants={
                "ours": BenchVariant(lambda s: copy_inputs(**s)),
                "ours eager": BenchVariant(lambda s: copy_inputs(**s), eager=True),
                "torch eager": BenchVariant(_peer, eager=True, peer=True),
                "torch graph": BenchVariant(_peer, peer=True),
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
