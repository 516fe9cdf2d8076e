"""relay beyond dispatch: its tuning inputs (the decode-step state), keys and torch peer,
and the benchmark of relay_scatter / relay_gather against torch's index_copy_ /
index_select."""
from typing import NamedTuple

import torch

from autotune.declare import BenchCase, BenchSuite, BenchVariant, Tunable
from recipes.relay import (
    MODES,
    TUNING,
    heuristic,
    reference,
    relay_gather,
    relay_scatter,
    tune_key,
)

POOL = 1024
# the decode-step state: (name, dtype, is hidden); hidden is [B, H], the rest [B]
_STATE_FIELDS = (("bonus", torch.int64, False), ("top1_id", torch.int64, False),
                 ("top1_prob", torch.float32, False), ("hidden", torch.bfloat16, True),
                 ("new_seq_len", torch.int64, False))
_EXTRA_FIELDS = (("extra_i32", torch.int32, False), ("extra_f32", torch.float32, False),
                 ("extra_i64", torch.int64, False))


class RelayState(NamedTuple):
    """A tuning/bench input set (a NamedTuple, so the tuner's deep copy reaches the
    tensors)."""
    mode: str
    index: torch.Tensor
    fields: list


def _field_specs(nfields: int):
    specs = list(_STATE_FIELDS[:nfields])
    if not any(h for _, _, h in specs):          # fewer than 4 fields: keep the hidden
        specs[-1] = _STATE_FIELDS[3]
    return specs + list(_EXTRA_FIELDS[:max(0, nfields - len(_STATE_FIELDS))])


def make_inputs(key: dict, device: torch.device, seed: int) -> RelayState:
    """The decode-step fields (bonus, top-1 id, top-1 prob, hidden [., width], new seq len,
    then extra scalars) with a pool of max(1024, B) slots and B distinct valid slots."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, W, mode = key["B"], key["width"], key["mode"]
    P = max(POOL, B)
    index = torch.randperm(P, generator=g)[:B].to(device)
    fields = []
    for _, dtype, hidden in _field_specs(key["nfields"]):
        tail = (W,) if hidden else ()
        if dtype.is_floating_point:
            pool = torch.randn((P,) + tail, generator=g).to(dtype)
            batch = torch.randn((B,) + tail, generator=g).to(dtype)
        else:
            pool = torch.randint(0, 2**31, (P,) + tail, generator=g).to(dtype)
            batch = torch.randint(0, 2**31, (B,) + tail, generator=g).to(dtype)
        pool, batch = pool.to(device), batch.to(device)
        fields.append((batch, pool) if mode == "scatter" else (pool, batch))
    return RelayState(mode, index, fields)


def _run(s: RelayState, cfg):
    (relay_scatter if s.mode == "scatter" else relay_gather)(s.index, s.fields, config=cfg)
    return tuple(d for _, d in s.fields)


def _reference_outputs(s: RelayState):
    """The reference on clones of the dsts (runs are idempotent, so this is what any
    number of earlier runs leaves in the dsts)."""
    fields = [(src, dst.clone()) for src, dst in s.fields]
    reference(s.index, fields, s.mode)
    return tuple(d for _, d in fields)


def torch_peer(s: RelayState):
    """torch's way: one index_copy_ (scatter) or index_select (gather) per field."""
    idx = s.index if s.index.dtype == torch.int64 else s.index.long()
    for src, dst in s.fields:
        if s.mode == "scatter":
            dst.index_copy_(0, idx, src if src.dtype == dst.dtype else src.to(dst.dtype))
        elif src.dtype == dst.dtype:
            torch.index_select(src, 0, idx, out=dst)
        else:
            dst.copy_(torch.index_select(src, 0, idx))
    return tuple(d for _, d in s.fields)


def _bytes_fields(B: int, fields, index_es: int = 8) -> int:
    """All fields' bytes read and written, plus the index."""
    n = B * index_es
    for src, dst in fields:
        n += B * src[0].numel() * (src.element_size() + dst.element_size())
    return n


def bytes_moved(key: dict) -> int:
    n = key["B"] * 8
    for _, dtype, hidden in _field_specs(key["nfields"]):
        es = torch.empty((), dtype=dtype).element_size()
        n += key["B"] * (key["width"] if hidden else 1) * 2 * es
    return n


def default_keys(preset: str) -> list[dict]:
    """The keys `make tune` measures ("gpu"; "smoke": one small key): the benchmark's
    shapes, both modes x hidden widths 4096 and 7168 x B = 1, 8, 64, 256, with the five
    decode-step fields. 16 keys, ~680 (key, config) pairs."""
    if preset == "smoke":
        return [tune_key("scatter", 2, 64, 3)]
    return [tune_key(m, b, w, 5) for m in MODES for w in (4096, 7168)
            for b in (1, 8, 64, 256)]


TUNABLES = [Tunable(
    TUNING, make_inputs=make_inputs, run=_run, reference=_reference_outputs,
    torch_peer=torch_peer, bytes_moved=bytes_moved, default_keys=default_keys)]


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
