"""relay: scatter/gather of per-request state, all fields in one launch, bit for bit."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import (
    ON_GPU,
    CountingKernel,
    assert_equal,
    capture,
    sample_configs,
)

R = importlib.import_module("recipes.relay")

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
         torch.float64: torch.int64, torch.bool: torch.uint8}
pytestmark = pytest.mark.filterwarnings(   # the interpreter's float16 overflow to inf
    "ignore:overflow encountered in cast:RuntimeWarning")

SMALL = {"BLOCK": 128, "ROWS": 2, "num_warps": 1, "SINGLE": 0}


# --- inputs ------------------------------------------------------------------------------
def hard_floats(shape, dtype, seed):
    """Random values over a wide exponent range (so float16 overflows and underflows),
    NaNs with payloads and both signs, infinities, signed zeros, subnormals of every
    width, and exact rounding ties for float32 -> bfloat16/float16."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x = (x * torch.exp2(torch.randint(-30, 30, (n,), generator=g).double())).float()
    special = torch.tensor([
        float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
        1e-45, -1e-45, 1e-40, 9.2e-41,                       # float32 / bfloat16 subnormals
        6e-8, 3e-8, -2.98e-8, 1e-5,                          # float16 subnormals, ties to 0
        65504.0, 65519.0, 65520.0, -65520.0, 3.3895e38, 3.4e38,   # float16 max, overflow
        1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-11, 1.0 + 3 * 2**-11,  # ties (even/odd)
        -(1.0 + 2**-8), 2**-126 + 2**-134, 255.5, 1e-38,
    ], dtype=torch.float32)
    nan_payload = torch.tensor([0x7FC12345, -0x003EDCBB, 0x7F800001], dtype=torch.int32)
    special = torch.cat([special, nan_payload.view(torch.float32)])
    k = min(n, special.numel())
    x[:k] = special[:k]
    if n > 64:                                  # a few more specials deep in the rows
        pos = torch.randint(0, n, (16,), generator=g)
        x[pos] = special[torch.randint(0, special.numel(), (16,), generator=g)]
    return x.to(dtype).reshape(shape)


def hard_ints(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2**62, 2**62, shape, generator=g, dtype=torch.int64).flatten()
    special = torch.tensor([-1, 0, 1, 127, 128, 255, 256, -129, 2**31 - 1, 2**31,
                            -2**31 - 1, 2**32 + 1, 2**63 - 1, -2**63], dtype=torch.int64)
    k = min(x.numel(), special.numel())
    x[:k] = special[:k]
    return x.to(dtype).reshape(shape)


def hard(shape, dtype, seed):
    if dtype == torch.bool:
        return hard_ints(shape, torch.int64, seed) % 3 == 0
    if dtype.is_floating_point:
        return hard_floats(shape, dtype, seed)
    return hard_ints(shape, dtype, seed)


def poison(shape, dtype, device):
    """A sentinel that no kernel write produces by accident."""
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    v = -77 if dtype != torch.uint8 else 177
    return torch.full(shape, v, dtype=dtype, device=device)


