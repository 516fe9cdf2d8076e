"""draft_tail: bitwise parity with the torch reference on the hard inputs, every config.

Every call here poisons what the kernel must write (out= tensors, the draft_tokens
column) and compares all outputs and in-place updates against `reference` run on clones.
Float outputs that may hold NaN or -0.0 (the hidden rows) are compared as raw bits.
"""
import importlib

import pytest
import torch

import recipes
from recipes import _common as C
from tests.helpers import ON_GPU, assert_equal, hard_logits, sample_configs

M = importlib.import_module("recipes.draft_tail")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SMALL = {"BLOCK_V": 512, "SPLIT": 4, "UNROLL": 1, "BLOCK_H": 2048, "num_warps": 4,
         "num_stages": 1, "FUSE_H": 0}
CONFIGS = (None, SMALL, {**SMALL, "SPLIT": 1, "UNROLL": 2},
           {**SMALL, "BLOCK_V": 1024, "SPLIT": 128, "BLOCK_H": 4096, "num_warps": 8},
           {**SMALL, "FUSE_H": 1}, {**SMALL, "SPLIT": 1, "UNROLL": 2, "FUSE_H": 1},
           {**SMALL, "BLOCK_V": 256, "SPLIT": 8, "num_warps": 1, "FUSE_H": 1})
POISON_TOKEN = -7


