"""spec-cookbook: Triton kernels for the hot paths of speculative decoding.

Every public function matches the plain-torch `reference` of its module bit for bit;
see SPEC.md for the contract. CPU tensors run the same kernels under the Triton
interpreter (set TRITON_INTERPRET=1 before importing).
"""
from . import (
    ops,  # noqa: F401  (registers torch.ops.spec_cookbook.*, the custom ops)
    tp,  # recipes.tp: vocabulary-parallel argmax and chain_verify
)
from .argmax import argmax
from .chain_verify import VerifyResult, chain_verify
from .copy_inputs import copy_inputs
from .draft_tail import DraftTail, draft_tail
from .relay import relay_gather, relay_scatter
from .verify_metadata import VerifyMetadata, verify_metadata

__all__ = ["argmax", "chain_verify", "VerifyResult", "draft_tail", "DraftTail",
           "verify_metadata", "VerifyMetadata", "copy_inputs", "relay_scatter", "relay_gather",
           "tp"]