def slots(B, P, index_dtype, device, seed=0):
    """B slots of a pool of P: distinct valid ones mixed with outside ones (negative,
    >= P, and for int64 values that would wrap to a valid slot in int32)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(P, generator=g)
    bad = [-1, P, 2**32 + 1, 2**40, -(2**63), P + 1, 2**31 - 1, -2**31] \
        if index_dtype == torch.int64 else [-1, P, -2**31, 2**31 - 1, P + 7]
    out = torch.empty(B, dtype=torch.int64)
    for i in range(B):                           # every third row is outside the pool
        out[i] = bad[i % len(bad)] if i % 3 == 1 or i >= P else perm[i]
    return out.to(index_dtype).to(device)


def assert_bits(got, want, what, nan_payload_free=False):
    """Bitwise equality (NaN payloads included). With nan_payload_free (a cast between
    float dtypes), NaN positions must match but the NaN bits may differ: torch's own NaN
    bits for such casts vary by device and tensor length (see recipes/relay.py)."""
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    got, want = got.cpu(), want.cpu()
    if got.dtype in _BITS:
        if nan_payload_free:
            nan = torch.isnan(want)
            assert torch.equal(torch.isnan(got), nan), f"{what}: NaN positions differ"
            got, want = got.masked_fill(nan, 0), want.masked_fill(nan, 0)
        got, want = got.view(_BITS[got.dtype]), want.view(_BITS[want.dtype])
    assert_equal(got, want, what)


def float_cast(src_dtype, dst_dtype):
    return src_dtype != dst_dtype and src_dtype.is_floating_point


def run_both(mode, index, fields, config=None):
    """Our call on the fields, the reference on clones; returns [(got, want, src dtype)]."""
    ref = [(s, d.clone()) for s, d in fields]
    R.reference(index, ref, mode)
    fn = recipes.relay_scatter if mode == "scatter" else recipes.relay_gather
    assert fn(index, fields, config=config) is None
    return [(d, rd, s.dtype) for (s, d), (_, rd) in zip(fields, ref, strict=True)]


def check(mode, index, fields, config=None, what=""):
    for i, (got, want, sdt) in enumerate(run_both(mode, index, fields, config)):
        assert_bits(got, want, f"{what} field {i} {sdt}->{got.dtype} cfg={config}",
                    nan_payload_free=float_cast(sdt, got.dtype))


def make_fields(mode, B, P, specs, device, seed=0):
    """specs: [(src dtype, dst dtype, trailing shape)]; the batch side holds hard values,
    the pool side too for gather; every dst is poisoned."""
    fields = []
    for i, (sdt, ddt, tail) in enumerate(specs):
        rows_src, rows_dst = (B, P) if mode == "scatter" else (P, B)
        src = hard((rows_src,) + tuple(tail), sdt, seed + 31 * i).to(device)
        dst = poison((rows_dst,) + tuple(tail), ddt, device)
        fields.append((src, dst))
    return fields


# --- casts, slots, index dtypes ----------------------------------------------------------
@pytest.mark.parametrize("mode", ["scatter", "gather"])
@pytest.mark.parametrize("src_dtype", FLOATS)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_float_casts(device, mode, src_dtype, index_dtype):
    """float32/bfloat16/float16 to each of them, as [B, 37] rows and as [B] scalars, all
    six fields in one launch; outside slots skipped / zero-filled."""
    B, P = 8, 9
    specs = [(src_dtype, d, (37,)) for d in FLOATS] + [(src_dtype, d, ()) for d in FLOATS]
    fields = make_fields(mode, B, P, specs, device, seed=5)
    check(mode, slots(B, P, index_dtype, device), fields, what=mode)


@pytest.mark.parametrize("mode", ["scatter", "gather"])
@pytest.mark.parametrize("src_dtype", INTS)
def test_int_casts(device, mode, src_dtype):
    """Every integer width to every other (wrap / sign- or zero-extension, as torch)."""
    B, P = 7, 10
    specs = [(src_dtype, d, (5,) if i % 2 else ()) for i, d in enumerate(INTS)]
    fields = make_fields(mode, B, P, specs, device, seed=11)
    check(mode, slots(B, P, torch.int64, device, seed=1), fields, what=mode)


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_same_dtype_copies_are_raw(device, mode):
    """Equal dtypes copy bits: float64, bool, NaN payloads, 8 fields in one launch."""
    B, P = 6, 6
    specs = [(torch.float64, torch.float64, (3,)), (torch.bool, torch.bool, ()),
             (torch.float32, torch.float32, (40,)), (torch.bfloat16, torch.bfloat16, (9,)),
             (torch.float16, torch.float16, ()), (torch.int64, torch.int64, (2, 2)),
             (torch.uint8, torch.uint8, (17,)), (torch.int16, torch.int16, ())]
    fields = make_fields(mode, B, P, specs, device, seed=3)
    check(mode, slots(B, P, torch.int32, device, seed=2), fields, what=mode)


def test_reference_semantics_by_hand(device):
    """The reference itself, on a case small enough to write down."""
    index = torch.tensor([2, -1, 0, 2**32 + 1, 5], device=device)
    src = torch.tensor([10, 11, 12, 13, 14], device=device)
    dst = torch.full((4,), -7, device=device)
    recipes.relay_scatter(index, [(src, dst)])
    assert dst.tolist() == [12, -7, 10, -7]
    out = torch.full((5,), -7, device=device)
    recipes.relay_gather(index, [(dst, out)])
    assert out.tolist() == [10, 0, 12, 0, 0]
    assert recipes.relay_scatter.reference is R.reference_scatter
    assert recipes.relay_gather.reference is R.reference_gather


# --- widths, strides, batch sizes --------------------------------------------------------
@pytest.mark.parametrize("mode", ["scatter", "gather"])
@pytest.mark.parametrize("W", [1, 2, 3, 16, 100, 1000, 4097, 8192])
def test_widths(device, mode, W):
    B, P = 3, 5
    specs = [(torch.bfloat16, torch.bfloat16, (W,)), (torch.int64, torch.int32, ())]
    configs = [None] if W > 1000 else [None, SMALL]
    for cfg in configs:
        fields = make_fields(mode, B, P, specs, device, seed=W)
        check(mode, slots(B, P, torch.int64, device, seed=W), fields, cfg, f"W={W}")


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_many_rows_partial_tiles(device, mode):
    """B = 70: several row blocks per field with a partial last one; narrow fields take
    many rows a tile (R = 128 for [B], 64 for width 3 at BLOCK 128, ROWS 2)."""
    B, P = 70, 100
    specs = [(torch.float32, torch.float16, (130,)), (torch.int64, torch.int64, ()),
             (torch.bfloat16, torch.float32, (3,))]
    index = slots(B, P, torch.int32, device, seed=70)
    for cfg in (SMALL, {"BLOCK": 128, "ROWS": 1, "num_warps": 2, "SINGLE": 0}):
        check(mode, index, make_fields(mode, B, P, specs, device, seed=70), cfg, "B=70")


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_strided_rows_and_views(device, mode):
    """Rows with padding (views into wider buffers), a 3-D field, a strided [B] field and
    a strided index; the padding around every view must stay untouched."""
    B, P = 5, 7
    index = slots(2 * B, P, torch.int64, device, seed=4)[::2]          # stride 2
    assert index.stride(0) == 2
    rows = {"scatter": (B, P), "gather": (P, B)}[mode]
    src_base = [hard((rows[0], 130), torch.float32, 1).to(device),
                hard((rows[0], 4), torch.int64, 2).to(device),
                hard((rows[0], 3, 2, 5), torch.bfloat16, 3).to(device)]
    dst_base = [poison((rows[1], 140), torch.bfloat16, device),
                poison((rows[1], 3), torch.int32, device),
                poison((rows[1], 3, 2, 5), torch.float16, device)]
    views = lambda s, d: [(s[0][:, 7:107], d[0][:, 33:133]),        # noqa: E731
                          (s[1][:, 1], d[1][:, 2]),                  # [B] with stride
                          (s[2][:, 1], d[2][:, 2])]                  # [B, 2, 5] rows
    fields = views(src_base, dst_base)
    assert fields[0][0].stride() == (130, 1) and fields[1][1].stride() == (3,)
    ref_base = [d.clone() for d in dst_base]
    R.reference(index, views(src_base, ref_base), mode)
    fn = recipes.relay_scatter if mode == "scatter" else recipes.relay_gather
    fn(index, fields, config=SMALL)
    for i, (got, want) in enumerate(zip(dst_base, ref_base, strict=True)):
        assert_bits(got, want, f"{mode} base {i}", nan_payload_free=(i != 1))


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_expanded_src_rows(device, mode):
    """A source with dim-0 stride 0 (one row broadcast) is a valid input."""
    B, P = 4, 6
    row = hard((1, 50), torch.float32, 9).to(device)
    n = B if mode == "scatter" else P
    src = row.expand(n, 50)
    dst = poison((P if mode == "scatter" else B, 50), torch.float32, device)
    check(mode, slots(B, P, torch.int64, device), [(src, dst)], what="expanded")


@pytest.fixture
def count_launches(monkeypatch):
    counter = CountingKernel(R._relay_kernel)
    monkeypatch.setattr(R, "_relay_kernel", counter)
    return counter


def test_empty_batch_and_empty_rows_launch_nothing(device, count_launches):
    for mode, fn in (("scatter", recipes.relay_scatter), ("gather", recipes.relay_gather)):
        index = torch.empty(0, dtype=torch.int64, device=device)
        b0 = torch.empty(0, 16, device=device)
        pool = poison((4, 16), torch.float32, device)
        fields = [(b0, pool)] if mode == "scatter" else [(pool, b0)]
        fn(index, fields)
        assert_equal(pool, poison((4, 16), torch.float32, device), f"{mode} B=0")
        index = torch.tensor([1, 0], device=device)            # rows of width 0
        z_b, z_p = torch.empty(2, 3, 0, device=device), torch.empty(4, 3, 0, device=device)
        fn(index, [(z_b, z_p)] if mode == "scatter" else [(z_p, z_b)])
    assert count_launches.launches == 0


def test_one_launch_for_all_fields(device, count_launches):
    B, P = 3, 4
    specs = [(torch.float32, torch.bfloat16, (w,)) for w in (1, 64, 300)] + \
            [(torch.int32, torch.int64, ()) for _ in range(4)] + \
            [(torch.float16, torch.float16, (0,))]              # width 0: dropped
    for mode in ("scatter", "gather"):
        fields = make_fields(mode, B, P, specs, device)
        check(mode, slots(B, P, torch.int64, device), fields, what=mode)
    assert count_launches.launches == 2


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_empty_pool(device, mode):
    """P = 0: scatter skips every row, gather zero-fills every row."""
    B = 3
    specs = [(torch.float32, torch.float32, (20,)), (torch.int64, torch.int64, ())]
    fields = make_fields(mode, B, 0, specs, device)
    check(mode, torch.tensor([0, -1, 2], device=device), fields, what="P=0")


@pytest.mark.parametrize("mode", ["scatter", "gather"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_single_request(device, mode, index_dtype):
    """B = 1 with the scalar-slot path on and off: a valid slot, then outside slots."""
    P, H = 6, 7168
    specs = [(torch.int64, torch.int64, ()), (torch.float32, torch.float32, ()),
             (torch.bfloat16, torch.bfloat16, (H,)), (torch.int32, torch.int64, ())]
    values = [4, 0, -1, P] + ([2**32 + 1] if index_dtype == torch.int64 else [])
    for v in values:
        for single in (1, 0):
            fields = make_fields(mode, 1, P, specs, device, seed=v & 0xFF)
            cfg = {"BLOCK": 1024, "ROWS": 1, "num_warps": 4, "SINGLE": single}
            index = torch.tensor([v], dtype=index_dtype, device=device)
            check(mode, index, fields, cfg, f"slot={v}")


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_real_size_decode_state(device, mode):
    """H = 7168: bonus, top-1 id, top-1 prob, hidden, new seq len; then a float32 hidden
    stored into a bfloat16 pool (and back to float32)."""
    B, P, H = 4, 40, 7168
    specs = [(torch.int64, torch.int64, ()), (torch.int64, torch.int64, ()),
             (torch.float32, torch.float32, ()), (torch.bfloat16, torch.bfloat16, (H,)),
             (torch.int64, torch.int64, ())]
    index = slots(B, P, torch.int64, device, seed=7)
    check(mode, index, make_fields(mode, B, P, specs, device, seed=1), what="state")
    cast = [(torch.float32, torch.bfloat16, (H,))] if mode == "scatter" else \
        [(torch.bfloat16, torch.float32, (H,))]
    check(mode, index, make_fields(mode, B, P, cast, device, seed=2), what="cast")


@pytest.mark.parametrize("mode", ["scatter", "gather"])
def test_every_config(device, mode):
    key = R.tune_key(mode, 5, 1000, 3)
    configs = R.TUNING.configs(key)
    assert len(configs) > 20
    index = slots(5, 7, torch.int64, device, seed=8)
    specs = [(torch.bfloat16, torch.bfloat16, (1000,)), (torch.int64, torch.int32, ()),
             (torch.float32, torch.float16, (3,))]
    fields = make_fields(mode, 5, 7, specs, device, seed=8)
    ref = [(s, d.clone()) for s, d in fields]
    R.reference(index, ref, mode)
    for cfg in sample_configs(configs, 6):
        for _, d in fields:                     # re-poison: catch rows a config skips
            d.copy_(poison(d.shape, d.dtype, device))
        fn = recipes.relay_scatter if mode == "scatter" else recipes.relay_gather
        fn(index, fields, config=cfg)
        for i, ((_, got), (s, want)) in enumerate(zip(fields, ref, strict=True)):
            assert_bits(got, want, f"field {i} cfg={cfg}",
                        nan_payload_free=float_cast(s.dtype, want.dtype))


def test_heuristic_is_admitted_by_the_space():
    t = R.TUNING
    for mode in R.MODES:
        for B in (1, 2, 8, 64, 256, 4096):
            for W in (1, 3, 100, 200, 600, 1000, 1500, 4096, 5000, 7168, 8192, 20000):
                key = R.tune_key(mode, B, W, 5)
                cfg = t.heuristic(key, torch.device("cpu"))
                assert t.constraint(cfg, key) and all(cfg[k] in v for k, v in t.space.items()), \
                    (key, cfg)


# --- GPU only ----------------------------------------------------------------------------
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture_and_replay(device):
    """Captured once, replayed with new slot values (including outside ones) and new
    sources: no host sync, no allocation inside the call."""
    B, P, H = 8, 64, 7168
    specs = [(torch.int64, torch.int64, ()), (torch.float32, torch.float32, ()),
             (torch.bfloat16, torch.bfloat16, (H,)), (torch.int32, torch.int64, ())]
    for mode in ("scatter", "gather"):
        fields = make_fields(mode, B, P, specs, device, seed=1)
        index = slots(B, P, torch.int64, device, seed=1)
        fn = recipes.relay_scatter if mode == "scatter" else recipes.relay_gather
        fn(index, fields)                                   # compile outside the capture
        torch.cuda.synchronize()
        graph, allocated = capture(lambda fn=fn, i=index, f=fields: fn(i, f))
        assert allocated <= 0, f"the capture allocated {allocated} bytes"
        for seed in range(3):
            index.copy_(slots(B, P, torch.int64, device, seed=10 + seed))
            fresh = make_fields(mode, B, P, specs, device, seed=20 + seed)
            for (s, d), (fs, fd) in zip(fields, fresh, strict=True):
                s.copy_(fs)
                d.copy_(fd)
            ref = [(s, d.clone()) for s, d in fields]
            R.reference(index, ref, mode)
            graph.replay()
            torch.cuda.synchronize()
            for i, ((_, got), (_, want)) in enumerate(zip(fields, ref, strict=True)):
                assert_bits(got, want, f"{mode} replay {seed} field {i}")


@pytest.mark.skipif(not ON_GPU, reason="a pool over 2^31 elements needs GPU memory")
def test_pool_over_2_pow_31_elements(device):
    P, H = 2**17 + 8, 2**14                       # 2^31 + 2^17 elements, 4 GiB in bf16
    pool = torch.zeros(P, H, dtype=torch.bfloat16, device=device)
    index = torch.tensor([P - 1, 5, P - 3, P, -1], device=device)
    src = hard((5, H), torch.bfloat16, 1).to(device)
    recipes.relay_scatter(index, [(src, pool)])
    for b, slot in ((0, P - 1), (1, 5), (2, P - 3)):
        assert_bits(pool[slot], src[b], f"slot {slot}")
    assert int((pool[P - 2] != 0).sum()) == 0
    out = torch.full((5, H), 3.0, dtype=torch.float32, device=device)
    recipes.relay_gather(index, [(pool, out)])
    want = torch.zeros(5, H, dtype=torch.float32, device=device)
    want[:3] = src[:3].float()
    assert_bits(out, want, "gather", nan_payload_free=True)
    del pool
    torch.cuda.empty_cache()

