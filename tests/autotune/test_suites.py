"""The suites' harness (`autotune/suites/<recipe>.py`): every tunable's inputs, run,
reference, torch peer and bytes agree at its smoke keys, and the benchmark cases build
and run (untimed)."""
import json
import os
import random
from pathlib import Path

import pytest
import torch

from autotune.registry import benches, get, tunables
from recipes.compat import sglang as S
from tests.helpers import assert_equal
from tests.recipes.test_chain_verify_controls import check
from tests.recipes.test_compat_sglang import assert_outputs, sglang_target_verify
from tests.recipes.test_compat_sglang_composed import composed_extend

REPO = Path(__file__).resolve().parents[2]

# tunables whose torch peer returns our outputs bit for bit (the others sample, or return
# fewer outputs)
EXACT_PEERS = ("argmax", "copy_inputs", "relay", "verify_metadata")


@pytest.mark.parametrize("name", sorted(n for n in tunables() if not n.startswith("fake_")))
def test_tunable_agrees_with_its_reference(device, name):
    """At each smoke key: the heuristic's run equals the reference bit for bit (on fresh
    inputs each: runs write in place), the exact torch peers too, and bytes are counted."""
    t = get(name)
    keys = t.default_keys("smoke")
    assert keys and t.default_keys("gpu")
    for key in keys:
        ref = t.reference(t.make_inputs(key, device, 0))
        assert t.equal(t.run(t.make_inputs(key, device, 0), t.heuristic(key, device)), ref)
        if name in EXACT_PEERS:
            assert t.equal(t.torch_peer(t.make_inputs(key, device, 0)), ref), key
        assert t.bytes_moved(key) > 0


def test_relay_bytes_count_every_field(device):
    from autotune.suites import relay as RS

    t = get("relay")
    for key in t.default_keys("smoke") + [{"mode": "gather", "B": 3, "width": 40,
                                           "nfields": 6}]:
        inp = t.make_inputs(key, device, 0)
        assert t.equal(t.run(inp, t.heuristic(key, device)),
                       t.reference(t.make_inputs(key, device, 0))), key
        assert t.bytes_moved(key) == RS._bytes_fields(key["B"], inp.fields)


@pytest.mark.parametrize("name,full", [("draft_tail", 24), ("relay", 16)])
def test_bench_smoke_cases_run(device, name, full):
    suite = benches()[name]
    assert len(suite.cases("full")) == full
    for case in suite.cases("smoke"):
        state = case.make(device, 0)
        for v in case.variants.values():
            v.fn(state)


def test_draft_tail_keys_fit_the_tune_budget():
    assert len(get("draft_tail").default_keys("gpu")) <= 8   # the benchmark's B at two Vd


def test_bench_case_list_runs(device):
    """The tp bench suite: every smoke case builds and every variant runs on it, the
    per-rank keys being the shard's own (pack of its best column at global ids)."""
    from autotune.registry import benches

    suite = benches()["tp"]
    cases = suite.cases("smoke")
    assert {c.label["mode"] for c in cases} == {"greedy", "sampled"}
    assert len(suite.cases("full")) == 2 * 2 * 3 * 4
    for case in cases:
        s = case.make(device, 0)
        for v in case.variants.values():
            v.fn(s)
        if case.label["mode"] == "greedy":
            idx = 0x7FFFFFFF - (s["keys"] & 0xFFFFFFFF)
            want = torch.argmax(s["local"].reshape(s["keys"].shape[0], -1), 1) + s["vs"]
            assert_equal(idx, want, "shard argmax")
        assert case.label["keys_bytes"] < case.label["gather_bytes"]


# --- the SGLang adapters' tunables ----------------------------------------------------
def test_verify_tuning_matches_sglang(device):
    """The tuner's declaration: its inputs are SGLang's chain layout, its reference equals
    SGLang's answer, and sampled configs of the space give it bit for bit."""
    t = get(S.VERIFY_TABLE)
    key = t.default_keys("smoke")[0]
    inp = t.make_inputs(key, device, 3)
    ref = t.reference(inp)
    assert_outputs(ref, sglang_target_verify(*inp), "reference")
    assert int(ref.num_correct_drafts.min()) < key["K"]   # some drafts rejected
    configs = t.configs(key)
    for cfg in random.Random(0).sample(configs, min(6, len(configs))):
        assert t.equal(t.run(inp, cfg), ref), cfg
    assert len(t.default_keys("gpu")) == 15


_PROBE_SCRIPT = """
import json, sys, torch
from autotune.tune.compile import probe
from recipes.chain_verify import _verify_kernel
from autotune.registry import get
t, dev = get("sglang_target_verify"), torch.device("cuda")
key = t.default_keys("smoke")[0]
per, binaries = probe(t.run, t.make_inputs(key, dev, 0), t.configs(key)[:4])
at = (_verify_kernel.arg_names.index("SGLANG"),)
def sglang(b):
    spec = json.loads(b.spec)
    return dict(zip(map(tuple, spec["constant_keys"]), spec["constant_vals"]))[at]
print(json.dumps([sorted(sglang(binaries[i]) for i in ids) for ids in per.values()]))
"""


