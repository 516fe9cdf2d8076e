"""Register budgets of kernel variants.

A variant of a kernel that only adds an epilogue to the finishing program (chain_verify's
SGLang layout) runs the same scan, but the compiler may give the whole kernel more
registers for that epilogue, so an SM holds fewer of its programs (docs/performance.md,
section "Dispatch"). `matching_cap` gives the variant the plain variant's registers
(`maxnreg`), where that compiles without spilling. It runs on every launch of the
variant: building its cache key costs ~15 us of host time a call (a CPU measurement),
which a graph replay does not pay.
"""
from __future__ import annotations

import torch

from ._common import interpreter_active

_CAPS: dict = {}        # launch signature -> register cap (or None: no cap)
_UNSET = object()


def _spec(a):
    """What Triton specialises a launch argument on: a tensor's dtype and 16-byte
    alignment, an integer's divisibility by 16 and equality to 1, other values as they
    are."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or not isinstance(a, int):
        return a if isinstance(a, (bool, float, str, type(None))) else type(a).__name__
    return (a % 16 == 0, a == 1)


def matching_cap(kernel, args: tuple, meta: dict, plain: dict, device: torch.device):
    """`maxnreg` for `kernel[grid](*args, **meta)` so that it uses no more registers than
    the same launch with `plain` laid over `meta` (the variant the caller's tuned table
    timed); None where it needs no cap (it uses no more already), where the capped
    compile spills, and under the interpreter. Both variants compile once per launch
    signature; later calls cost a dict lookup."""
    if interpreter_active() or device.type != "cuda":
        return None
    sig = (kernel, device.index, tuple(sorted(meta.items())), tuple(sorted(plain.items())),
           tuple(_spec(a) for a in args))
    cap = _CAPS.get(sig, _UNSET)
    if cap is not _UNSET:
        return cap
    with torch.cuda.device(device):
        base = kernel.warmup(*args, **{**meta, **plain}, grid=(1,))
        ours = kernel.warmup(*args, **meta, grid=(1,))
        base._init_handles()              # loads the binaries: sets n_regs and n_spills
        ours._init_handles()
        cap = None
        if ours.n_regs > base.n_regs:
            capped = kernel.warmup(*args, **meta, maxnreg=base.n_regs, grid=(1,))
            capped._init_handles()
            cap = base.n_regs if capped.n_spills == 0 else None
    _CAPS[sig] = cap
    return cap
