"""Size arguments: a value that cannot be served (too large for the kernels' int32
arithmetic or for one Triton block, zero or negative where a count must be positive)
raises ValueError naming the argument, its bounds and the value; a non-integer (a
float, a bool, a tensor, whose value would be read from the device) raises TypeError
naming it. Values at the bounds are served exactly (equal to `reference`)."""
import importlib
import types

import numpy as np
import torch

import recipes
from recipes import _common as C
from recipes import tp
from recipes.compat.vllm import mrv2, v1
from tests.helpers import bad, bad_inputs_test

VM = importlib.import_module("recipes.verify_metadata")
INT32_MAX = 2**31 - 1
P, CAP, N = 3, 16, 2
BIG = C.MAX_BLOCK + 1          # one token more than a Triton block holds


def vm_inputs(dev, B=3):
    r2t = (torch.arange(P * CAP, dtype=torch.int32) * 3 - 5).view(P, CAP).to(dev)
    return dict(req_pool_indices=torch.tensor([2, 0, 1][:B], dtype=torch.int64, device=dev),
                seq_lens=torch.tensor([3, 9, 14][:B], dtype=torch.int64, device=dev),
                req_to_token=r2t,
                num_tokens=N)


def vm(dev, B=3, **kw):
    return recipes.verify_metadata(**{**vm_inputs(dev, B), **kw}, layout="both")


def same_metadata(got, want):
    for name, g, w in zip(VM.VerifyMetadata._fields, got, want, strict=True):
        if name == "kv_indices":                     # entries past kv_indptr[B]: unspecified
            n = int(want.kv_indptr[-1])
            g, w = g[:n], w[:n]
        assert g is None and w is None or torch.equal(g.cpu(), w.cpu()), name


def vm_error(arg, value, exc, match, B=2):
    kw = {"num_tokens": value} if arg == "num_tokens" else {arg: value}
    return bad(f"{arg}={value!r} B={B}", lambda d: vm(d, B, **kw), exc, f"^{arg}: {match}")


VM_BAD = [
    *[vm_error("max_pages", v, ValueError, rf"expected an int in \[0, 2147483647\].*got {v}", B)
      for v in (2**31, 2**40, 2**64) for B in (0, 2)],
    vm_error("max_pages", -1, ValueError, r"expected an int in \[0, .*got -1"),
    vm_error("max_pages", 4.0, TypeError, "expected an int or None, got float"),
    vm_error("max_pages", True, TypeError, "expected an int or None, got bool"),
    vm_error("max_pages", torch.tensor(4), TypeError, "expected an int or None, got Tensor"),
    *[vm_error("num_tokens", v, ValueError, rf"expected an int in \[1, {C.MAX_BLOCK}\] \(a "
                                            rf"request's verify tokens are one Triton "
                                            rf"block\), got {v}", B)
      for v in (BIG, 2**40) for B in (0, 2)],
    vm_error("num_tokens", 0, ValueError, r"expected an int in \[1, .*got 0"),
    vm_error("num_tokens", -3, ValueError, r"expected an int in \[1, .*got -3"),
    vm_error("num_tokens", 2.0, TypeError, "expected an int, got float"),
    vm_error("num_tokens", False, TypeError, "expected an int, got bool"),
    *[vm_error("page_size", v, ValueError, rf"expected an int in \[1, {2**31 - CAP}\] "
                                           r"\(max\(C, num_tokens\) \+ page_size <= 2\^31 "
                                           rf"with C=16: int32 page arithmetic\), got {v}")
      for v in (2**31 - CAP + 1, INT32_MAX, 2**40)],
    vm_error("page_size", 0, ValueError, "expected an int >= 1, got 0"),
    vm_error("page_size", -64, ValueError, "expected an int >= 1, got -64"),
    vm_error("page_size", 16.0, TypeError, "expected an int, got float"),
    vm_error("page_size", True, TypeError, "expected an int, got bool"),
    vm_error("window", 0, ValueError, "expected an int >= 1, got 0"),
    vm_error("window", -1, ValueError, "expected an int >= 1, got -1"),
    vm_error("window", 1.5, TypeError, "expected an int or None, got float"),
    vm_error("window", True, TypeError, "expected an int or None, got bool"),
]
test_verify_metadata_sizes = bad_inputs_test(VM_BAD)


def test_verify_metadata_bounds_are_served(device):
    ref = VM.reference
    # the largest page size: a request's tokens plus a page stay within int32
    for kw in ({"page_size": 2**31 - CAP}, {"page_size": 2**31 - CAP, "window": 3},
               {"page_size": 2**30, "max_pages": 0}):
        same_metadata(vm(device, **kw), ref(**vm_inputs(device), **kw, layout="both"))
    # a window past C + N keeps everything: as large a window as C + N
    same_metadata(vm(device, window=2**70), vm(device, window=CAP + N))
    # NumPy integers are integers
    same_metadata(vm(device, page_size=np.int64(4), window=np.int32(7), max_pages=np.int64(5),
                     num_tokens=np.int64(N)),
                  ref(**vm_inputs(device), page_size=4, window=7, max_pages=5, layout="both"))
    # B = 0 with the widest page table the int32 offsets allow
    got = vm(device, 0, max_pages=INT32_MAX)
    assert got.page_table.shape == (0, INT32_MAX) and got.max_seqlen_k.tolist() == [0]


def _drafts(dev, K, B=1):
    return torch.zeros(B, K, dtype=torch.int64, device=dev)


def _logits(dev, rows):
    return torch.zeros(rows, 1, device=dev)


