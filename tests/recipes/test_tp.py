"""recipes.tp: vocabulary-parallel argmax and chain_verify, bit for bit the single-device
calls on the full logits.

Process groups: `tests/recipes/tp_worker.py` ranks (gloo, the kernels under the interpreter on
the CPU; also nccl on CUDA when there are GPUs enough) check every scenario themselves
on every rank. In this process: the per-rank pieces with the split simulated (shards'
keys max-combined, as the all-reduce does), one rank without a process group, errors.
"""
import datetime
import importlib
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import recipes
from recipes import _common as C
from recipes import tp
from tests.helpers import ON_GPU, assert_equal, hard_logits

CV = importlib.import_module("recipes.chain_verify")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_worker.py")
SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "UNROLL": 2}


def run_group(world: int, device: str, scenarios: str, timeout: float = 300):
    """Start `world` worker ranks on a TCPStore hosted here; each must exit 0."""
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True,
                          timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["SPEC_TEST_DEVICE"] = "cpu"
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(store.port),
                               device, scenarios], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, o) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {r}/{world} failed:\n{o[-4000:]}"
        assert f"rank {r}/{world}: {scenarios.replace(',', ', ')} ok" in o, o[-2000:]


# --- process groups ------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.skipif(C.interpreter_numpy_problem() is not None,
                    reason="gloo ranks run the kernels under the Triton interpreter, which "
                           "cannot run with this NumPy (the NCCL test covers GPUs)")
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_group_equals_one_device(world):
    """Even and uneven shards (starts off multiples of 4, padding with +inf/NaN garbage,
    NaN just before a rank's first column), equal maxima on both sides of each cut, NaN on
    two ranks, all -inf rows, greedy and sampled requests in one batch, int32 and int64
    drafts outside [0, V), 2-D and 3-D logits, out= buffers, one all-reduce per call, B=0,
    a group of one, and the per-rank pieces: every rank equals the one-device call."""
    run_group(world, "cpu", "argmax,greedy,sampled,edges")


@pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_group_equals_one_device_and_captures():
    n = min(4, torch.cuda.device_count())
    run_group(n, "cuda", "argmax,greedy,sampled,edges,graph")


# --- the split simulated in one process ------------------------------------------------
def split_keys(full, cuts, V, pad=0, **kw):
    """The all-reduced keys of a split at `cuts` (rank starts), each rank's keys from
    local_keys on its columns (the last padded with NaN/+inf garbage), max-combined."""
    keys = None
    bounds = list(cuts) + [V]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        p = pad if i == len(cuts) - 1 and i > 0 else 0
        buf = torch.full(full.shape[:-1] + (b - a + p + 4,), float("nan"), dtype=full.dtype,
                         device=full.device)
        buf[..., 4:4 + b - a] = full[..., a:b]
        buf[..., 4 + b - a::2] = float("inf")
        k = tp.local_keys(buf[..., 4:4 + b - a + p], vocab_start=a, vocab_size=V, **kw)
        keys = k if keys is None else torch.maximum(keys, k)
    return keys


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_pieces_real_vocab_151936():
    """A 3-way split of V = 151936 (the second rank starts off a multiple of 4), bf16:
    argmax rows with the hard cases, and a greedy and a sampled request (K = 0)."""
    dev = "cuda" if ON_GPU else "cpu"
    V = 151936
    cuts = [0, 50645 + 1, 2 * 50645 + 2]
    x = hard_logits(6, V, torch.bfloat16, dev, seed=4)
    x[5, cuts[1] - 1] = x[5, cuts[1]] = 1e4                   # a tie across the cut
    big = None if ON_GPU else {"BLOCK_V": 8192, "SPLIT": 1, "num_warps": 8}
    keys = split_keys(x, cuts, V, pad=64, config=big)
    assert_equal(tp.finish_argmax(keys, out=keys), recipes.argmax(x), "argmax")
    B, K = 2, 0
    x = hard_logits(B * (K + 1), V, torch.bfloat16, dev, seed=5)   # request 0: greedy
    x[K + 1:] = torch.randn(K + 1, V, generator=torch.Generator().manual_seed(6)).to(x) * 2
    T = torch.tensor([0.0, 0.8], device=dev)
    seeds = torch.tensor([3, -2**40], device=dev)
    pos = torch.tensor([0, 77], device=dev)
    t = CV.target_tokens(x.cpu(), B, K, T.cpu(), seeds.cpu(), pos.cpu())
    d = t[:, :K].to(dev)          # K = 0: the bonus token only
    kw = {"temperature": T, "seeds": seeds, "positions": pos}
    keys = split_keys(x.view(B, K + 1, V), cuts, V, pad=64, config=big, **kw)
    want = recipes.chain_verify(x, d, config=big, **kw)
    got = tp.finish_verify(keys, d)
    for name in recipes.VerifyResult._fields:
        assert_equal(getattr(got, name), getattr(want, name), name)
    assert want.bonus.tolist() == t[:, 0].tolist()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_pieces_every_config(device):
    """Chunks of one rank meet in the stage-2 workspace (SPLIT > 1) and shards start off
    multiples of 4: sampled rows with the filtered and the exact scan."""
    B, K, V = 2, 1, 3001
    cuts = [0, 1, 1027, 2050]
    x = (torch.randn(B * (K + 1), V, generator=torch.Generator().manual_seed(2)) * 2)
    x = x.to(torch.bfloat16).to(device)
    x[1, 1000:] = float("-inf")
    kw = {"temperature": torch.tensor([1.0, 0.0], device=device),
          "seeds": torch.tensor([5, 6], device=device),
          "positions": torch.tensor([9, 0], device=device)}
    d = torch.tensor([[7], [-1]], device=device)
    want = recipes.chain_verify(x, d, **kw)
    for cfg in (SMALL, {**SMALL, "EXACT": 1, "SPLIT": 2}):
        got = tp.finish_verify(split_keys(x, cuts, V, pad=3, config=cfg, **kw), d)
        for name in recipes.VerifyResult._fields:
            assert_equal(getattr(got, name), getattr(want, name), f"{name} cfg={cfg}")
    keys = split_keys(x, cuts, V, pad=3, config={**SMALL, "SPLIT": 2, "UNROLL": 1})
    assert_equal(tp.finish_argmax(keys), torch.argmax(x, 1), "argmax")


