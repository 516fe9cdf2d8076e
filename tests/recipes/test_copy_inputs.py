"""copy_inputs: bit-for-bit copies of 1 to 16 pairs of any dtypes, sizes and alignments,
with nothing written outside the destinations; every config; errors."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import (
    ON_GPU,
    CountingKernel,
    assert_equal,
    bad,
    bad_inputs_test,
    capture,
    sample_configs,
)

CI = importlib.import_module("recipes.copy_inputs")
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

GUARD = 64            # guard bytes around every destination
POISON = 0x5A
DTYPES = [torch.bool, torch.int8, torch.uint8, torch.int16, torch.float16, torch.bfloat16,
          torch.int32, torch.float32, torch.int64, torch.float64, torch.complex64,
          torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16,
          torch.complex32]
NAN_BITS = {   # NaN payloads (quiet and signalling, both signs), -0.0, a subnormal
    torch.float32: [0x7FC00001, 0xFFBADBAD - 2**32, 0x7F800001, 0x80000000 - 2**32, 1],
    torch.float16: [0x7E01, 0x7C01, 0xFE55 - 2**16, 0x8000 - 2**16, 1],
    torch.bfloat16: [0x7FC1, 0x7F81, 0xFFAA - 2**16, 0x8000 - 2**16, 1],
    torch.float64: [0x7FF8000000000123, 0x7FF0000000000001, -(2**63), 1],
}
INT_OF = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BIG = {"BLOCK": 4096, "TILES": 8, "num_warps": 8, "num_stages": 1}
SMALL = {"BLOCK": 64, "TILES": 2, "num_warps": 1, "num_stages": 1}


def random_bits(n, dtype, g):
    """n elements of dtype with random bits (bool: 0/1), NaN payloads planted."""
    es = torch.empty((), dtype=dtype).element_size()
    bits = torch.randint(-128, 128, (n * es,), generator=g, dtype=torch.int8)
    if dtype == torch.bool:
        return (bits & 1).view(torch.bool)
    t = bits.view(dtype)
    special = NAN_BITS.get(dtype)
    if special and n:
        words = t.view(INT_OF[es])
        k = min(n, len(special))
        words[:k] = torch.tensor(special[:k], dtype=INT_OF[es])
    if dtype == torch.complex64 and n:           # NaN payload in a real part
        t.view(torch.int32)[0] = 0x7FC00BAD
    return t


def guarded_dst(n, dtype, device, offset_bytes):
    """A poisoned destination of n elements inside a poisoned buffer, `offset_bytes`
    (a multiple of the element size) past the guard band's 16-byte boundary."""
    es = torch.empty((), dtype=dtype).element_size()
    buf = torch.full((GUARD + offset_bytes + n * es + GUARD,), POISON, dtype=torch.uint8,
                     device=device)
    lo = GUARD + offset_bytes
    return buf, buf[lo: lo + n * es].view(dtype), lo


def run_case(device, specs, config=None, seed=0):
    """specs: [(dtype, n, dst byte offset, src byte offset)]; checks every pair's bytes
    and the guard bands."""
    g = torch.Generator().manual_seed(seed)
    srcs, dsts, checks = [], [], []
    for dtype, n, doff, soff in specs:
        src_bits = random_bits(n, dtype, g)
        es = src_bits.element_size()
        sbuf = torch.zeros(soff + n * es + 8, dtype=torch.uint8)
        sbuf[soff: soff + n * es] = src_bits.view(torch.uint8)
        sbuf = sbuf.to(device)
        src = sbuf[soff: soff + n * es].view(dtype)
        buf, dst, lo = guarded_dst(n, dtype, device, doff)
        srcs.append(src)
        dsts.append(dst)
        checks.append((buf, lo, n * es, src_bits.view(torch.uint8)))
    assert recipes.copy_inputs(src=srcs, dst=dsts, config=config) is None
    for i, (buf, lo, nb, want) in enumerate(checks):
        got = buf.cpu()
        assert torch.equal(got[lo: lo + nb], want), f"pair {i} {specs[i]}: bytes differ"
        assert (got[:lo] == POISON).all() and (got[lo + nb:] == POISON).all(), \
            f"pair {i} {specs[i]}: wrote outside the destination"


def test_sixteen_mixed_pairs(device):
    sizes = [0, 1, 3, 7, 17, 255, 1000, 4096, 33, 2, 129, 64, 513, 5, 1024, 11]
    specs = [(dt, n, 0, 0) for dt, n in zip(DTYPES, sizes, strict=True)]
    assert len(specs) == 16
    for cfg in (None, SMALL, BIG):
        run_case(device, specs, cfg, seed=1)


ONE_PAIR = [(dt, nb) for dt in (torch.float32, torch.bfloat16, torch.float16, torch.bool,
                                 torch.int64, torch.complex64, torch.int8)
            for nb in (0, 1, 2, 8, 24, 4096, 4100, 1 << 20)
            if nb % torch.empty((), dtype=dt).element_size() == 0]


