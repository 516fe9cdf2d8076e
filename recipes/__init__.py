"""spec-cookbook: Triton kernels for the hot paths of speculative decoding.

Every public function matches the plain-torch `reference` of its module bit for bit;
see SPEC.md for the contract. CPU tensors run the same kernels under the Triton
interpreter (set TRITON_INTERPRET=1 before importing).
"""
from .argmax import argmax
from .chain_verify import VerifyResult, chain_verify

__all__ = ["argmax", "chain_verify", "VerifyResult"]
