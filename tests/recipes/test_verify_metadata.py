"""verify_metadata: bitwise parity with the reference for every layout, page size,
window, batch size, context length, index dtype, stride and config; out-of-range rules;
out= buffers; errors."""
import importlib

import pytest
import torch

import recipes
from recipes import VerifyMetadata
from tests.helpers import ON_GPU, assert_equal, bad, bad_inputs_test, capture, sample_configs

VM = importlib.import_module("recipes.verify_metadata")

LAYOUTS = ["fa3", "flashinfer", "both"]
POISON = 0x5A5A5A5A
SMALL = {"BLOCK_P": 128, "SPLIT": 4, "BLOCK_B": 32, "num_warps": 2, "num_stages": 1}
CONFIGS = [None, SMALL, {**SMALL, "SPLIT": 1, "num_warps": 1},
           {**SMALL, "BLOCK_P": 1024, "SPLIT": 256, "BLOCK_B": 2048, "num_warps": 8}]


def make(device, B, C, N, *, P=None, seed=0, seqs=None, rpi=None, row_pad=0,
         idx_dtype=torch.int64, seq_dtype=torch.int64, **kw):
    """Inputs with random slot ids, rows at random pool slots; req_to_token rows strided
    when row_pad > 0. seq_lens: `seqs`, else random in [0, C - N] with 0 and C - N
    planted (contexts from empty to full)."""
    g = torch.Generator().manual_seed(seed)
    P = B + 3 if P is None else P
    base = torch.randint(0, 1 << 24, (P, C + row_pad), generator=g, dtype=torch.int32)
    if rpi is None:
        rpi = torch.randperm(P, generator=g)[:B] if B <= P else \
            torch.randint(0, P, (B,), generator=g)
    if seqs is None:
        seqs = torch.randint(0, max(C - N, 0) + 1, (B,), generator=g)
        if B >= 1:
            seqs[0] = C - N
        if B >= 2:
            seqs[1] = 0
    rpi = torch.as_tensor(rpi).to(idx_dtype)
    seqs = torch.as_tensor(seqs).to(seq_dtype)
    return dict(req_pool_indices=rpi.to(device), seq_lens=seqs.to(device),
                req_to_token=base.to(device)[:, :C], num_tokens=N, **kw)


def assert_meta(got, want, what=""):
    assert isinstance(got, VerifyMetadata), type(got)
    for f in VerifyMetadata._fields:
        g, w = getattr(got, f), getattr(want, f)
        if w is None:
            assert g is None, f"{what}: {f} should be None for this layout"
            continue
        assert g is not None, f"{what}: {f} missing"
        if f == "kv_indices":            # entries past kv_indptr[B] are unspecified
            assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: kv_indices"
            n = int(want.kv_indptr[-1])
            g, w = g[:n], w[:n]
        assert_equal(g, w, f"{what}: {f}")


def check(inp, configs=(None,), what=""):
    want = VM.reference(**inp)
    for cfg in configs:
        assert_meta(recipes.verify_metadata(**inp, config=cfg), want, f"{what} cfg={cfg}")
    return want


def poisoned(want):
    return VerifyMetadata(*[None if t is None else torch.full_like(t, POISON) for t in want])


def test_worked_example(device):
    """The contract's formulas by hand: page 4, window 7, N = 2."""
    r2t = (torch.arange(3)[:, None] * 100 + torch.arange(16)).to(torch.int32).to(device)
    inp = dict(req_pool_indices=torch.tensor([2, 0], device=device),
               seq_lens=torch.tensor([9, 3], device=device, dtype=torch.int32),
               req_to_token=r2t, num_tokens=2, page_size=4, window=7, layout="both")
    # b=0: L=9, kv_start=floor(max(0, 11-7)/4)*4=4, seqlens_k=7, 2 pages at cols 4, 8
    # b=1: L=3, kv_start=0, seqlens_k=5, 2 pages at cols 0, 4
    for got in (VM.reference(**inp), recipes.verify_metadata(**inp)):
        assert got.positions.tolist() == [9, 10, 3, 4]
        assert got.out_cache_loc.tolist() == [209, 210, 3, 4]
        assert got.seqlens_k.tolist() == [7, 5]
        assert got.cu_seqlens_q.tolist() == [0, 2, 4]
        assert got.cu_seqlens_k.tolist() == [0, 7, 12]
        assert got.max_seqlen_k.tolist() == [7]
        assert got.page_table.tolist() == [[51, 52, -1, -1], [0, 1, -1, -1]]
        assert got.kv_indptr.tolist() == [0, 2, 4]
        assert got.kv_indices[:4].tolist() == [51, 52, 0, 1]
        assert got.kv_last_page_len.tolist() == [3, 1]
        assert got.positions.dtype == got.out_cache_loc.dtype == torch.int64
        assert all(t.dtype == torch.int32 for t in got[2:])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("window", [None, 37, 200])