def test_verify_probe_sees_both_variants(device):
    """The tuner's compile probe (Triton compiles nothing, `warmup` returns None) runs
    the adapter's launcher through: each config records the plain variant (the cap's
    measure) and the variant it launches, so the compile pool builds both. In a fresh
    process, as a tune probes: binaries this one loaded would not be compiled again."""
    import subprocess
    import sys

    if device.type != "cuda":                 # the interpreter compiles nothing to probe
        from autotune.tune.compile import probe
        t = get(S.VERIFY_TABLE)
        key = t.default_keys("smoke")[0]
        per, binaries = probe(t.run, t.make_inputs(key, device, 0), t.configs(key)[:2])
        assert not binaries and len(per) == 2
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(REPO)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    per = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(per) == 4 and all(v == [False, True] for v in per), per


def test_topk1_tuning_matches_the_composition(device):
    """The tuner's declaration of the draft_topk1 launch: draft_tail's keys at H = 0, its
    reference equals torch's argmax, positions += 1 and the column write, its outputs are
    poisoned buffers that a run must write, and sampled configs give the reference bit
    for bit."""
    t = get(S.TOPK1_TABLE)
    assert t.tuning is S.TOPK1_TUNING and t.on_request
    keys = t.default_keys("gpu")
    assert len(keys) == 8 and {k["H"] for k in keys} == {0}
    key = t.default_keys("smoke")[0]
    inp = t.make_inputs(key, device, 3)
    x, pos, drafts, column, out = inp
    assert x.shape == (key["B"], key["V"]) and column == 1
    assert out[0].isnan().all() and bool((out[1] == -7).all())   # poisoned
    pos0, drafts0 = pos.clone(), drafts.clone()
    ref = t.reference(inp)
    want = torch.argmax(x, dim=1)
    assert_equal(ref[1], want[:, None], "topk_index")
    assert_equal(ref[0], torch.ones(key["B"], 1, device=device), "topk_p")
    assert_equal(ref[2], pos0 + 1, "positions")
    drafts0[:, column] = want
    assert_equal(ref[3], drafts0, "draft_tokens")
    configs = t.configs(key)
    for cfg in random.Random(0).sample(configs, min(6, len(configs))):
        assert t.equal(t.run(t.make_inputs(key, device, 3), cfg), ref), cfg


def test_extend_tuning_matches_the_composition(device):
    """The tuner's declaration of the draft_extend launch: its reference equals draft_tail's
    and relay's composition (also on out-of-range rows and DSA rows), its outputs are
    poisoned buffers that a run must write, and sampled configs of the space give the
    reference bit for bit."""
    t = get(S.EXTEND_TABLE)
    assert t.tuning is S.EXTEND_TUNING and get(S.VERIFY_TABLE).tuning is S.TUNING
    key = t.default_keys("smoke")[0]
    inp = t.make_inputs(key, device, 3)
    x, rows, hidden, out = inp
    ref = t.reference(inp)
    for name, g, w in zip(("topk_p", "topk_index", "hidden", "dsa"), ref,
                          composed_extend(x, rows, hidden, None), strict=True):
        if w is None:
            assert g is None, name
        else:
            assert_equal(g, w, name)
    assert out[0].isnan().all() and bool((out[1] == -7).all())   # poisoned
    configs = t.configs(key)
    for cfg in random.Random(0).sample(configs, min(6, len(configs))):
        assert t.equal(t.run(t.make_inputs(key, device, 3), cfg), ref), cfg
    assert len(t.default_keys("gpu")) == 8


