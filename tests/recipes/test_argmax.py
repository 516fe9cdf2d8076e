"""argmax: bitwise parity with torch.argmax on the hard inputs, every config."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import (
    ON_GPU,
    assert_equal,
    bad,
    bad_inputs_test,
    hard_logits,
    int64_alias,
    sample_configs,
)

A = importlib.import_module("recipes.argmax")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "num_stages": 1, "UNROLL": 2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 7, 512, 1000, 4099])
@pytest.mark.parametrize("R", [1, 3, 9])
def test_hard_inputs(device, dtype, V, R):
    x = hard_logits(R, V, dtype, device, seed=V + R)
    want = A.reference(x)
    for cfg in (None, SMALL, {**SMALL, "SPLIT": 1}, {**SMALL, "BLOCK_V": 1024, "SPLIT": 128}):
        assert_equal(recipes.argmax(x, config=cfg), want, f"cfg={cfg}")


def _lane_rows(V, dtype, device):
    """Rows about the scan's lanes (a lane is one 16-byte load of each tile; see
    `chunk_scan`), with the index each must give."""
    rows, want = [], []

    def row(fill=None):
        r = torch.randn(V, generator=torch.Generator().manual_seed(len(rows))) * 0.1
        if fill is not None:
            r.fill_(fill)
        rows.append(r)
        return r

    r = row()
    r[5], r[2] = 3.0, 3.0                           # a tie inside one load
    want.append(2)
    r = row()
    r[1024 + 1], r[7 * 8 + 3] = 3.0, 3.0            # a lower lane's later tile ties a
    want.append(59)                                 # higher lane's earlier tile
    r = row()
    r[9], r[14], r[2000] = 3.0, float("nan"), float("nan")   # the max, then a NaN in
    want.append(14)                                 # the same load: the first NaN
    r = row(-1.0)
    r[18], r[21] = -0.0, 0.0                        # -0.0 then +0.0 in one load
    want.append(18)
    r = row()
    r[V - 1] = 3.0                                  # in the last, partial load
    want.append(V - 1)
    r = row()
    for j in (3077, 2051, 1030, 100 + 1024 * 3):    # one value in many lanes and tiles
        r[j] = 3.0
    want.append(1030)
    r = row(float("-inf"))
    r[3000] = float("nan")                          # -inf everywhere but one NaN
    want.append(3000)
    r = row()
    r[1024], r[1023] = 3.0, 3.0                     # the last element of a tile ties the
    want.append(1023)                               # first of the next
    x = torch.stack(rows).to(dtype).to(device)
    return x, torch.tensor(want, dtype=torch.int64, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lane_max_scan_ties_and_nan(device, dtype):
    """Ties inside a 16-byte load, across lanes and tiles, NaN after the max in one load,
    -0.0 and +0.0 in one load, the partial last load: on lanes of 8, 4 and 2 elements
    (`lane_vec`: 16 bytes, or BLOCK_V / (32 * num_warps) where fewer) and split rows."""
    x, want = _lane_rows(4099, dtype, device)
    assert_equal(A.reference(x), want, "reference")
    for cfg in ({**SMALL, "SPLIT": 1, "UNROLL": 1}, {**SMALL, "num_warps": 8},
                {**SMALL, "BLOCK_V": 2048, "num_warps": 16, "SPLIT": 2},
                {**SMALL, "num_warps": 16, "SPLIT": 2},
                {**SMALL, "BLOCK_V": 8192, "SPLIT": 1, "num_warps": 4}):
        assert_equal(recipes.argmax(x, config=cfg), want, f"cfg={cfg}")


def test_real_vocab_151936(device):
    for dtype in (torch.bfloat16, torch.float32):
        x = hard_logits(9, 151936, dtype, device, seed=1)
        assert_equal(recipes.argmax(x), A.reference(x), str(dtype))


def test_strided_rows_and_views(device):
    base = hard_logits(6, 3000, torch.bfloat16, device)
    x = base[:, 100:2100]                    # row stride 3000, V 2000
    assert x.stride() == (3000, 1)
    assert_equal(recipes.argmax(x, config=SMALL), A.reference(x), "strided")
    y = base[::2, :]                         # every other row
    assert_equal(recipes.argmax(y), A.reference(y), "row-sliced")


def test_empty_batch_and_out(device):
    x = torch.empty(0, 100, device=device)
    assert recipes.argmax(x).shape == (0,)
    x = hard_logits(5, 777, torch.float32, device)
    out = torch.full((5,), -7, dtype=torch.int64, device=device)
    res = recipes.argmax(x, out=out)
    assert res.data_ptr() == out.data_ptr()
    assert_equal(out, A.reference(x), "out=")


def test_repeated_calls_reuse_workspace(device):
    # the stage-2 slots must be back at rest after each call
    for seed in range(4):
        x = hard_logits(3, 5000, torch.float32, device, seed=seed)
        assert_equal(recipes.argmax(x, config={**SMALL, "SPLIT": 8}), A.reference(x), str(seed))


def test_one_chunk_a_row_leaves_the_workspace_alone(device, monkeypatch):
    """With a program a row there is no stage 2: the scratch is neither used nor grown
    (so such a call may be captured at any batch without a warm-up). On a fresh scratch
    any use would allocate, so a small batch shows it."""
    from recipes import _common as C

    monkeypatch.setattr(C, "WORKSPACE", C._Workspace())
    dev = torch.device(device.type, torch.cuda.current_device() if ON_GPU else None)
    key = (dev.type, dev.index)
    assert C.WORKSPACE._bufs.get(key) is None
    R = 67
    x = torch.randn(R, 64, device=dev)
    one = {"BLOCK_V": 1024, "SPLIT": 1, "UNROLL": 1, "num_warps": 4}
    assert_equal(recipes.argmax(x, config=one), torch.argmax(x, 1), "one chunk a row")
    assert C.WORKSPACE._bufs.get(key) is None
    rows = torch.arange(R, device=dev)
    res = recipes.draft_tail(x, rows=rows, config=one)
    assert_equal(res.tokens, torch.argmax(x, 1), "draft_tail, one chunk a row")
    assert C.WORKSPACE._bufs.get(key) is None


def test_outgrown_workspace_buffers_are_kept(device):
    """A grown scratch keeps the buffers it outgrew alive: a graph captured on them
    replays into memory that nothing else can take. Unchanged sizes return the same
    buffers; grown ones come at rest."""
    import gc
    import weakref

    from recipes import _common as C

    ws = C._Workspace()
    dev = torch.device(device.type, torch.cuda.current_device() if ON_GPU else None)
    acc, cnt = ws.get(dev, 10, 10)
    assert ws.get(dev, 1024, 1024) == (acc, cnt)
    old_acc, old_cnt = weakref.ref(acc), weakref.ref(cnt)
    acc2, cnt2 = ws.get(dev, 5000, 3000)
    assert acc2.numel() >= 5000 and cnt2.numel() >= 3000
    assert bool((acc2 == C.INT64_MIN).all()) and bool((cnt2 == 0).all())
    del acc, cnt
    gc.collect()
    assert old_acc() is not None and old_cnt() is not None


@pytest.mark.parametrize("part", range(4))
def test_every_config(device, part):
    key = {"dtype": "bfloat16", "V": 4100, "R": 3}
    x = hard_logits(3, 4100, torch.bfloat16, device, seed=3)
    want = A.reference(x)
    configs = A.TUNING.configs(key)
    assert len(configs) > 50
    for cfg in sample_configs(configs[part::4], 3, seed=part):
        assert_equal(recipes.argmax(x, config=cfg), want, f"cfg={cfg}")


def test_errors(device):
    x = torch.randn(2, 10, device=device)
    with pytest.raises(TypeError, match="logits.*float16/bfloat16/float32.*int64"):
        recipes.argmax(x.long())
    with pytest.raises(ValueError, match="logits.*2-D.*got shape \\(10,\\)"):
        recipes.argmax(x[0])
    with pytest.raises(ValueError, match="logits.*contiguous"):
        recipes.argmax(x.t())
    with pytest.raises(ValueError, match="out.*shape \\(2,\\).*\\(3,\\)"):
        recipes.argmax(x, out=torch.empty(3, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="out.*int64.*int32"):
        recipes.argmax(x, out=torch.empty(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="config.*unknown keys.*BLOCK"):
        recipes.argmax(x, config={"BLOCK": 3})
    with pytest.raises(ValueError, match="vocabulary.*got 0"):
        recipes.argmax(torch.empty(2, 0, device=device))


def _x(dev):
    return torch.randn(4, 50, device=dev)


BAD = [
    bad("BLOCK_V=3", lambda d: recipes.argmax(_x(d), config={"BLOCK_V": 3}), ValueError,
        r"config\['BLOCK_V'\]: expected one of \(1024, 2048, 4096, 8192\).*got 3"),
    bad("SPLIT=0", lambda d: recipes.argmax(_x(d), config={"SPLIT": 0}), ValueError,
        r"config\['SPLIT'\]: expected one of \(1, 2, .*128\).*got 0"),
    bad("num_warps=3", lambda d: recipes.argmax(_x(d), config={"num_warps": 3}), ValueError,
        r"config\['num_warps'\]: expected one of \(4, 8, 16\).*got 3"),
    bad("BLOCK_V float", lambda d: recipes.argmax(_x(d), config={"BLOCK_V": 1024.0}),
        ValueError, r"config\['BLOCK_V'\].*got 1024.0"),
    bad("UNROLL bool", lambda d: recipes.argmax(_x(d), config={"UNROLL": True}), ValueError,
        r"config\['UNROLL'\].*\(1, 2\).*got True"),
    bad("num_stages=2", lambda d: recipes.argmax(_x(d), config={"num_stages": 2}),
        ValueError, r"config\['num_stages'\].*\(1,\).*got 2"),
    bad("config list", lambda d: recipes.argmax(_x(d), config=[("SPLIT", 1)]), TypeError,
        "config: expected a dict.*got list"),
    bad("out aliases logits", lambda d: (lambda x: recipes.argmax(x, out=int64_alias(x, 4)))(
        _x(d)), ValueError, "out: expected a tensor that shares no memory with logits"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_pruned_configs_and_disjoint_views_run(device):
    """The constraint only prunes the tuner's search: an in-space config it rejects
    (BLOCK_V < 4 elements a thread, SPLIT past the tiles) gives the same bits; an out=
    in the same allocation as the logits but past their bytes is no overlap."""
    x = hard_logits(4, 50, torch.float32, device)
    cfg = {"BLOCK_V": 1024, "SPLIT": 128, "num_warps": 16, "UNROLL": 2}
    assert not A.constraint({**SMALL, **cfg}, A.tune_key(x.dtype, 50, 4))
    assert_equal(recipes.argmax(x, config=cfg), torch.argmax(x, 1), "pruned config")
    buf = torch.empty(4 * 50 + 8, device=device)
    y = buf[:200].view(4, 50)
    y.copy_(x)
    out = buf[200:].view(torch.int64)
    assert recipes.argmax(y, out=out) is out
    assert_equal(out, torch.argmax(x, 1), "out= right after the logits")


def test_split_heuristic_keeps_the_sms_evenly_loaded():
    """With a row for every SM: one 16-warp program a row only where that load is even
    (two an SM within 5%, or 12 rows an SM and more); elsewhere programs of 1024-element
    tiles, rows x programs-a-row within a factor sqrt(2) of 8 an SM (16-bit) or 6
    (float32) where the row's tiles and SPLIT >= 1 allow, on 8 warps where that is one
    program a row and the rows fit that many, else on 4. Every config is admitted."""
    from recipes._argmax_core import split_constraint, split_heuristic, split_plan
    from recipes._common import cdiv

    for sms in (78, 132, 144):
        for dtype, per_sm in (("bfloat16", 8), ("float16", 8), ("float32", 6)):
            for V in (1000, 32000, 151936, 262144):
                for rows in list(range(sms, 13 * sms, 7)) + [2 * sms, 40 * sms]:
                    cfg = split_heuristic(dtype, V, rows, sms)
                    where = (sms, dtype, V, rows, cfg)
                    assert split_constraint(cfg, V), where
                    even = 0.95 * 2 * sms <= rows <= 2 * sms or rows >= 12 * sms
                    if even:
                        assert (cfg["SPLIT"], cfg["num_warps"]) == (1, 16), where
                        continue
                    programs = rows * split_plan(V, 1024, cfg["SPLIT"])[0]
                    one_wave = cfg["SPLIT"] == 1 and rows <= per_sm * sms
                    assert (cfg["BLOCK_V"], cfg["num_warps"]) == (1024, 8 if one_wave else 4), \
                        where
                    tiles = cdiv(V, 1024)
                    if cfg["SPLIT"] < tiles:            # not clamped by the row's tiles
                        assert per_sm * sms / 2**0.5 <= programs, where
                    if cfg["SPLIT"] > 1:                # SPLIT = 1 is rows programs
                        assert programs <= per_sm * sms * 2**0.5, where
                    assert cfg["UNROLL"] == (2 if cdiv(tiles, cfg["SPLIT"]) >= 2 else 1), where
    # the measured cases: 768 and 1024 bf16 rows and 640 float32 rows fit one wave of
    # 8-warp programs on 132 SMs; 1280 bf16 rows do not
    for dtype, rows, warps in (("bfloat16", 768, 8), ("bfloat16", 1024, 8),
                               ("float32", 640, 8), ("bfloat16", 1280, 4)):
        cfg = split_heuristic(dtype, 151936, rows, 132)
        assert (cfg["SPLIT"], cfg["num_warps"]) == (1, warps), (dtype, rows, cfg)


@pytest.mark.skipif(not ON_GPU, reason="a tensor over 2^31 elements needs GPU memory")
def test_over_2_pow_31_elements(device):
    R, V = 16385, 131072                   # 2^31 + 2^17 elements, 4 GiB in bf16
    x = torch.randn(R, V, device=device, dtype=torch.bfloat16)
    x[-1, V - 1] = 1e4
    x[-2, 5] = float("nan")
    want = A.reference(x)
    for cfg in (None, {**SMALL, "SPLIT": 1}):
        assert_equal(recipes.argmax(x, config=cfg), want, f"cfg={cfg}")
    del x
    torch.cuda.empty_cache()


@pytest.mark.skipif(not ON_GPU, reason="CUDA graph capture needs a GPU")
def test_workspace_cannot_grow_inside_a_capture(device):
    """Growing the stage-2 scratch inside a capture would put it in the graph's pool: a
    clear error asking for a warm-up; outside the capture the same call grows it."""
    from recipes import _common as C

    dev = torch.device(device.type, torch.cuda.current_device())
    have = C.WORKSPACE._bufs.get((dev.type, dev.index))
    R = 2 * (have[2] if have else 1024)
    x = torch.randn(R, 2048, device=dev).to(torch.bfloat16)
    out = torch.empty(R, dtype=torch.int64, device=dev)
    split = {"BLOCK_V": 1024, "SPLIT": 2, "UNROLL": 1, "num_warps": 4}   # uses the scratch
    recipes.argmax(x[:1], out=out[:1], config=split)      # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warm-up"):
        with torch.cuda.graph(g):
            recipes.argmax(x, out=out, config=split)
    del g
    assert_equal(recipes.argmax(x, out=out, config=split), torch.argmax(x, 1),
                 "after the warm-up")
