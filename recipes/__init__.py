"""spec-cookbook: Triton kernels for the hot paths of speculative decoding.

Every public function matches the plain-torch `reference` of its module bit for bit;
docs/contract.md states the contract. CPU tensors run the same kernels under the Triton
interpreter (set TRITON_INTERPRET=1 before importing).
"""
__version__ = "0.3.0"

from . import (
           ops,  # noqa: F401,E402  (registers torch.ops.spec_cookbook.*, the custom ops)
           tp,  # noqa: E402  (recipes.tp: vocabulary-parallel argmax and chain_verify)
)
from ._common import pdl_off, pdl_on  # noqa: E402
from .argmax import argmax  # noqa: E402
from .chain_verify import VerifyResult, chain_verify  # noqa: E402
from .copy_inputs import copy_inputs  # noqa: E402
from .draft_tail import DraftTail, draft_tail  # noqa: E402
from .relay import relay_gather, relay_scatter  # noqa: E402
from .verify_metadata import VerifyMetadata, verify_metadata  # noqa: E402

__all__ = ["__version__", "argmax", "chain_verify", "VerifyResult", "copy_inputs",
           "draft_tail", "DraftTail", "relay_gather", "relay_scatter", "verify_metadata",
           "VerifyMetadata", "pdl_off", "pdl_on", "tp"]