def test_layouts_pages_windows(device, layout, page_size, window):
    C, N = 704, 4
    g = torch.Generator().manual_seed(page_size)
    seqs = [C - N, 0, 1, 63, 64 - N, 128 - N + 1, int(torch.randint(0, C - N, (1,),
                                                                       generator=g))]
    inp = make(device, len(seqs), C, N, seed=page_size, seqs=seqs, page_size=page_size,
               window=window, layout=layout, idx_dtype=torch.int32)
    check(inp, CONFIGS, f"{layout} page={page_size} window={window}")


@pytest.mark.parametrize("B", [0, 1, 3, 37])
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int64),
                                    (torch.int32, torch.int64)])
def test_batch_sizes_and_index_dtypes(device, B, dtypes):
    inp = make(device, B, 320, 3, seed=B, idx_dtype=dtypes[0], seq_dtype=dtypes[1],
               page_size=16, layout="both")
    want = check(inp, CONFIGS if dtypes[0] == dtypes[1] and B < 37 else CONFIGS[:2], f"B={B}")
    if B == 0:
        assert want.positions.shape == (0,) and want.page_table.shape == (0, 20)
        assert want.cu_seqlens_k.tolist() == [0] and want.max_seqlen_k.tolist() == [0]
        assert want.kv_indptr.tolist() == [0]


@pytest.mark.parametrize("N", [1, 2, 17])
def test_num_tokens(device, N):
    for layout, window in (("both", None), ("fa3", 50)):
        inp = make(device, 4, 200, N, seed=N, page_size=16, layout=layout, window=window)
        check(inp, CONFIGS[:2], f"N={N} {layout}")


def test_poisoned_out_and_no_allocation(device):
    for layout in LAYOUTS:
        inp = make(device, 5, 300, 4, seed=3, page_size=16, window=90, layout=layout)
        want = VM.reference(**inp)
        out = poisoned(want)
        got = recipes.verify_metadata(**inp, out=out, config=SMALL)
        for f in VerifyMetadata._fields:        # the very buffers come back
            assert getattr(got, f) is getattr(out, f), f
        assert_meta(got, want, f"out= {layout}")
        if want.kv_indices is not None:         # the kernel leaves the tail untouched
            n = int(want.kv_indptr[-1])
            assert (got.kv_indices[n:] == POISON).all()
        # again with new values into the same buffers (the step-graph pattern)
        inp2 = make(device, 5, 300, 4, seed=4, page_size=16, window=90, layout=layout)
        got2 = recipes.verify_metadata(**inp2, out=got)
        assert got2.positions is out.positions
        assert_meta(got2, VM.reference(**inp2), f"out= reuse {layout}")


def test_partial_out(device):
    inp = make(device, 3, 200, 2, seed=5, page_size=16, layout="both")
    want = VM.reference(**inp)
    pt = torch.full_like(want.page_table, POISON)
    got = recipes.verify_metadata(**inp, out=VerifyMetadata(page_table=pt))
    assert got.page_table is pt
    assert_meta(got, want, "partial out")


