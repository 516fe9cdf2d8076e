"""chain_verify (greedy rows): bitwise parity with the reference on hard inputs."""
import importlib

import pytest
import torch

import recipes
from tests.helpers import (
    ON_GPU,
    assert_equal,
    bad,
    bad_inputs_test,
    drafts_around,
    hard_logits,
    int64_alias,
    sample_configs,
)

CV = importlib.import_module("recipes.chain_verify")
SMALL = {"BLOCK_V": 1024, "SPLIT": 4, "num_warps": 4, "num_stages": 1, "UNROLL": 2}


def drafts_for(logits, B, K, seed, dtype=torch.int64, V=None):
    """Drafts around each row's argmax (`helpers.drafts_around`)."""
    t = torch.argmax(logits.reshape(B, K + 1, -1).cpu(), dim=-1)
    return drafts_around(t, V or logits.shape[-1], seed, dtype, logits.device)


def check(logits, draft, cfgs=(None,), **kw):
    want = CV.reference(logits, draft, **kw)
    for cfg in cfgs:
        poison = recipes.VerifyResult(
            torch.full_like(want.tokens, -77), torch.full_like(want.accept_len, -77),
            torch.full_like(want.bonus, -77), torch.full_like(want.select_index, -77))
        got = recipes.chain_verify(logits, draft, out=poison, config=cfg, **kw)
        assert isinstance(got, recipes.VerifyResult)
        for name in recipes.VerifyResult._fields:
            assert_equal(getattr(got, name), getattr(want, name), f"{name} cfg={cfg}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,V", [(1, 3, 1000), (3, 1, 7), (5, 7, 513), (2, 0, 2000),
                                   (1, 1, 1), (4, 2, 4099)])
def test_greedy_hard_inputs(device, dtype, B, K, V):
    x = hard_logits(B * (K + 1), V, dtype, device, seed=B * 100 + K * 10 + V)
    d = drafts_for(x, B, K, seed=V)
    check(x, d, cfgs=(None, SMALL, {**SMALL, "SPLIT": 1}, {**SMALL, "SPLIT": 128}))


def test_all_accept_and_all_reject(device):
    B, K, V = 4, 3, 3000
    x = hard_logits(B * (K + 1), V, torch.float32, device, seed=5)
    t = torch.argmax(x.view(B, K + 1, V), -1)
    check(x, t[:, :K].clone(), cfgs=(None, SMALL))            # m = K everywhere
    check(x, (t[:, :K] + 1) % V, cfgs=(None, SMALL))          # m = 0 everywhere
    got = recipes.chain_verify(x, t[:, :K].clone())
    assert got.accept_len.tolist() == [K] * B


def test_ids_that_would_wrap_in_int32_never_match(device):
    B, K, V = 2, 2, 600
    x = hard_logits(B * (K + 1), V, torch.float32, device, seed=2)
    t = torch.argmax(x.view(B, K + 1, V), -1)
    d = t[:, :K] + (1 << 32)              # same low 32 bits as the target
    want = CV.reference(x, d)
    assert want.accept_len.tolist() == [0, 0]
    check(x, d, cfgs=(None, SMALL))


@pytest.mark.parametrize("draft_dtype", [torch.int32, torch.int64])
def test_3d_logits_strided_and_int32_drafts(device, draft_dtype):
    B, K, V = 3, 3, 2500
    base = hard_logits(B * (K + 1), V + 300, torch.bfloat16, device, seed=9)
    x3 = base.view(B, K + 1, V + 300)[:, :, 150:150 + V]     # strided rows, 3-D
    d = drafts_for(x3.reshape(B * (K + 1), V), B, K, seed=1, dtype=draft_dtype)
    check(x3, d, cfgs=(None, SMALL))
    x2 = base[:, 150:150 + V]                                # 2-D, row stride V + 300
    check(x2, d, cfgs=(None, SMALL))
    dt = torch.empty(K, B, dtype=draft_dtype, device=device).t()   # strided drafts
    dt.copy_(d)
    check(x2, dt, cfgs=(SMALL,))


def test_real_vocab_151936(device):
    B, K, V = 2, 3, 151936
    x = hard_logits(B * (K + 1), V, torch.bfloat16, device, seed=11)
    check(x, drafts_for(x, B, K, seed=3))


def test_empty_batch(device):
    x = torch.empty(0, 100, device=device)
    d = torch.empty(0, 3, dtype=torch.int64, device=device)
    r = recipes.chain_verify(x, d)
    assert r.tokens.shape == (0, 4) and r.accept_len.shape == (0,)
    assert r.select_index.dtype == torch.int64


def test_every_config(device):
    B, K, V = 3, 3, 4100
    key = CV.tune_key(torch.bfloat16, V, B, K)
    x = hard_logits(B * (K + 1), V, torch.bfloat16, device, seed=4)
    d = drafts_for(x, B, K, seed=4)
    configs = CV.TUNING.configs(key)
    check(x, d, cfgs=sample_configs(configs, 8))


def test_errors(device):
    x = torch.randn(8, 50, device=device)
    d = torch.zeros(2, 3, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="logits.*8 rows.*B=2.*K=3.*got shape \\(7, 50\\)"):
        recipes.chain_verify(x[:7], d)
    with pytest.raises(TypeError, match="draft_tokens.*int32/int64.*float32"):
        recipes.chain_verify(x, d.float())
    with pytest.raises(ValueError, match="logits.*shape \\(2, 4, V\\).*got \\(2, 3, 50\\)"):
        recipes.chain_verify(torch.randn(2, 3, 50, device=device), d)
    with pytest.raises(ValueError, match="out.tokens.*shape \\(2, 4\\)"):
        bad = recipes.VerifyResult(torch.empty(2, 3, dtype=torch.int32, device=device),
                                   *recipes.chain_verify(x, d)[1:])
        recipes.chain_verify(x, d, out=bad)


