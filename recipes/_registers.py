"""Register budgets of kernel variants.

A variant of a kernel that only adds an epilogue to the finishing program (chain_verify's
SGLang layout) runs the same scan, but the compiler may give the whole kernel more
registers for that epilogue, so an SM holds fewer of its programs (docs/performance.md,
section "Dispatch"). `matching_cap` gives the variant the plain variant's registers
(`maxnreg`), where that compiles without spilling. It runs on every launch of the
variant: building its cache key costs ~13 us of host time a call on a slow CPU host
(28 launch arguments), which a graph replay does not pay.
"""
from __future__ import annotations

import torch

from ._common import interpreter_active

_CAPS: dict = {}        # launch signature -> register cap (or None: no cap)
_UNSET = object()
PROBED = object()       # `register_cap`: Triton skipped the compile
_I32 = 2 ** 31


def _signature(args: tuple) -> tuple:
    """What Triton specialises a launch on, flat: a tensor's dtype and 16-byte alignment;
    an integer's divisibility by 16, equality to 1 and whether it needs 64 bits (one
    small int, never equal to a bool); other values as they are."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a.dtype)
            out.append(a.data_ptr() % 16 == 0)
        elif type(a) is int:
            out.append(2 + (a % 16 == 0) + 2 * (a == 1) + 4 * (not -_I32 <= a < _I32))
        elif isinstance(a, (bool, float, str, type(None))):
            out.append(a)
        else:
            out.append(type(a).__name__)
    return tuple(out)


def register_cap(kernel, args: tuple, meta: dict, plain: dict):
    """The cap `matching_cap` describes, compiling (or loading) the variants on the
    current device; None where no cap is needed or the capped compile spills, and
    `PROBED` where Triton skipped the compile (a `jit_cache_hook` said so, as the tuner's
    compile probe does): then nothing is known, and the launch goes uncapped."""
    base = kernel.warmup(*args, **{**meta, **plain}, grid=(1,))
    ours = kernel.warmup(*args, **meta, grid=(1,))
    if base is None or ours is None:
        return PROBED
    base._init_handles()              # loads the binaries: sets n_regs and n_spills
    ours._init_handles()
    if ours.n_regs <= base.n_regs:
        return None
    capped = kernel.warmup(*args, **meta, maxnreg=base.n_regs, grid=(1,))
    if capped is None:
        return PROBED
    capped._init_handles()
    return base.n_regs if capped.n_spills == 0 else None


def matching_cap(kernel, args: tuple, meta: dict, plain: dict, device: torch.device):
    """`maxnreg` for `kernel[grid](*args, **meta)` so that it uses no more registers than
    the same launch with `plain` laid over `meta` (the variant the caller's tuned table
    timed); None where it needs no cap (it uses no more already), where the capped
    compile spills, under a compile probe, and under the interpreter. Both variants
    compile once per launch signature; later calls cost a dict lookup."""
    if interpreter_active() or device.type != "cuda":
        return None
    sig = (kernel, device.index, tuple(meta.items()), tuple(plain.items()), _signature(args))
    cap = _CAPS.get(sig, _UNSET)
    if cap is not _UNSET:
        return cap
    with torch.cuda.device(device):
        cap = register_cap(kernel, args, meta, plain)
    if cap is PROBED:                 # not cached: the real launch will compile
        return None
    _CAPS[sig] = cap
    return cap