def test_local_keys_are_the_packed_global_argmax(device):
    """The documented key: pack(value, global id) of the rank's best column, and
    pack(-inf, vocab_start) for a rank whose columns are all -inf."""
    V, vs = 1000, 301
    x = torch.randn(3, 400, generator=torch.Generator().manual_seed(0))
    x[2] = float("-inf")
    k = tp.local_keys(x.to(device), vocab_start=vs, vocab_size=V).cpu()
    val, idx = x.max(1)
    key = val.view(torch.int32).to(torch.int64)
    key = torch.where(key >= 0, key, -(key & 0x7FFFFFFF))
    assert k.tolist() == ((key << 32) | (0x7FFFFFFF - (idx + vs))).tolist()
    assert tp.finish_argmax(k.to(device)).tolist() == (idx + vs).tolist()


def test_keys_kernel_runs_the_heuristic_not_a_table(device):
    """The keys kernel (no finish) never takes a config from argmax's or chain_verify's
    tuned tables, which were measured on the kernels with a finish; the single-device
    recipes do ask their tables."""
    from recipes import _configs as dispatch

    x = hard_logits(4, 600, torch.bfloat16, device, seed=3)
    t = torch.full((2,), 0.7, device=device)
    s = torch.tensor([1, 2], device=device)
    with dispatch.trace_configs() as trace:
        tp.local_keys(x, vocab_start=600, vocab_size=1200)
        tp.local_keys(x, vocab_start=600, vocab_size=1200, temperature=t, seeds=s,
                      positions=s)
    assert trace == []
    with dispatch.trace_configs() as trace:
        recipes.argmax(x)
    assert [r for r, *_ in trace] == ["argmax"]


# --- one rank, no process group ----------------------------------------------------------
def test_one_rank_without_a_group_is_the_single_device_call(device):
    V = 700
    x = hard_logits(6, V, torch.float32, device, seed=1)
    out = torch.full((6,), -7, dtype=torch.int64, device=device)
    got = tp.argmax(x, vocab_start=0, vocab_size=V, out=out)
    assert got is out
    assert_equal(got, recipes.argmax(x), "argmax")
    d = torch.tensor([[3, -1], [V, 5]], dtype=torch.int32, device=device)
    want = recipes.chain_verify(x, d)
    got = tp.chain_verify(x.view(2, 3, V), d, vocab_start=0, vocab_size=V)
    for name in recipes.VerifyResult._fields:
        assert_equal(getattr(got, name), getattr(want, name), name)


