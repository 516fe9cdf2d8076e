"""draft_tail: its errors, each naming the argument or config key, and the configs and
buffer layouts its checks must let through."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import assert_equal, bad, bad_inputs_test, hard_logits
from tests.recipes.test_draft_tail import run_and_check

M = importlib.import_module("recipes.draft_tail")


# --- errors --------------------------------------------------------------------------
def test_errors(device):
    x = torch.randn(4, 10, device=device)
    rows = torch.tensor([0, 1], device=device)
    i64 = dict(dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="logits.*float16/bfloat16/float32.*int64"):
        recipes.draft_tail(x.long())
    with pytest.raises(ValueError, match="logits.*2-D.*got shape \\(10,\\)"):
        recipes.draft_tail(x[0])
    with pytest.raises(ValueError, match="logits.*contiguous"):
        recipes.draft_tail(x.t())
    with pytest.raises(ValueError, match="vocabulary.*got 0"):
        recipes.draft_tail(torch.empty(2, 0, device=device))
    with pytest.raises(TypeError, match="rows.*int32/int64.*float32"):
        recipes.draft_tail(x, rows=rows.float())
    with pytest.raises(ValueError, match="rows.*1-D.*\\(2, 1\\)"):
        recipes.draft_tail(x, rows=rows[:, None])
    with pytest.raises(ValueError, match="logits.*at least one row.*\\(0, 10\\)"):
        recipes.draft_tail(torch.empty(0, 10, device=device), rows=rows)
    with pytest.raises(ValueError, match="hidden.*4 rows.*\\(3, 8\\)"):
        recipes.draft_tail(x, hidden=torch.randn(3, 8, device=device))
    with pytest.raises(TypeError, match="hidden.*float16/bfloat16/float32.*int64"):
        recipes.draft_tail(x, hidden=torch.zeros(4, 8, **i64))
    with pytest.raises(ValueError, match="hidden.*contiguous"):
        recipes.draft_tail(x, hidden=torch.randn(8, 4, device=device).t())
    with pytest.raises(ValueError, match="token_map.*\\(10,\\).*\\(9,\\)"):
        recipes.draft_tail(x, token_map=torch.zeros(9, **i64))
    with pytest.raises(TypeError, match="token_map.*int32/int64.*float32"):
        recipes.draft_tail(x, token_map=torch.zeros(10, device=device))
    with pytest.raises(ValueError, match="positions.*\\(2,\\).*\\(4,\\)"):
        recipes.draft_tail(x, rows=rows, positions=torch.zeros(4, **i64))
    with pytest.raises(TypeError, match="positions.*int64.*int32"):
        recipes.draft_tail(x, positions=torch.zeros(4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="draft_tokens.*\\(2, K\\).*\\(3, 4\\)"):
        recipes.draft_tail(x, rows=rows, draft_tokens=torch.zeros(3, 4, **i64))
    with pytest.raises(ValueError, match="draft_tokens.*2-D.*\\(2,\\)"):
        recipes.draft_tail(x, rows=rows, draft_tokens=torch.zeros(2, **i64))
    with pytest.raises(ValueError, match="column.*\\[-4, 4\\).*\\(2, 4\\).*got 4"):
        recipes.draft_tail(x, rows=rows, draft_tokens=torch.zeros(2, 4, **i64), column=4)
    with pytest.raises(TypeError, match="column.*int.*Tensor"):
        recipes.draft_tail(x, rows=rows, draft_tokens=torch.zeros(2, 4, **i64),
                           column=torch.tensor(1))
    with pytest.raises(TypeError, match="out.*DraftTail.*Tensor"):
        recipes.draft_tail(x, out=torch.zeros(4, **i64))
    with pytest.raises(ValueError, match="out.tokens.*\\(2,\\).*\\(4,\\)"):
        recipes.draft_tail(x, rows=rows, out=(torch.zeros(4, **i64), None, None))
    with pytest.raises(TypeError, match="out.probs.*float32.*float16"):
        recipes.draft_tail(x, out=(None, torch.zeros(4, dtype=torch.float16,
                                                     device=device), None))
    with pytest.raises(ValueError, match="out.hidden.*None when hidden is None"):
        recipes.draft_tail(x, out=(None, None, torch.zeros(4, 8, device=device)))
    with pytest.raises(TypeError, match="out.hidden.*bfloat16.*float32"):
        recipes.draft_tail(x, hidden=torch.zeros(4, 8, dtype=torch.bfloat16, device=device),
                           out=(None, None, torch.zeros(4, 8, device=device)))
    with pytest.raises(ValueError, match="config.*unknown keys.*BLOCK"):
        recipes.draft_tail(x, config={"BLOCK": 3})
    with pytest.raises(ValueError, match="rows: expected a tensor on .*got one on meta"):
        recipes.draft_tail(x, rows=rows.to("meta"))


def _dt(build):
    """A call on logits [4, 10] (every row: B = 4): build(x, i64) -> draft_tail kwargs."""
    def call(dev):
        x = torch.randn(4, 10, device=dev)
        return recipes.draft_tail(x, **build(x, dict(dtype=torch.int64, device=dev)))
    return call


def _col(x, i64):
    """positions and draft_tokens as two columns of one [4, 3] buffer."""
    buf = torch.zeros(4, 3, **i64)
    return {"positions": buf[:, 1], "draft_tokens": buf, "column": 1}


BAD = [
    bad("column alone", _dt(lambda x, i64: {"column": 0}), ValueError,
        "column: expected only with draft_tokens.*got column=0 without draft_tokens"),
    bad("column with positions only",
        _dt(lambda x, i64: {"positions": torch.zeros(4, **i64), "column": 2}), ValueError,
        "column: expected only with draft_tokens.*got column=2"),
    bad("BLOCK_V=3", _dt(lambda x, i64: {"config": {"BLOCK_V": 3}}), ValueError,
        r"config\['BLOCK_V'\]: expected one of \(256, 512, .*16384\).*got 3"),
    bad("SPLIT=256", _dt(lambda x, i64: {"config": {"SPLIT": 256}}), ValueError,
        r"config\['SPLIT'\].*got 256"),
    bad("num_warps=3", _dt(lambda x, i64: {"config": {"num_warps": 3}}), ValueError,
        r"config\['num_warps'\].*\(1, 2, 4, 8, 16\).*got 3"),
    bad("BLOCK_H=512", _dt(lambda x, i64: {"config": {"BLOCK_H": 512}}), ValueError,
        r"config\['BLOCK_H'\].*\(2048, 4096, 8192\).*got 512"),
    bad("FUSE_H=2", _dt(lambda x, i64: {"config": {"FUSE_H": 2}}), ValueError,
        r"config\['FUSE_H'\].*\(0, 1\).*got 2"),
    bad("positions is out.tokens",
        _dt(lambda x, i64: (lambda p: {"positions": p, "out": (p, None, None)})(
            torch.zeros(4, **i64))), ValueError,
        "out.tokens: expected a tensor that shares no memory with positions"),
    bad("positions a column of draft_tokens", _dt(_col), ValueError,
        "draft_tokens: expected a tensor that shares no memory with positions"),
    bad("out.probs over logits", _dt(lambda x, i64: {"out": (None, x[0, :4], None)}),
        ValueError, "out.probs: expected a tensor that shares no memory with logits"),
    bad("out.hidden is hidden",
        _dt(lambda x, i64: (lambda h: {"hidden": h, "out": (None, None, h)})(
            torch.zeros(4, 8, device=x.device))), ValueError,
        "out.hidden: expected a tensor that shares no memory with hidden"),
    bad("draft_tokens over token_map",
        _dt(lambda x, i64: (lambda m: {"token_map": m, "draft_tokens": m[:8].view(4, 2)})(
            torch.zeros(10, **i64))), ValueError,
        "draft_tokens: expected a tensor that shares no memory with token_map"),
    bad("positions is rows",
        _dt(lambda x, i64: (lambda r: {"rows": r, "positions": r})(torch.zeros(4, **i64))),
        ValueError, "positions: expected a tensor that shares no memory with rows"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_pruned_config_and_disjoint_buffers_run(device):
    """The constraint only prunes the tuner's search: an in-space config it rejects
    (sub-1024 tiles on 16 warps at B > 8, SPLIT past the tiles, a fused copy with no
    hidden rows) gives the same bits. positions and the out= tokens in one allocation,
    side by side, do not overlap."""
    B, V = 9, 700
    x = hard_logits(B, V, torch.float32, device, seed=8)
    cfg = {"BLOCK_V": 256, "SPLIT": 128, "UNROLL": 2, "num_warps": 16, "num_stages": 1,
           "BLOCK_H": 8192, "FUSE_H": 1}
    assert not M.constraint(cfg, M.tune_key(x.dtype, V, B, 0))
    run_and_check(x, config=cfg, what="pruned config")
    buf = torch.zeros(2 * B, dtype=torch.int64, device=device)
    pos, tok = buf[:B], buf[B:]
    got = recipes.draft_tail(x, positions=pos, out=(tok, None, None))
    assert got.tokens is tok
    assert_equal(tok, torch.argmax(x, 1), "tokens next to positions")
    assert_equal(pos, torch.ones(B, dtype=torch.int64, device=device), "positions")