# --- bench suite and target -------------------------------------------------------------------
def test_bench_suite_and_target(device, tmp_path):
    """The compat_sglang_sampled suite covers the issue's shapes with chain_verify timed on
    the same inputs (the same answer: its smoke case without controls), and
    `dropin.sglang_sampled` holds each case to 1.1x of it."""
    from autotune import targets
    from autotune.bench import results
    from autotune.suites.compat_sglang import SUITES

    suite = next(s for s in SUITES if s.name == "compat_sglang_sampled")
    case = next(c for c in suite.cases("smoke") if c.label["controls"] == "off")
    state = case.make(device, 3)
    got = case.variants["ours"].fn(state)
    r = case.variants["ours: chain_verify"].fn(state)
    assert_equal(r.bonus, got.bonus_tokens, "bonus")
    assert_equal(r.accept_len, got.num_correct_drafts, "accepted")
    full = suite.cases("full")
    assert sorted((c.label["B"], c.label["controls"]) for c in full) == sorted(
        (b, c) for b in (1, 8, 64) for c in ("off", "topk_topp"))
    assert all(c.label["N"] == 4 and c.label["V"] == 151936 and c.label["dtype"] == "bfloat16"
               and {"ours", "ours: chain_verify"} <= set(c.variants) for c in full)

    def timed(c, ours, cv):
        return {"label": c.label, "bytes": c.bytes, "errors": {},
                "timings": {"ours": {"p50": ours, "mode": "behind"},
                            "ours: chain_verify": {"p50": cv, "mode": "behind"}}}
    cases = [timed(c, 10.5 if c.label["B"] < 64 else 12.5, 10.0) for c in full]
    results.write_json(tmp_path / "bench-compat_sglang_sampled.json",
                       {"suite": suite.name, "cases": cases})
    row = next(r for r in targets.compute(tmp_path) if r["id"] == "dropin.sglang_sampled")
    assert row["met"] is False and row["measured"] == 1.25, row
    assert "4 of 6 cases" in row["detail"] and "B=64" in row["detail"]
    for c in cases:
        c["timings"]["ours"]["p50"] = 10.9
    results.write_json(tmp_path / "bench-compat_sglang_sampled.json",
                       {"suite": suite.name, "cases": cases})
    row = next(r for r in targets.compute(tmp_path) if r["id"] == "dropin.sglang_sampled")
    assert row["met"] is True and row["measured"] == 1.09, row


def test_chain_verify_controls_suite_cases_run(device):
    """The bench's chain_verify_controls suite: its smoke cases make inputs that both
    variants run on (the cheap ones here: min_p and every control off)."""
    from autotune.suites.chain_verify import SUITES

    suite = next(s for s in SUITES if s.name == "chain_verify_controls")
    cases = suite.cases("smoke")
    assert {c.label["controls"] for c in cases} == {"topk_topp", "topp", "minp", "off"}
    for c in cases:
        if c.label["controls"] in ("minp", "off"):
            s = c.make(device, 0)
            got = c.variants["ours"].fn(s)
            check(s["x"], s["d"], {**s["kw"], **s["c"]}, got)
            c.variants["ours (temperature only)"].fn(s)


def test_chain_verify_tunes_the_controls_mode(device):
    """The controls mode is tuned as its own key: the default keys hold it at the
    controls targets' shapes, and its inputs mix the controls requests carry (each
    request one set, every set in a batch of 3) and run equal to the reference."""
    from autotune.suites.chain_verify import MIX
    from recipes.chain_verify import tune_key

    t = get("chain_verify")
    modes = [k for k in t.default_keys("gpu") if k["mode"] == "controls"]
    assert [(k["dtype"], k["V"], k["B"]) for k in modes] == [
        ("bfloat16", 151936, b) for b in (1, 8, 64)]
    key = tune_key(torch.bfloat16, 2000, 3, 2, True, True)
    inp = t.make_inputs(key, device, 0)
    got = [{n: inp[2][n][b].item() for n in MIX[0]} for b in range(3)]
    assert got == [{n: pytest.approx(v) for n, v in m.items()} for m in MIX]
    assert t.equal(t.run(inp, t.heuristic(key, device)), t.reference(inp))
    assert t.bytes_moved(key) > t.bytes_moved({**key, "mode": "sampled"})


def test_torch_peer_applies_the_controls(device):
    """The torch peer of a controls key filters as torch samplers do: off values keep
    every id, top_k = 1, a tiny top_p or min_p = 1 keep only the
    row's largest, and the controls key's peer samples under its request's controls."""
    from autotune.suites.chain_verify import torch_controls
    from recipes.chain_verify import tune_key

    g = torch.Generator(device=device).manual_seed(3)
    probs = torch.softmax(torch.randn(5, 300, generator=g, device=device), dim=-1)
    R = probs.shape[0]
    off = torch_controls(probs, top_k=torch.tensor([0, -1, 0, -5, 0], device=device),
                         top_p=torch.ones(R, device=device), min_p=torch.zeros(R, device=device))
    assert bool((off > 0).all())                   # every id kept
    top = probs.argmax(dim=-1)
    for ctl in ({"top_k": torch.ones(R, dtype=torch.int64, device=device)},
                {"top_p": torch.full((R,), 1e-6, device=device)},
                {"min_p": torch.ones(R, device=device)}):
        kept = torch_controls(probs, **ctl) > 0
        assert kept.sum(dim=-1).tolist() == [1] * R, ctl
        assert_equal(kept.float().argmax(dim=-1), top)
    k3 = torch_controls(probs, top_k=torch.full((R,), 3, device=device)) > 0
    assert_equal(k3, torch.zeros_like(k3).scatter_(1, probs.topk(3, dim=-1).indices, True))

    t = get("chain_verify")
    key = tune_key(torch.float32, 2000, 3, 2, True, True)      # float32: no tied maxima
    x, d, kw = t.make_inputs(key, device, 0)
    kw["top_k"] = torch.ones(3, dtype=torch.int64, device=device)
    assert_equal(t.torch_peer((x, d, kw)).tokens, t.reference((x, d, {})).tokens)