def test_errors(device):
    x = torch.randn(4, 100, device=device)
    d = torch.zeros(2, 1, dtype=torch.int64, device=device)
    kw = {"vocab_start": 0, "vocab_size": 100}
    with pytest.raises(ValueError, match="vocab_start: expected 0 <= vocab_start < "
                                         "vocab_size = 100.*got -1"):
        tp.argmax(x, vocab_start=-1, vocab_size=100)
    with pytest.raises(ValueError, match="vocab_start: .*got 100"):
        tp.local_keys(x, vocab_start=100, vocab_size=100)
    with pytest.raises(TypeError, match="vocab_start: expected an int, got float"):
        tp.argmax(x, vocab_start=0.0, vocab_size=100)
    with pytest.raises(TypeError, match="vocab_size: expected an int, got bool"):
        tp.argmax(x, vocab_start=0, vocab_size=True)
    with pytest.raises(ValueError, match="vocab_size: expected 1 <= vocab_size < 2\\^31"):
        tp.chain_verify(x, d, vocab_start=0, vocab_size=0)
    with pytest.raises(ValueError, match="local_logits: expected at most vocab_size = 99 "
                                         "columns.*got 100"):
        tp.argmax(x, vocab_start=0, vocab_size=99)
    with pytest.raises(ValueError, match="local_logits: a single rank .* whole vocabulary"):
        tp.argmax(x, vocab_start=0, vocab_size=200)
    with pytest.raises(ValueError, match="local_logits: a single rank .*vocab_start = 5"):
        tp.chain_verify(x, d, vocab_start=5, vocab_size=105)
    with pytest.raises(TypeError, match="local_logits: expected dtype"):
        tp.argmax(x.to(torch.int32), **kw)
    with pytest.raises(ValueError, match="local_logits: expected a 2-D tensor"):
        tp.argmax(x[None], **kw)
    with pytest.raises(ValueError, match="local_logits: expected 2 rows"):
        tp.chain_verify(x, d[:1], **kw)
    with pytest.raises(TypeError, match="draft_tokens: expected dtype int32/int64"):
        tp.chain_verify(x, d.float(), **kw)
    with pytest.raises(ValueError, match="out: expected shape \\(4,\\)"):
        tp.argmax(x, out=torch.empty(3, dtype=torch.int64, device=device), **kw)
    with pytest.raises(ValueError, match="group: expected None"):
        tp.argmax(x, group=object(), **kw)
    with pytest.raises(ValueError, match="seeds: expected None without "
                                         "temperature"):
        tp.chain_verify(x, d, seeds=d[:, 0], **kw)
    with pytest.raises(ValueError, match="positions: required when temperature"):
        tp.local_keys(x, temperature=torch.ones(2, device=device), seeds=d[:, 0], **kw)
    with pytest.raises(ValueError, match="local_logits: expected B\\*\\(K\\+1\\) rows for "
                                         "temperature \\[B=3\\]"):
        tp.local_keys(x, temperature=torch.ones(3, device=device), **kw)
    with pytest.raises(ValueError, match="config: unknown keys \\['EXACT'\\] for argmax"):
        tp.argmax(x, config={"EXACT": 1}, **kw)
    with pytest.raises(ValueError, match="keys: expected 4 keys"):
        tp.finish_verify(torch.zeros(5, dtype=torch.int64, device=device), d)
    with pytest.raises(TypeError, match="keys: expected dtype int64"):
        tp.finish_argmax(torch.zeros(5, dtype=torch.int32, device=device))


def test_group_backend_must_serve_the_device(monkeypatch, device):
    """Checked from the group's backend map, without a collective: nccl cannot reduce CPU
    tensors, gloo reduces CUDA tensors through the host."""
    x = torch.randn(2, 50, device=device)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    wrong = "cpu:gloo" if device.type == "cuda" else "cuda:nccl"
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: wrong)
    with pytest.raises(ValueError, match=f"group: expected a backend that all-reduces "
                                         f"{device.type} tensors.*{wrong}"):
        tp.argmax(x, vocab_start=0, vocab_size=100)
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cuda:gloo")
    if device.type == "cuda":
        with pytest.raises(ValueError, match="group: gloo all-reduces CUDA tensors"):
            tp.argmax(x, vocab_start=0, vocab_size=100)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: -1)
    with pytest.raises(ValueError, match="group: expected a process group this rank "
                                         "belongs to"):
        tp.argmax(x, vocab_start=0, vocab_size=100)
