"""The SGLang adapters' errors name SGLang's arguments (`next_token_logits`,
`draft_token_column`, `out.topk_p`, ...), never the recipe arguments they are checked
as (`logits`, `column`, `out.probs`, ...): the shared validators' errors are renamed
at the adapter boundary (`_common.renamed`)."""
import re

import pytest
import torch

from recipes import _common as C
from recipes.compat import sglang

B, K, V = 3, 2, 50
# recipe-side names that an SGLang caller never passed
OURS = re.compile(r"(?<![\w.])(logits|column|hidden|token_map|out\.probs|out\.tokens|"
                  r"out\.hidden)(?!\w)")


def x(dev, rows=B):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, V, generator=g).to(dev)


def i64(dev, *shape):
    return torch.zeros(shape, dtype=torch.int64, device=dev)


def topk1(dev, logits=None, positions=None, draft_tokens="none", column=0, out=None):
    logits = x(dev) if logits is None else logits
    positions = i64(dev, B) if positions is None else positions
    draft_tokens = i64(dev, B, K) if isinstance(draft_tokens, str) else draft_tokens
    return sglang.draft_topk1_postprocess(logits, positions, draft_tokens, column, out=out)


def verify(dev, **over):
    a = dict(next_token_logits=x(dev, B * (K + 1)), candidates=i64(dev, B, K + 1),
             retrieve_index=i64(dev, B, K + 1), retrieve_next_token=i64(dev, B, K + 1),
             seq_lens=i64(dev, B))
    a.update({k: v(dev) for k, v in over.items()})
    return sglang.target_verify_topk1_postprocess(**a)


def extend(dev, **over):
    a = dict(next_token_logits=x(dev, B + 1), row_indices=torch.arange(B, device=dev),
             hidden_states=torch.zeros(B + 1, 8, device=dev))
    a.update({k: v(dev) for k, v in over.items()})
    return sglang.draft_extend_topk1_postprocess(**a)


def _alias_positions(dev):
    p = i64(dev, B)
    return topk1(dev, positions=p, out=(None, p.view(B, 1)))


CASES = {
    "column out of range": (lambda d: topk1(d, column=K), ValueError,
                            r"^draft_token_column: expected an index in \[-2, 2\) for "
                            r"draft_tokens of shape \(3, 2\), got 2"),
    "column not an int": (lambda d: topk1(d, column=1.0), TypeError,
                          "^draft_token_column: expected a Python int, got float"),
    "logits columns strided": (lambda d: topk1(d, logits=torch.zeros(V, B, device=d).t()),
                               ValueError,
                               "^next_token_logits: expected the last dim to be contiguous"),
    "positions in the logits": (
        lambda d: (lambda lg: topk1(d, logits=lg, positions=lg.view(torch.int64)[0, :B]))(
            x(d)), ValueError,
        "^positions: expected a tensor that shares no memory with next_token_logits"),
    "out.topk_p in the logits": (
        lambda d: (lambda lg: topk1(d, logits=lg, out=(lg.view(-1)[:B].view(B, 1), None)))(
            x(d)),
        ValueError, "^out.topk_p: expected a tensor that shares no memory with "
                    "next_token_logits"),
    "out.topk_index is positions": (
        _alias_positions, ValueError,
        "(out.topk_index|positions): expected a tensor that shares no memory with "
        "(positions|out.topk_index)"),
    "draft_tokens rows": (lambda d: topk1(d, draft_tokens=i64(d, B + 1, K)), ValueError,
                          r"^draft_tokens: expected shape \(3, K\)"),
    "positions dtype": (lambda d: topk1(d, positions=i64(d, B).int()), TypeError,
                        "^positions: expected dtype int64, got int32"),
    "verify logits rows": (lambda d: verify(d, next_token_logits=lambda d: x(d, B)),
                           ValueError, r"^next_token_logits: expected \[B\*N, V\]"),
    "verify candidates width": (
        lambda d: verify(d, candidates=lambda d: i64(d, 1, C.MAX_BLOCK + 1),
                         next_token_logits=lambda d: torch.zeros(C.MAX_BLOCK + 1, 1,
                                                                 device=d)),
        ValueError, rf"^candidates: expected K \+ 1 <= {C.MAX_BLOCK} tokens a request"),
    "extend hidden rows": (lambda d: extend(d, hidden_states=lambda d: torch.zeros(2, 8,
                                                                                  device=d)),
                           ValueError, "^hidden_states: expected at least 4 rows"),
    "extend row_indices": (lambda d: extend(d, row_indices=lambda d: torch.zeros(B, 1,
                                                                                device=d)),
                           TypeError, "^row_indices: expected dtype int32/int64"),
}


@pytest.mark.parametrize("call,exc,match", CASES.values(), ids=CASES.keys())
def test_errors_name_sglang_arguments(device, call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call(device)
    assert not OURS.search(str(info.value)), str(info.value)


def test_renamed_replaces_whole_names_only():
    names = {"logits": "next_token_logits", "column": "draft_token_column",
             "out.probs": "out.topk_p"}
    e = C.renamed(ValueError("column: expected logits's rows; next_token_logits, "
                             "out.probs, out.probs_x, my_column, columns"), names)
    assert type(e) is ValueError
    assert str(e) == ("draft_token_column: expected next_token_logits's rows; "
                      "next_token_logits, out.topk_p, out.probs_x, my_column, columns")
    t = C.renamed(TypeError("column: expected a Python int, got float"), names)
    assert type(t) is TypeError and str(t).startswith("draft_token_column: ")


def test_renamed_keeps_other_errors():
    class Custom(ValueError):
        pass

    for e in (RuntimeError("logits: no interpreter"), Custom("logits: x"), ValueError()):
        assert C.renamed(e, {"logits": "next_token_logits"}) is e