def test_strided_inputs(device):
    # req_to_token rows with a stride beyond C, and strided 1-D index/length views
    inp = make(device, 4, 500, 4, seed=6, row_pad=37, page_size=16, layout="both",
               window=120)
    assert inp["req_to_token"].stride() == (537, 1)
    check(inp, CONFIGS[:2], "row stride")
    rpi = torch.stack([inp["req_pool_indices"], -inp["req_pool_indices"]], 1)[:, 0]
    seq = torch.stack([inp["seq_lens"], inp["seq_lens"] + 9], 1)[:, 0]
    assert rpi.stride() == (2,) and seq.stride() == (2,)
    check({**inp, "req_pool_indices": rpi, "seq_lens": seq}, CONFIGS[:2], "strided 1-D")
    # a column-major table (column stride P)
    t = inp["req_to_token"].t().contiguous().t()
    assert t.stride(1) != 1
    check({**inp, "req_to_token": t}, CONFIGS[:2], "column-major table")


def test_max_pages_larger_and_smaller(device):
    for ps in (1, 16):
        inp = make(device, 5, 256, 4, seed=7, page_size=ps, layout="both")
        default = -(-256 // ps)
        for mp in (default + 37, 2 * default, default // 3, 1, 0):
            check({**inp, "max_pages": mp}, CONFIGS[:2], f"page={ps} max_pages={mp}")


def test_capacity_not_multiple_of_page(device):
    inp = make(device, 4, 203, 5, seed=8, page_size=16, layout="both")   # 13 pages
    check(inp, CONFIGS, "C=203")
    check({**inp, "window": 50}, CONFIGS[:2], "C=203 window")


def test_out_of_range_values(device):
    """Bad pool slots read -1, seq_lens clamp into [0, C - N], negative slot ids floor."""
    P, C, N = 6, 160, 4
    rpi = [0, -1, P, P + 100, 2**40, -(2**40), 5, 3, 1]
    seqs = [-5, 10, C - N + 1, 2**40, -(2**40), C, C - N, 7, 0]
    for ps in (1, 16):
        for layout in LAYOUTS:
            inp = make(device, len(rpi), C, N, P=P, seed=9, rpi=rpi, seqs=seqs, page_size=ps,
                       layout=layout)
            r2t = inp["req_to_token"]
            r2t[3, :5] = torch.tensor([-1, -16, -17, -(2**31), 2**31 - 1], dtype=torch.int32)
            r2t[1, 100:] = -33
            want = check(inp, CONFIGS[:3], f"out of range page={ps} {layout}")
            assert (want.out_cache_loc.view(-1, N)[1:5] == -1).all()
            assert want.positions.view(-1, N)[0, 0] == 0
            assert want.positions.view(-1, N)[2, 0] == C - N
    # windowed, and max_pages smaller than needed
    inp = make(device, len(rpi), C, N, P=P, seed=9, rpi=rpi, seqs=seqs, page_size=16,
               layout="both", window=40, max_pages=2)
    check(inp, CONFIGS[:3], "out of range window")


def test_tokens_exceed_capacity(device):
    # N > C: every L clamps to 0 and slots at columns >= C read -1
    inp = make(device, 3, 3, 5, seed=10, seqs=[0, 1, 2], page_size=2, layout="both")
    want = check(inp, CONFIGS[:2], "N > C")
    assert want.out_cache_loc.view(3, 5)[:, 3:].eq(-1).all()
    inp = make(device, 2, 0, 2, seed=11, seqs=[0, 0], layout="both")     # C = 0
    check(inp, CONFIGS[:2], "C = 0")
    inp = make(device, 2, 64, 2, P=0, seed=12, rpi=[0, 1], layout="both")   # P = 0
    check(inp, CONFIGS[:2], "P = 0")


@pytest.mark.parametrize("page_size", [64, 1])
def test_real_size_163840(device, page_size):
    C = 163840
    B = 64 if ON_GPU else 2
    inp = make(device, B, C, 4, P=B + 5, seed=13, page_size=page_size, layout="both")
    inp["seq_lens"][-1] = 131071                 # a page boundary inside the row
    check(inp, (None,), f"C=163840 page={page_size}")
    check({**inp, "layout": "fa3", "window": 4096}, (None,), "window 4096")


def test_engine_peer_matches_reference(device):
    for layout in LAYOUTS:
        for ps in (1, 16, 64):
            for window in (None, 100):
                inp = make(device, 6, 640, 4, seed=ps, page_size=ps, window=window,
                           layout=layout)
                assert_meta(VM.engine_torch(**inp), VM.reference(**inp),
                            f"engine {layout} page={ps} window={window}")


def test_every_config(device):
    key = VM.tune_key("both", 16, 5, 48)
    configs = VM.TUNING.configs(key)
    assert len(configs) >= 20
    inp = make(device, 5, 48 * 16, 4, seed=14, page_size=16, layout="both", window=300)
    want = VM.reference(**inp)
    for cfg in sample_configs(configs, 8):
        assert_meta(recipes.verify_metadata(**inp, config=cfg), want, f"cfg={cfg}")


def test_errors(device):
    inp = make(device, 3, 64, 4, seed=15)
    vm = recipes.verify_metadata
    with pytest.raises(TypeError, match="req_pool_indices.*int32/int64.*float32"):
        vm(**{**inp, "req_pool_indices": inp["req_pool_indices"].float()})
    with pytest.raises(TypeError, match="seq_lens.*int32/int64.*int16"):
        vm(**{**inp, "seq_lens": inp["seq_lens"].to(torch.int16)})
    with pytest.raises(ValueError, match="seq_lens.*shape \\(3,\\).*\\(2,\\)"):
        vm(**{**inp, "seq_lens": inp["seq_lens"][:2]})
    with pytest.raises(ValueError, match="seq_lens.*1-D.*\\(3, 1\\)"):
        vm(**{**inp, "seq_lens": inp["seq_lens"][:, None]})
    with pytest.raises(TypeError, match="req_to_token.*int32.*int64"):
        vm(**{**inp, "req_to_token": inp["req_to_token"].long()})
    with pytest.raises(ValueError, match="req_to_token.*2-D"):
        vm(**{**inp, "req_to_token": inp["req_to_token"][0]})
    with pytest.raises(ValueError, match="num_tokens.*in \\[1, 1048576\\].*got 0"):
        vm(**{**inp, "num_tokens": 0})
    with pytest.raises(TypeError, match="num_tokens.*int.*float"):
        vm(**{**inp, "num_tokens": 4.0})
    with pytest.raises(ValueError, match="page_size.*>= 1.*got 0"):
        vm(**inp, page_size=0)
    with pytest.raises(ValueError, match="window.*>= 1.*got 0"):
        vm(**inp, window=0)
    with pytest.raises(ValueError, match="max_pages.*in \\[0, 2147483647\\].*got -1"):
        vm(**inp, max_pages=-1)
    with pytest.raises(ValueError, match="layout.*'fa3'.*got 'fa2'"):
        vm(**inp, layout="fa2")
    with pytest.raises(ValueError, match="config.*unknown keys.*BLOCK"):
        vm(**inp, config={"BLOCK": 3})
    want = VM.reference(**inp, layout="both")
    with pytest.raises(TypeError, match="out.*VerifyMetadata.*tuple"):
        vm(**inp, out=tuple(want))
    with pytest.raises(ValueError, match="out.kv_indptr.*'fa3' does not produce"):
        vm(**inp, out=want)
    with pytest.raises(ValueError, match="out.page_table.*shape \\(3, 64\\).*\\(3, 63\\)"):
        vm(**inp, out=VerifyMetadata(page_table=want.page_table[:, :63].contiguous()))
    with pytest.raises(TypeError, match="out.positions.*int64.*int32"):
        vm(**inp, out=VerifyMetadata(positions=want.positions.int()))
    with pytest.raises(ValueError, match="out.page_table.*contiguous"):
        vm(**inp, out=VerifyMetadata(page_table=torch.empty(
            64, 3, dtype=torch.int32, device=device).t()))
    with pytest.raises(ValueError, match="seq_lens: expected a tensor on .*meta"):
        vm(**{**inp, "seq_lens": inp["seq_lens"].to("meta")})
    if ON_GPU:
        with pytest.raises(ValueError, match="seq_lens.*cuda.*cpu"):
            vm(**{**inp, "seq_lens": inp["seq_lens"].cpu()})


def _vm(build, layout="both"):
    """A call on B=2 requests, C=16, N=2, page_size 1 (page_table [2, 16]: req_to_token's
    row shape): build(inp, want) -> arguments to override or add."""
    def call(dev):
        inp = make(dev, 2, 16, 2, page_size=1)
        want = VM.reference(**inp, layout=layout)
        return recipes.verify_metadata(**{**inp, **build(inp, want)}, layout=layout)
    return call


def _in_out(name, field):
    """Input `name` [2] as the first half of the out= buffer `field` [4]."""
    def build(inp, want):
        buf = torch.zeros(4, dtype=torch.int64, device=inp[name].device)
        buf[:2] = inp[name]
        return {name: buf[:2], "out": VerifyMetadata(**{field: buf})}
    return build


BAD = [
    bad("BLOCK_P=100", _vm(lambda i, w: {"config": {"BLOCK_P": 100}}), ValueError,
        r"config\['BLOCK_P'\]: expected one of \(128, 256, .*4096\).*got 100"),
    bad("SPLIT=512", _vm(lambda i, w: {"config": {"SPLIT": 512}}), ValueError,
        r"config\['SPLIT'\].*256\).*got 512"),
    bad("BLOCK_B=64", _vm(lambda i, w: {"config": {"BLOCK_B": 64}}), ValueError,
        r"config\['BLOCK_B'\].*\(32, 128, 512, 2048\).*got 64"),
    bad("num_warps=16", _vm(lambda i, w: {"config": {"num_warps": 16}}), ValueError,
        r"config\['num_warps'\].*got 16"),
    bad("out.seqlens_k is out.kv_last_page_len",
        _vm(lambda i, w: {"out": VerifyMetadata(seqlens_k=w.seqlens_k,
                                                kv_last_page_len=w.seqlens_k)}),
        ValueError, r"out\.(seqlens_k|kv_last_page_len): expected a tensor that shares no "
        r"memory with out\.(seqlens_k|kv_last_page_len)"),
    bad("out.positions over seq_lens", _vm(_in_out("seq_lens", "positions")), ValueError,
        "out.positions: expected a tensor that shares no memory with seq_lens"),
    bad("out.out_cache_loc over req_pool_indices",
        _vm(_in_out("req_pool_indices", "out_cache_loc")), ValueError,
        "out.out_cache_loc: expected a tensor that shares no memory with req_pool_indices"),
    bad("out.page_table is req_to_token rows",
        _vm(lambda i, w: {"out": VerifyMetadata(page_table=i["req_to_token"][:2])}),
        ValueError, "out.page_table: expected a tensor that shares no memory with "
        "req_to_token"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_pruned_config_runs(device):
    """The constraint only prunes the tuner's search: more than 32 pages a thread, SPLIT
    past the tiles and a BLOCK_B past the batch give the same bits."""
    inp = make(device, 3, 64, 4, page_size=4)
    cfg = {"BLOCK_P": 4096, "SPLIT": 256, "BLOCK_B": 2048, "num_warps": 1, "num_stages": 1}
    assert not VM.constraint(cfg, VM.tune_key("both", 4, 3, 16))
    check({**inp, "layout": "both"}, configs=(cfg,), what="pruned")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture(device):
    B, C, N = 8, 4096, 4
    inp = make(device, B, C, N, seed=16, page_size=16, layout="both", window=1000)
    out = recipes.verify_metadata(**inp)                   # warm up: compile, allocate
    torch.cuda.synchronize()
    graph, allocated = capture(lambda: recipes.verify_metadata(**inp, out=out))
    assert allocated <= 0, f"the capture allocated {allocated} bytes"
    for seed in (17, 18):
        new = make(device, B, C, N, seed=seed, page_size=16, layout="both", window=1000)
        for k in ("req_pool_indices", "seq_lens"):
            inp[k].copy_(new[k])
        inp["req_to_token"].copy_(new["req_to_token"])
        graph.replay()
        torch.cuda.synchronize()
        assert_meta(out, VM.reference(**inp), f"replay {seed}")