def _args(dev):
    """logits [8, 50], drafts [2, 3] and out= buffers of the right shapes."""
    x = torch.randn(8, 50, device=dev)
    d = torch.zeros(2, 3, dtype=torch.int64, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    out = recipes.VerifyResult(torch.empty(2, 4, **i32), torch.empty(2, **i32),
                               torch.empty(2, **i32), torch.empty(2, dtype=torch.int64,
                                                                  device=dev))
    return x, d, out


def _sampled(dev, kw):
    """A sampled call on `_args`, with kw(out, seeds) as extra keyword arguments."""
    x, d, out = _args(dev)
    s = torch.zeros(2, dtype=torch.int64, device=dev)
    return recipes.chain_verify(x, d, temperature=torch.ones(2, device=dev), seeds=s,
                                positions=s.clone(), **kw(out, s))


def _cv(build):
    """A call on `_args`: build(x, d, out) -> (args, kwargs) of chain_verify."""
    def call(dev):
        a, k = build(*_args(dev))
        return recipes.chain_verify(*a, **k)
    return call


BAD = [
    bad("draft_tokens device", _cv(lambda x, d, o: ((x, d.to("meta")), {})), ValueError,
        r"draft_tokens: expected a tensor on .* \(the device of the first tensor "
        r"argument\), got one on meta"),
    pytest.param(_cv(lambda x, d, o: ((x.cpu(), d), {})), ValueError,
                 r"draft_tokens: expected a tensor on cpu.*got one on cuda",
                 id="draft_tokens on cuda, logits on cpu",
                 marks=pytest.mark.skipif(not ON_GPU, reason="two devices")),
    bad("seeds alone", _cv(lambda x, d, o: ((x, d), {"seeds": d[:, 0]})), ValueError,
        "seeds: expected None without temperature"),
    bad("positions alone", _cv(lambda x, d, o: ((x, d), {"positions": d[:, 0]})),
        ValueError, "positions: expected None without temperature"),
    bad("BLOCK_V=3", _cv(lambda x, d, o: ((x, d), {"config": {"BLOCK_V": 3}})), ValueError,
        r"config\['BLOCK_V'\]: expected one of \(1024, .*got 3"),
    bad("SPLIT=0", _cv(lambda x, d, o: ((x, d), {"config": {"SPLIT": 0}})), ValueError,
        r"config\['SPLIT'\].*got 0"),
    bad("num_warps=3", _cv(lambda x, d, o: ((x, d), {"config": {"num_warps": 3}})),
        ValueError, r"config\['num_warps'\].*\(4, 8, 16\).*got 3"),
    bad("EXACT=2", _cv(lambda x, d, o: ((x, d), {"config": {"EXACT": 2}})), ValueError,
        r"config\['EXACT'\].*\(0, 1\).*got 2"),
    bad("out.bonus is out.accept_len",
        _cv(lambda x, d, o: ((x, d), {"out": o._replace(bonus=o.accept_len)})), ValueError,
        r"out\.(accept_len|bonus): expected a tensor that shares no memory with "
        r"out\.(accept_len|bonus)"),
    bad("out.tokens over draft_tokens",
        _cv(lambda x, d, o: ((x, d), {"out": o._replace(
            tokens=d.reshape(-1).view(torch.int32)[:8].view(2, 4))})), ValueError,
        "out.tokens: expected a tensor that shares no memory with draft_tokens"),
    bad("out.select_index over logits",
        _cv(lambda x, d, o: ((x, d), {"out": o._replace(select_index=int64_alias(x, 2))})),
        ValueError, "out.select_index: expected a tensor that shares no memory with logits"),
    bad("out.select_index is seeds",
        lambda dev: _sampled(dev, lambda o, s: {"out": o._replace(select_index=s)}),
        ValueError, "out.select_index: expected a tensor that shares no memory with seeds"),
]


test_bad_inputs = bad_inputs_test(BAD)


def test_pruned_config_runs(device):
    """The constraint only prunes the tuner's search: EXACT=1 (never tuned) and a tile of
    fewer than 4 elements a thread with SPLIT past the tiles give the same bits."""
    B, K, V = 3, 2, 700
    x = hard_logits(B * (K + 1), V, torch.bfloat16, device, seed=3)
    d = drafts_for(x, B, K, seed=3)
    cfg = {"BLOCK_V": 1024, "SPLIT": 128, "num_warps": 16, "num_stages": 1, "UNROLL": 2,
           "EXACT": 1}
    assert not CV.constraint(cfg, CV.tune_key(x.dtype, V, B, K))
    check(x, d, cfgs=(cfg,))


@pytest.mark.skipif(not ON_GPU, reason="a tensor over 2^31 elements needs GPU memory")
def test_over_2_pow_31_elements(device):
    B, K, V = 4097, 3, 131072          # 16388 rows x 2^17 = 2^31 + 2^19 elements (bf16)
    x = torch.randn(B * (K + 1), V, device=device, dtype=torch.bfloat16)
    x[-1, V - 1] = 1e4
    t = torch.argmax(x.view(B, K + 1, V), -1)
    d = t[:, :K].clone()
    d[::3, 1] = -1
    check(x, d, cfgs=(None, {**SMALL, "SPLIT": 1}))
    del x
    torch.cuda.empty_cache()