def hard_hidden(R, H, dtype, device, seed=0):
    """Hidden rows with NaN, -0.0 and inf planted, so the copy must be a bit move."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(R, H, generator=g).to(dtype)
    if H >= 3:
        h[:, 0] = -0.0
        h[::2, H // 2] = float("nan")
        h[1::2, H - 1] = float("-inf")
    return h.to(device)


def a_map(V, dtype, device, seed=0):
    """A non-monotone absolute map (EAGLE-3 style: d2t + arange), values up to ~V + 5000."""
    g = torch.Generator().manual_seed(seed)
    d2t = torch.randint(0, 5000, (V,), generator=g)
    m = (d2t + torch.arange(V)).flip(0).to(dtype)
    return m.to(device)


def run_and_check(x, *, rows=None, hidden=None, token_map=None, positions=True,
                  draft_tokens=None, column=None, config=None, use_out=True, what=""):
    """Call draft_tail with poisoned outputs and compare everything with the reference
    (`column` is passed only when given: alone, without draft_tokens, it is an error)."""
    dev = x.device
    B = x.shape[0] if rows is None else rows.shape[0]
    pos = None
    if positions is True:
        pos = torch.arange(100, 100 + B, dtype=torch.int64, device=dev) * 3
    elif positions is not None:
        pos = positions
    dt_ref = None if draft_tokens is None else draft_tokens.clone()
    pos_ref = None if pos is None else pos.clone()
    want = M.reference(x, rows, hidden, token_map, pos_ref, dt_ref,
                       0 if column is None else column)
    out = None
    if use_out:
        out = recipes.DraftTail(
            torch.full((B,), POISON_TOKEN, dtype=torch.int64, device=dev),
            torch.full((B,), float("nan"), dtype=torch.float32, device=dev),
            None if hidden is None else torch.full((B, hidden.shape[1]), 7, device=dev,
                                                   dtype=hidden.dtype))
    kw = {} if column is None else {"column": column}
    got = recipes.draft_tail(x, rows=rows, hidden=hidden, token_map=token_map, positions=pos,
                             draft_tokens=draft_tokens, out=out, config=config, **kw)
    assert isinstance(got, recipes.DraftTail)
    if out is not None:
        for o, g in zip(out, got, strict=True):
            assert o is g, f"{what}: out= tensor not returned"
    assert_equal(got.tokens, want.tokens, f"{what} tokens")
    assert_equal(got.probs, want.probs, f"{what} probs")
    if hidden is None:
        assert got.hidden is None
    else:
        assert_equal(got.hidden, want.hidden, f"{what} hidden")
    if pos is not None:
        assert_equal(pos, pos_ref, f"{what} positions")
    if draft_tokens is not None:
        assert_equal(draft_tokens, dt_ref, f"{what} draft_tokens")
    return got


# --- the hard inputs --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 7, 512, 1000, 4099])
def test_hard_inputs(device, dtype, V):
    R = 9
    x = hard_logits(R, V, dtype, device, seed=V)
    # repeated, out of order, odd B, out of range (clamped: -1 -> 0, 9 and 100 -> 8)
    rows = torch.tensor([8, 3, 3, 0, 5, 7, 2, 1, 6, 4, -1, 100, 9], device=device)
    B = rows.shape[0]
    hidden = hard_hidden(R, 300, dtype, device, seed=V)
    tmap = a_map(V, torch.int32 if V % 2 else torch.int64, device, seed=V)
    extra = ({**SMALL, "SPLIT": 2, "UNROLL": 2, "BLOCK_H": 4096},) if V > 4096 else ()
    for cfg in CONFIGS + extra:
        dt = torch.full((B, 3), -5, dtype=torch.int64, device=device)
        run_and_check(x, rows=rows, hidden=hidden, token_map=tmap, draft_tokens=dt,
                      column=2, config=cfg, what=f"V={V} cfg={cfg}")


@pytest.mark.parametrize("B", [1, 2, 5])
def test_every_row_default(device, B):
    x = hard_logits(B, 3001, torch.bfloat16, device, seed=B)
    for cfg in (None, SMALL, {**SMALL, "SPLIT": 1}):
        run_and_check(x, config=cfg, what=f"B={B} cfg={cfg}")            # bare call
        run_and_check(x, hidden=hard_hidden(B, 64, torch.bfloat16, device), config=cfg,
                      draft_tokens=torch.zeros(B, 1, dtype=torch.int64, device=device),
                      what=f"B={B} cfg={cfg} hidden")


def test_rows_out_of_range_are_clamped(device):
    x = hard_logits(4, 600, torch.float32, device, seed=2)
    h = hard_hidden(4, 33, torch.float32, device)
    for dt in (torch.int64, torch.int32):
        big = 2**40 if dt == torch.int64 else 2**31 - 1
        rows = torch.tensor([-1, 4, big, -big, 3, 0], dtype=dt, device=device)
        for cfg in (SMALL, {**SMALL, "SPLIT": 1}):
            got = run_and_check(x, rows=rows, hidden=h, config=cfg, what=f"{dt} {cfg}")
            t = torch.argmax(x, dim=1)
            assert got.tokens.tolist() == [t[0], t[3], t[3], t[0], t[3], t[0]]


def test_token_maps(device):
    V = 2500
    x = hard_logits(6, V, torch.bfloat16, device, seed=4)
    rows = torch.tensor([5, 4, 3, 2, 1, 0], device=device)
    base = a_map(2 * V, torch.int64, device, seed=1)
    maps = {"int32": a_map(V, torch.int32, device, seed=3), "int64": a_map(V, torch.int64, device),
            "strided": base[::2], "negative/huge": torch.full((V,), 2**40, device=device)
            - a_map(V, torch.int64, device) * 2**35}
    for name, m in maps.items():
        for cfg in (SMALL, {**SMALL, "SPLIT": 1}):
            got = run_and_check(x, rows=rows, token_map=m, config=cfg, what=name)
            t = M.reference(x, rows).tokens
            assert_equal(got.tokens, m[t].to(torch.int64), f"{name} vs map[argmax]")


def test_strided_logits_rows(device):
    base = hard_logits(8, 3000, torch.bfloat16, device, seed=5)
    x = base[:, 100:2100]                    # row stride 3000, V 2000
    assert x.stride() == (3000, 1)
    h = hard_hidden(8, 96, torch.bfloat16, device)
    rows = torch.tensor([7, 0, 7, 3], device=device)
    for cfg in (None, SMALL, {**SMALL, "SPLIT": 1}):
        run_and_check(x, rows=rows, hidden=h, config=cfg, what=f"sliced {cfg}")
    y = base[::2, :]                         # every other row, row stride 6000
    run_and_check(y, rows=torch.tensor([3, 1], device=device), hidden=h[::2], config=SMALL,
                  what="row-sliced")


def test_strided_draft_tokens_positions_and_column(device):
    x = hard_logits(5, 1500, torch.float16, device, seed=6)
    rows = torch.tensor([4, 1, 1], device=device)
    for column in (0, 1, 3, -1, -4):
        for layout in ("contiguous", "transposed", "every-other"):
            if layout == "contiguous":
                dt = torch.full((3, 4), -5, dtype=torch.int64, device=device)
            elif layout == "transposed":
                dt = torch.full((4, 3), -5, dtype=torch.int64, device=device).t()
            else:
                dt = torch.full((6, 8), -5, dtype=torch.int64, device=device)[::2, ::2]
            backing = torch.full((9,), 11, dtype=torch.int64, device=device)
            pos = backing[::3]                                    # strided positions
            run_and_check(x, rows=rows, positions=pos, draft_tokens=dt, column=column,
                          config=SMALL, what=f"{layout} column={column}")
            assert backing.tolist() == [12, 11, 11] * 3           # only [::3] touched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hidden_real_size(device, dtype):
    """H = 7168 (DeepSeek-V3), hidden rows strided, logits in another dtype."""
    R, H = 6, 7168
    x = hard_logits(R, 3000, torch.bfloat16, device, seed=7)
    hbase = hard_hidden(R, H + 64, dtype, device, seed=1)
    h = hbase[:, 32:32 + H]
    rows = torch.tensor([5, 0, 2, 2, 1], device=device)
    for cfg in (None, SMALL, {**SMALL, "num_warps": 2},
                {**SMALL, "BLOCK_H": 2048, "SPLIT": 8},
                {**SMALL, "BLOCK_H": 4096, "num_warps": 8, "BLOCK_V": 1024},
                {**SMALL, "BLOCK_H": 8192, "num_warps": 16, "BLOCK_V": 2048, "SPLIT": 1}):
        run_and_check(x, rows=rows, hidden=h, token_map=a_map(3000, torch.int32, device),
                      draft_tokens=torch.zeros(5, 2, dtype=torch.int64, device=device),
                      column=1, config=cfg, what=f"{dtype} {cfg}")


def test_real_vocab_151936(device):
    V = 151936
    x = hard_logits(9, V, torch.bfloat16, device, seed=1)
    rows = torch.tensor([8, 2, 5, 0, 3], device=device)
    h = hard_hidden(9, 4096, torch.bfloat16, device)
    m = a_map(V, torch.int64, device)
    for cfg in (None, {**SMALL, "BLOCK_V": 4096, "SPLIT": 1, "UNROLL": 2, "num_warps": 8}):
        run_and_check(x, rows=rows, hidden=h, token_map=m,
                      draft_tokens=torch.zeros(5, 3, dtype=torch.int64, device=device),
                      column=1, config=cfg, what=f"151936 {cfg}")


# --- shapes, out=, workspace --------------------------------------------------------
def test_empty_batches(device):
    x = hard_logits(3, 100, torch.float32, device)
    h = hard_hidden(3, 16, torch.float32, device)
    rows = torch.zeros(0, dtype=torch.int64, device=device)
    pos = torch.zeros(0, dtype=torch.int64, device=device)
    dt = torch.zeros(0, 2, dtype=torch.int64, device=device)
    got = recipes.draft_tail(x, rows=rows, hidden=h, positions=pos, draft_tokens=dt, column=1)
    assert got.tokens.shape == (0,) and got.tokens.dtype == torch.int64
    assert got.probs.shape == (0,) and got.probs.dtype == torch.float32
    assert got.hidden.shape == (0, 16) and got.hidden.dtype == torch.float32
    want = M.reference(x, rows, h)
    assert want.tokens.shape == (0,) and want.hidden.shape == (0, 16)
    empty = torch.empty(0, 100, device=device)                # R = 0, rows default
    got = recipes.draft_tail(empty, hidden=torch.empty(0, 8, device=device))
    assert got.tokens.shape == (0,) and got.hidden.shape == (0, 8)
    assert recipes.draft_tail(empty, rows=rows).tokens.shape == (0,)
    assert M.reference(empty, rows).tokens.shape == (0,)


def test_out_partial_and_hidden_width_zero(device):
    x = hard_logits(3, 900, torch.bfloat16, device)
    h = hard_hidden(3, 40, torch.bfloat16, device)
    tok = torch.full((3,), POISON_TOKEN, dtype=torch.int64, device=device)
    got = recipes.draft_tail(x, hidden=h, out=(tok, None, None), config=SMALL)
    assert got.tokens is tok
    want = M.reference(x, None, h)
    assert_equal(got.tokens, want.tokens, "tokens")
    assert_equal(got.probs, want.probs, "probs")
    assert_equal(got.hidden, want.hidden, "hidden")
    run_and_check(x, hidden=h[:, :0], config=SMALL, what="H=0")


def test_repeated_calls_leave_workspace_at_rest(device):
    for seed, B in enumerate((3, 1, 7, 2)):
        x = hard_logits(8, 5000, torch.float32, device, seed=seed)
        rows = torch.randint(0, 8, (B,), generator=torch.Generator().manual_seed(seed))
        run_and_check(x, rows=rows.to(device), config={**SMALL, "SPLIT": 8},
                      what=f"call {seed}")
        acc, cnt = C.WORKSPACE.get(device, 1, 1)
        assert bool((acc == C.INT64_MIN).all()) and bool((cnt == 0).all()), "workspace"
    # argmax shares the workspace
    y = hard_logits(3, 20000, torch.float32, device, seed=9)
    assert_equal(recipes.argmax(y, config={"SPLIT": 4}), torch.argmax(y, dim=1), "argmax")


@pytest.mark.parametrize("fuse", [0, 1])
def test_spin_and_counter_finishers(device, monkeypatch, fuse):
    """The two ways a split row's chunks meet give the same bits: the spin finisher (the
    whole grid fits one program an SM) and the arrival counter (it does not). The SM
    count is patched so that each runs on the same inputs, with ties and NaN across
    chunks; the spin slots are back at rest afterwards."""
    x = hard_logits(9, 4099, torch.bfloat16, device, seed=5)
    x[4, 100] = x[4, 3000] = 1e4                      # a tie across chunks
    h = hard_hidden(9, 700, torch.bfloat16, device)
    m = a_map(4099, torch.int64, device)
    for B in (1, 2, 3):
        rows = torch.tensor([4, 3, 2][:B], device=device)
        for sms in (1, 4096):
            monkeypatch.setattr(C, "sm_count", lambda d, n=sms: n)
            for cfg in ({**SMALL, "FUSE_H": fuse}, {**SMALL, "BLOCK_V": 256, "SPLIT": 16,
                                                    "num_warps": 2, "FUSE_H": fuse}):
                run_and_check(x, rows=rows, hidden=h, token_map=m, config=cfg,
                              draft_tokens=torch.zeros(B, 2, dtype=torch.int64,
                                                       device=device),
                              column=-1, what=f"B={B} sms={sms} {cfg}")
                acc, cnt = C.WORKSPACE.get(device, 1, 1)
                assert bool((acc == C.INT64_MIN).all()) and bool((cnt == 0).all())


def test_every_config(device):
    # ~90 configs (all compiled on the GPU); more BLOCK_H choices: test_hidden_real_size
    key = {"dtype": "bfloat16", "V": 5000, "B": 3, "H": 3000}
    configs = M.TUNING.configs(key)
    assert len(configs) >= 80
    assert {c["UNROLL"] for c in configs} == {1, 2}
    assert len({c["BLOCK_H"] for c in configs}) == 2
    x = hard_logits(5, 5000, torch.bfloat16, device, seed=3)
    rows = torch.tensor([4, 0, 4], device=device)
    h = hard_hidden(5, 3000, torch.bfloat16, device)
    m = a_map(5000, torch.int32, device)
    assert {c["FUSE_H"] for c in configs} == {0, 1}
    assert {c["num_warps"] for c in configs} == set(M.SPACE["num_warps"])
    for cfg in sample_configs(configs, 10):
        run_and_check(x, rows=rows, hidden=h, token_map=m,
                      draft_tokens=torch.zeros(3, 2, dtype=torch.int64, device=device),
                      column=1, config=cfg, what=f"cfg={cfg}")
    # keys without hidden admit a single BLOCK_H
    assert {c["BLOCK_H"] for c in M.TUNING.configs({**key, "H": 0})} == {M.SPACE["BLOCK_H"][0]}


def test_heuristic(device, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(C, "sm_count", lambda d: 132)                 # as on an H200
        for dt in (torch.bfloat16, torch.float32):
            for B in (1, 3, 8, 64, 256, 1024):
                for V in (1, 7, 32000, 128256, 151936):
                    for H in (0, 7, 4096, 7168):
                        key = M.tune_key(dt, V, B, H)
                        cfg = M.heuristic(key, device)
                        assert set(cfg) == set(M.SPACE)
                        assert all(cfg[k] in M.SPACE[k] for k in cfg), (key, cfg)
                        assert M.constraint(cfg, key), (key, cfg)
        small = M.heuristic(M.tune_key(torch.bfloat16, 32000, 1, 4096), device)
        assert small["SPLIT"] > 1                                 # many chunks at B = 1
        even = M.heuristic(M.tune_key(torch.bfloat16, 151936, 256, 4096), device)
        assert (even["SPLIT"], even["FUSE_H"]) == (1, 1)          # a program a row, fused
        uneven = M.heuristic(M.tune_key(torch.bfloat16, 151936, 320, 4096), device)
        assert (uneven["SPLIT"], uneven["num_warps"]) == (4, 4)   # ~8 small programs an SM


# --- GPU only --------------------------------------------------------------------------
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture(device):
    B, R, V, H = 8, 16, 32000, 4096
    x = hard_logits(R, V, torch.bfloat16, device, seed=11)
    rows = torch.tensor([15, 3, 3, 0, 9, 8, 1, 14], device=device)
    h = hard_hidden(R, H, torch.bfloat16, device)
    m = a_map(V, torch.int64, device)
    pos = torch.zeros(B, dtype=torch.int64, device=device)
    dt = torch.full((B, 4), -1, dtype=torch.int64, device=device)
    want = M.reference(x, rows, h, m)
    out = recipes.DraftTail(torch.empty_like(want.tokens), torch.empty_like(want.probs),
                            torch.empty_like(want.hidden))
    for cfg in (None, {**SMALL, "SPLIT": 1}):
        def call(cfg=cfg):
            recipes.draft_tail(x, rows=rows, hidden=h, token_map=m, positions=pos,
                               draft_tokens=dt, column=2, out=out, config=cfg)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()                                       # compile + workspace warm-up
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call()
        pos.zero_()
        out.tokens.fill_(POISON_TOKEN)
        out.hidden.fill_(0)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        assert_equal(out.tokens, want.tokens, f"graph tokens {cfg}")
        assert_equal(out.hidden, want.hidden, f"graph hidden {cfg}")
        assert_equal(pos, torch.full((B,), 3, dtype=torch.int64, device=device), "positions")
        assert_equal(dt[:, 2], want.tokens, "column")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("pdl", ["on", "off"])
def test_dependent_launches_in_a_graph(device, pdl):
    """Back-to-back calls where each reads what the one before wrote (its rows are the
    previous call's tokens, its positions the previous call's increments), captured in a
    graph with a torch kernel in the chain: with programmatic dependent launch on
    (`pdl_on`, sm_90+), a call that started early must still see every write of the
    call before, whether the call before released it early (small grids) or late."""
    R, V, H, B, n = 16, 32000, 4096, 4, 6
    x = hard_logits(R, V, torch.bfloat16, device, seed=12)
    h = hard_hidden(R, H, torch.bfloat16, device)
    rows0 = torch.tensor([15, 3, 0, 9], device=device)
    for cfg in (None, {**SMALL, "SPLIT": 1}, {**SMALL, "BLOCK_V": 512, "SPLIT": 64,
                                             "num_warps": 2, "FUSE_H": 1},
                {**SMALL, "BLOCK_V": 2048, "SPLIT": 1, "num_warps": 16, "FUSE_H": 1},
                # 4 x 63 = 252 programs, more than one an SM (H200: 132): the late release
                {**SMALL, "BLOCK_V": 256, "SPLIT": 64, "num_warps": 1}):
        pos = torch.zeros(B, dtype=torch.int64, device=device)
        outs = [recipes.DraftTail(torch.empty(B, dtype=torch.int64, device=device),
                                  torch.empty(B, device=device),
                                  torch.empty(B, H, dtype=x.dtype, device=device))
                for _ in range(n)]
        bumped = torch.empty(B, dtype=torch.int64, device=device)

        def chain(cfg=cfg, pos=pos, outs=outs, bumped=bumped):
            rows = rows0
            for i in range(n):
                recipes.draft_tail(x, rows=rows, hidden=h, positions=pos, out=outs[i],
                                   config=cfg)
                if i == 2:                      # a torch kernel in between
                    torch.remainder(outs[i].tokens + 5, R, out=bumped)
                    rows = bumped
                else:
                    rows = outs[i].tokens       # clamped into [0, R)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with recipes.pdl_on() if pdl == "on" else recipes.pdl_off():
            with torch.cuda.stream(s):
                chain()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                chain()
        for o in outs:
            o.tokens.fill_(POISON_TOKEN)
            o.hidden.fill_(0)
        pos.zero_()
        g.replay()
        torch.cuda.synchronize()
        rows = rows0
        for i in range(n):
            want = M.reference(x, rows, h)
            assert_equal(outs[i].tokens, want.tokens, f"{cfg} call {i} tokens")
            assert_equal(outs[i].hidden, want.hidden, f"{cfg} call {i} hidden")
            rows = (want.tokens + 5) % R if i == 2 else want.tokens
        assert_equal(pos, torch.full((B,), n, dtype=torch.int64, device=device), "positions")


@pytest.mark.skipif(not ON_GPU, reason="a tensor over 2^31 elements needs GPU memory")
def test_over_2_pow_31_elements(device):
    R, V = 16385, 131072                   # 2^31 + 2^17 elements, 4 GiB in bf16
    x = torch.randn(R, V, device=device, dtype=torch.bfloat16)
    x[-1, V - 1] = 1e4
    x[-2, 5] = float("nan")
    x[-3, 70000] = 1e4
    x[-3, 130000] = 1e4
    rows = torch.tensor([R - 1, R - 2, R - 3, 0, R - 1, R + 5], device=device)
    for cfg in (None, {**SMALL, "SPLIT": 1}, {**SMALL, "SPLIT": 1, "UNROLL": 2},
                {**SMALL, "BLOCK_V": 4096, "SPLIT": 16, "BLOCK_H": 8192, "num_warps": 8}):
        # the logits themselves as hidden rows: a > 2^31-element gather too
        run_and_check(x, rows=rows, hidden=x, token_map=a_map(V, torch.int32, device),
                      draft_tokens=torch.zeros(6, 2, dtype=torch.int64, device=device),
                      column=1, config=cfg, what=f"2^31 {cfg}")
    del x
    torch.cuda.empty_cache()


def test_pdl_switch(device, monkeypatch):
    """PDL is off by default; SPEC_COOKBOOK_PDL=1 / `pdl_on` turn it on exactly for CUDA
    devices of compute capability 9+ outside the interpreter: released early for grids
    of at most a program an SM, late for larger ones; SPEC_COOKBOOK_PDL=0 / `pdl_off`
    turn it off; the blocks restore the environment; any other value is an error that
    names the variable."""
    monkeypatch.delenv(C.PDL_ENV, raising=False)
    capable = (device.type == "cuda" and not C._INTERPRET_AT_IMPORT
               and torch.cuda.get_device_capability(device)[0] >= 9)
    early, late = (C.PDL_EARLY, C.PDL_LATE) if capable else (0, 0)
    sms = C.sm_count(device)
    assert C.pdl(device) == 0 and C.pdl(device, sms + 1) == 0
    with recipes.pdl_on():
        assert C.pdl(device) == early
        assert C.pdl(device, sms) == early and C.pdl(device, 1) == early
        assert C.pdl(device, sms + 1) == late
        assert C.pdl(torch.device("cpu")) == 0
        with recipes.pdl_off():
            assert C.pdl(device) == 0 and C.pdl(device, sms + 1) == 0
        assert C.pdl(device) == early
    assert C.PDL_ENV not in C.os.environ and C.pdl(device) == 0
    monkeypatch.setenv(C.PDL_ENV, "1")
    assert C.pdl(device, sms + 1) == late
    with recipes.pdl_off():
        assert C.pdl(device) == 0
    assert C.os.environ[C.PDL_ENV] == "1"
    monkeypatch.setenv(C.PDL_ENV, "0")
    assert C.pdl(device) == 0
    monkeypatch.setenv(C.PDL_ENV, "yes please")
    with pytest.raises(ValueError, match="SPEC_COOKBOOK_PDL.*'yes please'"):
        C.pdl_enabled()

