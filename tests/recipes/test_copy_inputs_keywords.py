"""copy_inputs is keyword-only: `src=` and `dst=` name the direction, so a swapped pair
(equal shapes, the trap of a positional `(dst, src)` API) cannot overwrite its source
unnoticed; every positional call raises TypeError naming both keywords."""
import importlib

import pytest
import torch

import recipes
from recipes import ops

CI = importlib.import_module("recipes.copy_inputs")
KEYWORDS = r"copy_inputs: expected keyword arguments src=\[\.\.\.\] and dst=\[\.\.\.\]"


def _pair(device):
    tokens = torch.arange(5, dtype=torch.int64, device=device) + 11
    buf = torch.full((5,), -1, dtype=torch.int64, device=device)
    return tokens, buf


@pytest.mark.parametrize("fn", [recipes.copy_inputs, ops.copy_inputs],
                         ids=["recipe", "op"])
@pytest.mark.parametrize("how", ["two tensors", "pair list", "two lists", "one list",
                                 "list and keyword"])
def test_positional_calls_raise_and_write_nothing(device, fn, how):
    tokens, buf = _pair(device)
    args, kw = {"two tensors": ((tokens, buf), {}),
                "pair list": (([(tokens, buf)],), {}),
                "two lists": (([tokens], [buf]), {}),
                "one list": (([buf],), {}),
                "list and keyword": (([tokens],), {"dst": [buf]})}[how]
    with pytest.raises(TypeError, match=KEYWORDS + r".*got \d positional argument"):
        fn(*args, **kw)
    assert tokens.tolist() == [11, 12, 13, 14, 15] and buf.eq(-1).all()


@pytest.mark.parametrize("fn", [recipes.copy_inputs, ops.copy_inputs],
                         ids=["recipe", "op"])
def test_keywords_copy_src_into_dst(device, fn):
    tokens, buf = _pair(device)
    pos = torch.arange(3, dtype=torch.int32, device=device)
    pos_buf = torch.zeros(3, dtype=torch.int32, device=device)
    assert fn(dst=[buf, pos_buf], src=[tokens, pos]) is None      # any keyword order
    assert buf.tolist() == [11, 12, 13, 14, 15] and pos_buf.tolist() == [0, 1, 2]
    assert tokens.tolist() == [11, 12, 13, 14, 15]


def test_reference_is_keyword_only(device):
    tokens, buf = _pair(device)
    with pytest.raises(TypeError):
        CI.reference([tokens], [buf])
    CI.reference(src=[tokens], dst=[buf])
    assert buf.tolist() == tokens.tolist()


def test_missing_side_names_it(device):
    tokens, buf = _pair(device)
    with pytest.raises(TypeError, match="src: expected a list or tuple of 1 to 16 tensors, "
                                        "got NoneType"):
        recipes.copy_inputs(dst=[buf])
    with pytest.raises(TypeError, match="dst: expected a list or tuple of 1 to 16 tensors, "
                                        "got Tensor"):
        recipes.copy_inputs(src=[tokens], dst=buf)
    assert buf.eq(-1).all()