@pytest.mark.parametrize("dtype,nbytes", ONE_PAIR)
def test_one_pair_sizes(device, dtype, nbytes):
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    run_case(device, [(dtype, n, 0, 0)], BIG if nbytes >= (1 << 20) else None, seed=nbytes)
    if nbytes == 4100:
        run_case(device, [(dtype, n, 0, 0)], SMALL, seed=3)


def test_alignment_picks_units(device):
    # byte count and both pointers' alignment decide the unit: int64 down to int8
    checked = []
    for (doff, soff, nb), want in [((0, 0, 4096), torch.int64), ((8, 16, 4096), torch.int64),
                                   ((4, 0, 4096), torch.int32), ((0, 2, 4096), torch.int16),
                                   ((0, 0, 4094), torch.int16), ((1, 0, 4096), torch.int8),
                                   ((0, 0, 4095), torch.int8)]:
        run_case(device, [(torch.uint8, nb, doff, soff)], SMALL, seed=nb + doff)
        sb = torch.zeros(soff + nb, dtype=torch.uint8, device=device)
        db = torch.zeros(doff + nb, dtype=torch.uint8, device=device)
        src, dst = sb[soff:], db[doff:]
        if sb.data_ptr() % 16 == 0 and db.data_ptr() % 16 == 0:   # allocator-aligned bases
            checked.append(nb)
            dsts, _, ns = CI._plan([src], [dst])
            assert dsts[0].dtype == want, (doff, soff, nb, dsts[0].dtype)
            assert ns[0] * dsts[0].element_size() == nb
    assert len(checked) == 7
    run_case(device, [(torch.float32, 1001, 4, 12), (torch.bfloat16, 33, 2, 6),
                      (torch.float64, 9, 8, 0)], None, seed=4)


def test_shapes_differ_and_scalars(device):
    g = torch.Generator().manual_seed(5)
    src = random_bits(12, torch.float32, g).view(3, 4).to(device)
    dst = torch.full((12,), 7.0, device=device)
    s0 = random_bits(1, torch.bfloat16, g).reshape(()).to(device)
    d0 = torch.zeros((1, 1), dtype=torch.bfloat16, device=device)
    same = random_bits(5, torch.int64, g).to(device)          # one source, two pairs
    d1, d2 = torch.zeros_like(same), torch.zeros_like(same)
    recipes.copy_inputs(src=[src, s0, same, same], dst=[dst, d0, d1, d2])
    assert torch.equal(dst.view(torch.int32).cpu(), src.reshape(-1).view(torch.int32).cpu())
    assert torch.equal(d0.view(torch.int16).reshape(()).cpu(), s0.view(torch.int16).cpu())
    assert torch.equal(d1, same) and torch.equal(d2, same)


def test_empty_pairs_launch_nothing(device, monkeypatch):
    counter = CountingKernel(CI._copy_inputs_kernel)
    monkeypatch.setattr(CI, "_copy_inputs_kernel", counter)
    e = torch.empty(0, device=device)
    recipes.copy_inputs(src=[torch.empty(0, device=device)], dst=[e])
    recipes.copy_inputs(src=[torch.empty(3, 0, device=device)],
                        dst=[torch.empty(0, 3, device=device)])
    assert counter.launches == 0
    recipes.copy_inputs(src=[torch.ones(3, device=device)], dst=[torch.empty(3, device=device)])
    assert counter.launches == 1                         # the counter sees real launches


def test_every_config(device):
    key = CI.tune_key(5, 5000)
    configs = CI.TUNING.configs(key)
    assert len(configs) > 20
    specs = [(torch.float32, 1250, 0, 0), (torch.bfloat16, 2047, 0, 2), (torch.bool, 4999, 0, 0),
             (torch.int64, 3, 0, 0), (torch.float16, 2500, 2, 0)]
    for cfg in sample_configs(configs, 8):
        run_case(device, specs, cfg, seed=6)


def test_errors(device):
    a = torch.zeros(4, device=device)
    cp = recipes.copy_inputs
    with pytest.raises(TypeError, match="src: expected a list or tuple.*Tensor"):
        cp(src=a, dst=[a.clone()])
    with pytest.raises(TypeError, match="dst: expected a list or tuple.*NoneType"):
        cp(src=[a])
    with pytest.raises(ValueError, match="src, dst: expected 1 to 16 pairs, got 0"):
        cp(src=[], dst=[])
    with pytest.raises(ValueError, match="src, dst: expected 1 to 16 pairs, got 17"):
        cp(src=[a] * 17, dst=[a.clone() for _ in range(17)])
    with pytest.raises(ValueError, match="src, dst: expected sequences of the same length.*"
                                         "got 2 and 1"):
        cp(src=[a, a], dst=[a.clone()])
    with pytest.raises(TypeError, match="dst\\[1\\].*Tensor.*list"):
        cp(src=[a, a], dst=[a.clone(), [1, 2]])
    with pytest.raises(TypeError, match="dst\\[0\\]: expected the dtype of src\\[0\\], "
                                        "float16, got float32"):
        cp(src=[a.half()], dst=[a.clone()])
    with pytest.raises(ValueError, match="dst\\[0\\]: expected the number of elements of "
                                         "src\\[0\\], 5 .*got 4 "):
        cp(src=[torch.zeros(5, device=device)], dst=[a.clone()])
    with pytest.raises(ValueError, match="src\\[0\\].*contiguous.*strides \\(2,\\)"):
        cp(src=[torch.zeros(8, device=device)[::2]], dst=[a.clone()])
    with pytest.raises(ValueError, match="dst\\[0\\].*contiguous"):
        cp(src=[torch.zeros(4, device=device)], dst=[torch.zeros(2, 2, device=device).t()])
    with pytest.raises(ValueError, match="config.*unknown keys.*BLOCK"):
        cp(src=[a], dst=[a.clone()], config={"BLOCK_BYTES": 1})
    with pytest.raises(ValueError, match="dst\\[0\\]: expected a tensor on .*meta"):
        cp(src=[a], dst=[a.to("meta")])
    if ON_GPU:
        with pytest.raises(ValueError, match="dst\\[0\\]: expected a tensor on cuda.*cpu"):
            cp(src=[a], dst=[a.cpu()])


