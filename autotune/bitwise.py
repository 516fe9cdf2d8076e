"""Bit-for-bit comparison, the tuner's and the tests' one notion of "equal outputs":
floating tensors are compared as same-size integers, so -0.0 differs from +0.0 and a
NaN equals the same NaN."""
from __future__ import annotations

import torch

# the integer dtype of each element size
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns on the CPU (floating dtypes as same-size integers);
    other dtypes as they are."""
    return _bit_view(t.detach().cpu().contiguous())


def _bit_view(t: torch.Tensor) -> torch.Tensor:
    """`t` on its device, floating dtypes viewed as same-size integers (any strides)."""
    return t.view(_SAME_SIZE_INT[t.element_size()]) if t.is_floating_point() else t


def outputs_equal(a, b) -> bool:
    """Bitwise equality of (nested tuples of) tensors; None matches None. Compared on the
    tensors' device with one host sync in all (a tuner checks thousands of configs)."""
    pairs: list = []
    if not _same_structure(a, b, pairs):
        return False
    differs = [(_bit_view(x) != _bit_view(y.to(x.device))).any() for x, y in pairs
               if x.numel()]
    return not differs or not bool(torch.stack(differs).any())


def _same_structure(a, b, pairs: list) -> bool:
    """Equal apart from the tensors' contents; the tensor pairs (same dtype and shape)
    go to `pairs`."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape):
            return False
        pairs.append((a.detach(), b.detach()))
        return True
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_structure(x, y, pairs)
                                        for x, y in zip(a, b, strict=True))
    return a == b