def _v1(dev, max_spec_len):
    meta = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                                 top_k=None, top_p=None, generators={})
    return v1.rejection_sample(_drafts(dev, 1)[0], [1], max_spec_len,
                               torch.ones(1, dtype=torch.int64, device=dev), None,
                               _logits(dev, 1), torch.zeros(1, 1, dtype=torch.int32, device=dev),
                               meta)


def _mrv2(dev, K):
    z = torch.zeros(2, dtype=torch.int64, device=dev)
    return mrv2.rejection_sample(_logits(dev, 2), None, z, torch.tensor([0, 2], device=dev), z,
                                 z[:1], z, z, torch.zeros(1, device=dev), z[:1], K)


KP1 = rf"expected K \+ 1 <= {C.MAX_BLOCK} tokens a request"
BLOCK = rf"expected an int in \[0, {C.MAX_BLOCK - 1}\]"
OTHER_BAD = [
    bad("chain_verify K", lambda d: recipes.chain_verify(_logits(d, BIG), _drafts(d, BIG - 1)),
        ValueError, rf"^draft_tokens: {KP1}.*got shape \(1, {BIG - 1}\)"),
    bad("chain_verify K 3-D", lambda d: recipes.chain_verify(
        _logits(d, BIG).view(1, BIG, 1), _drafts(d, BIG - 1)), ValueError,
        f"^draft_tokens: {KP1}"),
    bad("tp.chain_verify K", lambda d: tp.chain_verify(
        _logits(d, BIG), _drafts(d, BIG - 1), vocab_start=0, vocab_size=1), ValueError,
        f"^draft_tokens: {KP1}"),
    bad("tp.finish_verify K", lambda d: tp.finish_verify(
        torch.zeros(BIG, dtype=torch.int64, device=d), _drafts(d, BIG - 1)), ValueError,
        f"^draft_tokens: {KP1}"),
    bad("tp vocab_size tensor", lambda d: tp.argmax(_logits(d, 2), vocab_start=0,
                                                    vocab_size=torch.tensor(1)),
        TypeError, "^vocab_size: expected an int, got Tensor"),
    bad("vllm v1 max_spec_len", lambda d: _v1(d, C.MAX_BLOCK), ValueError,
        rf"^max_spec_len: {BLOCK} \(a request's max_spec_len \+ 1 tokens are one Triton "
        rf"block\), got {C.MAX_BLOCK}"),
    bad("vllm v1 max_spec_len -1", lambda d: _v1(d, -1), ValueError,
        rf"^max_spec_len: {BLOCK}.*got -1"),
    bad("vllm v1 max_spec_len bool", lambda d: _v1(d, True), TypeError,
        "^max_spec_len: expected an int, got bool"),
    bad("vllm mrv2 steps", lambda d: _mrv2(d, 2**40), ValueError,
        rf"^num_speculative_steps: {BLOCK} \(a request's K \+ 1 tokens are one Triton "
        r"block\), got 1099511627776"),
    bad("vllm mrv2 steps float", lambda d: _mrv2(d, 1.0), TypeError,
        "^num_speculative_steps: expected an int, got float"),
    bad("draft_tail column huge", lambda d: recipes.draft_tail(
        _logits(d, 2), draft_tokens=_drafts(d, 3, 2), column=2**70), ValueError,
        r"^column: expected an index in \[-3, 3\) .*got 1180591620717411303424"),
    bad("draft_tail column -K-1", lambda d: recipes.draft_tail(
        _logits(d, 2), draft_tokens=_drafts(d, 3, 2), column=-4), ValueError,
        r"^column: expected an index in \[-3, 3\)"),
    bad("draft_tail column bool", lambda d: recipes.draft_tail(
        _logits(d, 2), draft_tokens=_drafts(d, 3, 2), column=True), TypeError,
        "^column: expected a Python int, got bool"),
    bad("relay no fields", lambda d: recipes.relay_gather(_drafts(d, 2)[0], []), ValueError,
        "^fields: expected 1 to 8 .*got 0"),
    bad("relay 9 fields", lambda d: recipes.relay_scatter(
        _drafts(d, 2)[0], [(_drafts(d, 1, 2), _drafts(d, 1, 4)) for _ in range(9)]),
        ValueError, "^fields: expected 1 to 8 .*got 9"),
    bad("copy_inputs 17 pairs", lambda d: recipes.copy_inputs(
        src=[_drafts(d, 1)] * 17, dst=[_drafts(d, 1) for _ in range(17)]), ValueError,
        "^src, dst: expected 1 to 16 pairs, got 17"),
]
test_other_sizes = bad_inputs_test(OTHER_BAD)


def test_numpy_sizes_in_adapters(device):
    """A NumPy integer is an integer: vLLM's max_spec_len and num_speculative_steps as
    np.int64 give what the Python ints give."""
    meta = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                                 top_k=None, top_p=None, generators={})
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(2)).to(device)
    args = [torch.tensor([1, 2, 3], device=device), [2, 1], 2,
            torch.tensor([2, 3], device=device), None, x,
            torch.tensor([[5], [6]], dtype=torch.int32, device=device), meta]
    want = v1.rejection_sample(*args)
    args[2] = np.int64(2)
    assert torch.equal(v1.rejection_sample(*args), want)
    z = torch.zeros(3, dtype=torch.int64, device=device)
    m2 = [torch.randn(3, 20, generator=torch.Generator().manual_seed(3)).to(device), None, z,
          torch.tensor([0, 3], device=device), z, z[:1], z, z, torch.zeros(1, device=device),
          z[:1]]
    got, want = mrv2.rejection_sample(*m2, np.int64(2)), mrv2.rejection_sample(*m2, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