def _cp(build):
    """A call on a buffer of 12 float32: build(buf) -> (src list, dst list, config)."""
    def call(dev):
        src, dst, cfg = build(torch.zeros(12, device=dev))
        return recipes.copy_inputs(src=src, dst=dst, config=cfg)
    return call


BAD = [
    bad("BLOCK=100", _cp(lambda b: ([b[4:8]], [b[:4]], {"BLOCK": 100})), ValueError,
        r"config\['BLOCK'\]: expected one of \(64, 128, .*4096\).*got 100"),
    bad("TILES=3", _cp(lambda b: ([b[4:8]], [b[:4]], {"TILES": 3})), ValueError,
        r"config\['TILES'\].*\(1, 2, 4, 8\).*got 3"),
    bad("num_warps=32", _cp(lambda b: ([b[4:8]], [b[:4]], {"num_warps": 32})), ValueError,
        r"config\['num_warps'\].*got 32"),
    bad("num_stages=2", _cp(lambda b: ([b[4:8]], [b[:4]], {"num_stages": 2})), ValueError,
        r"config\['num_stages'\].*\(1,\).*got 2"),
    bad("dst is its src", _cp(lambda b: ([b[:4]], [b[:4]], None)), ValueError,
        r"dst\[0\]: expected a tensor that shares no memory with src\[0\]"),
    bad("dst half over its src", _cp(lambda b: ([b[:4]], [b[2:6]], None)), ValueError,
        r"dst\[0\]: expected a tensor that shares no memory with src\[0\]"),
    bad("two dsts overlap", _cp(lambda b: ([b[8:12], b[8:12]], [b[:4], b[2:6]], None)),
        ValueError, r"dst\[0\]: expected a tensor that shares no memory with dst\[1\]"),
    bad("dst is another pair's src", _cp(lambda b: ([b[4:8], b[:4]], [b[:4], b[8:12]],
                                                    None)), ValueError,
        r"dst\[0\]: expected a tensor that shares no memory with src\[1\]"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_pruned_config_shared_src_and_adjacent_pairs(device):
    """The constraint only prunes the tuner's search: a 64-unit tile on 16 warps (under
    one unit a thread) copies the same bits. One src copied to two dsts, and pairs side
    by side in one allocation, are no overlap."""
    cfg = {"BLOCK": 64, "TILES": 8, "num_warps": 16, "num_stages": 1}
    assert not CI.constraint(cfg, CI.tune_key(3, 40))
    buf = torch.zeros(30, device=device)
    src = torch.arange(10, dtype=torch.float32, device=device)
    recipes.copy_inputs(src=[src, src, src + 1], dst=[buf[:10], buf[10:20], buf[20:]],
                        config=cfg)
    assert_equal(buf, torch.cat([src, src, src + 1]), "adjacent dsts")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture(device):
    g = torch.Generator().manual_seed(7)
    specs = [(torch.int64, 256), (torch.int32, 513), (torch.float32, 1024), (torch.bool, 77),
             (torch.bfloat16, 2048), (torch.float16, 1), (torch.int64, 3), (torch.float32, 999)]
    srcs = [random_bits(n, dt, g).to(device) for dt, n in specs]
    dsts = [torch.zeros_like(s) for s in srcs]
    recipes.copy_inputs(src=srcs, dst=dsts)         # compile outside the capture
    torch.cuda.synchronize()
    graph, allocated = capture(lambda: recipes.copy_inputs(src=srcs, dst=dsts))
    assert allocated <= 0, f"the capture allocated {allocated} bytes"
    for seed in (8, 9):
        g = torch.Generator().manual_seed(seed)
        for s, (dt, n) in zip(srcs, specs, strict=True):
            s.copy_(random_bits(n, dt, g).to(device))
        graph.replay()
        torch.cuda.synchronize()
        for d, s in zip(dsts, srcs, strict=True):
            assert torch.equal(d.view(torch.uint8), s.view(torch.uint8))
