"""The issues' speed targets against a GPU's committed results.

    python -m autotune.targets results/h200 [copy_TBps]       (or `make targets`)

prints TARGETS.md (a markdown table) and writes `<dir>/targets.json`: its header (the
bench run's GPU and versions, this run's date and command: `autotune.provenance`),
"inputs" (each input file's header) and "rows", one per target: {"id", "what", "target",
"measured", "unit", "met", "detail"} (and "reason" where `met` is null: an input is
missing or predates what the target needs). Inputs, all under
`<dir>`: the bench files (`BENCH.json`, `bench-<suite>.json`), `tune-report.json` and
`tuner-quality.json` where present, `spec-decode.json` (the example's decode loop),
and `sglang-reference.json` (SGLang's times on this
GPU, the drop-in targets' yardstick; see its note). Times are the bench's primary timing
(each call behind a plain kernel); a suite timed by an earlier bench, back to back only,
gives null. copy_TBps: the copy-bandwidth ceiling for the bandwidth fractions (default:
the one the bench run measured, BENCH.json).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.bench.results import (
    HEURISTIC,
    REPEAT,
    back_to_back_time,
    copy_time_at,
    geomean,
    ours_time,
    p50,
    primary_regime,
    read_json,
    suite_header,
    write_json,
)
from autotune.provenance import FIELDS, command_line, line, now, of, relative

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DROPIN_FACTOR = 1.3        # the drop-in adapters: at most SGLang's time / 1.3


class Missing(Exception):
    """An input the target needs is not there (the reason is the message)."""


class Inputs:
    """The result files of one GPU folder, read on first use."""

    def __init__(self, root: Path, ceiling_Bps: float | None = None):
        self.root = Path(root)
        self.shown = relative(root, Path.cwd())      # the folder as the reasons name it
        self.bench = read_json(self.root / "BENCH.json") or {}
        self._ceiling = ceiling_Bps
        self._suites: dict = {}

    def ceiling(self) -> float:
        bw = self._ceiling or self.bench.get("copy_bandwidth_Bps")
        if not bw:
            raise Missing(f"no copy bandwidth: {self.shown}/BENCH.json missing")
        return bw

    def suite(self, name: str) -> dict:
        if name not in self._suites:
            res = read_json(self.root / f"bench-{name}.json")
            if res is None:
                raise Missing(f"no {self.shown}/bench-{name}.json")
            self._suites[name] = res
        return self._suites[name]

    def cases(self, name: str, primary: bool = True, **label) -> list[dict]:
        """The suite's timed cases whose label has these values; with `primary`, only if
        the suite was timed behind a plain kernel."""
        res = self.suite(name)
        if primary and primary_regime(res) not in (None, "behind"):
            raise Missing(f"bench-{name}.json was timed by an earlier bench (calls back to "
                          "back only): run the bench again")
        return [c for c in res["cases"] if ours_time(c) is not None
                and all(c["label"].get(k) == v for k, v in label.items())]

    def need(self, name: str, where=None, what: str = "", **label) -> list[dict]:
        """`cases`, kept by `where` (a predicate) too; Missing when none is left."""
        found = [c for c in self.cases(name, **label) if where is None or where(c)]
        if not found:
            raise Missing(f"bench-{name}.json has no timed case {_lab(label)}{what}")
        return found

    def suite_names(self) -> list[str]:
        return sorted(p.name[len("bench-"):-len(".json")]
                      for p in self.root.glob("bench-*.json"))

    def file(self, name: str) -> dict:
        data = read_json(self.root / name)
        if data is None:
            raise Missing(f"no {self.shown}/{name}")
        return data


def _lab(label: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in label.items())


def _bw(inp: Inputs, c: dict, nbytes: float | None = None) -> float:
    return (c["bytes"] if nbytes is None else nbytes) / (ours_time(c) * 1e-6) / inp.ceiling()


def _bw_text(inp: Inputs, c: dict, nbytes: float | None = None) -> str:
    """'T us, X% copy BW' and, where the run has the curve, against a same-size copy."""
    text = f"{_lab(c['label'])}: {ours_time(c):.1f} us, {100 * _bw(inp, c, nbytes):.0f}%"
    t = copy_time_at(inp.bench.get("copy_curve"), c["bytes"] if nbytes is None else nbytes)
    return text + (f" (same-size copy {t:.1f} us: {100 * t / ours_time(c):.0f}%)" if t else "")


def _b2b(c: dict) -> str:
    t = back_to_back_time(c)
    return f"back to back {t:.2f} us" if t is not None else "back to back: not timed"


def _at_most(inp, suite, limit, where=None, what="", **label):
    """The slowest of the matching cases against a time limit."""
    cs = inp.need(suite, where, what, **label)
    worst = max(cs, key=ours_time)
    detail = "; ".join(f"{_lab(c['label'])}: {ours_time(c):.2f} us, {_b2b(c)}" for c in cs)
    return ours_time(worst), ours_time(worst) <= limit, detail


def _at_least_bw(inp, suite, floor, where=None, what="", nbytes=None, **label):
    """The matching case furthest below a fraction of copy bandwidth (`nbytes(case)`: the
    bytes the target counts, default the bench's)."""
    cs = inp.need(suite, where, what, **label)
    count = nbytes or (lambda c: c["bytes"])
    frac = {id(c): _bw(inp, c, count(c)) for c in cs}
    worst = min(cs, key=lambda c: frac[id(c)])
    below = sum(1 for c in cs if frac[id(c)] < floor)
    return (round(100 * frac[id(worst)], 1), not below,
            f"{below} of {len(cs)} below; worst " + _bw_text(inp, worst, count(worst)))


# --- the targets: each returns (measured, met, detail) or raises Missing -----------------
def verify_b1(inp):
    return _at_most(inp, "compat_sglang", 2.8, op="target_verify", dtype="bfloat16", B=1,
                    N=4, V=151936)


def _against_sglang(inp, op: str, with_bandwidth: bool):
    ref = inp.file("sglang-reference.json").get(op)
    if not ref:
        raise Missing(f"sglang-reference.json has no {op} table")
    ok, bad = 0, []
    for r in ref:
        label = {k: v for k, v in r.items() if k != "us"}
        found = inp.cases("compat_sglang", op=op, **label)
        if not found:
            bad.append(f"{_lab(label)}: not measured")
            continue
        c, limit = found[0], r["us"] / DROPIN_FACTOR
        frac = None
        if with_bandwidth:      # the logits read once
            logits = c["label"]["B"] * c["label"]["N"] * c["label"]["V"] \
                * DTYPE_BYTES[c["label"]["dtype"]]
            frac = _bw(inp, c, logits)
        if ours_time(c) <= limit or (frac is not None and frac >= 0.92):
            ok += 1
        else:
            bad.append(f"{_lab(label)}: {ours_time(c):.2f} us > {limit:.2f}"
                       + (f", {100 * frac:.0f}% copy BW" if frac is not None else ""))
    return ok, not bad, (f"{ok} of {len(ref)} shapes; not met: " + "; ".join(bad)
                         if bad else f"all {len(ref)} shapes")


def verify_all(inp):
    return _against_sglang(inp, "target_verify", with_bandwidth=True)


def draft_all(inp):
    ok_e, met_e, det_e = _against_sglang(inp, "draft_extend", with_bandwidth=False)
    ok_t, met_t, det_t = _against_sglang(inp, "draft_topk1", with_bandwidth=False)
    return ok_e + ok_t, met_e and met_t, f"draft_extend: {det_e}. draft_topk1: {det_t}"


def _against_chain_verify(inp, ops, suite: str = "compat_vllm"):
    """An adapter suite's cases of `ops` against chain_verify timed on the same inputs
    (its variant "ours: chain_verify"; x 1.1)."""
    cs = [c for c in inp.need(suite) if c["label"]["op"] in ops]
    if not cs:
        raise Missing(f"bench-{suite}.json has no case of {'/'.join(ops)}")
    bad, worst = [], 0.0
    for c in cs:
        ref = p50(c, "ours: chain_verify")
        if ref is None:
            bad.append(f"{_lab(c['label'])}: chain_verify not timed")
            continue
        worst = max(worst, ours_time(c) / ref)
        if ours_time(c) > 1.1 * ref:
            bad.append(f"{_lab(c['label'])}: {ours_time(c):.2f} us > 1.1 x {ref:.2f}")
    return round(worst, 3), not bad, (f"{len(cs) - len(bad)} of {len(cs)} cases; not met: "
                                      + "; ".join(bad) if bad else f"all {len(cs)} cases")


def vllm_greedy(inp):
    return _against_chain_verify(inp, ("v1", "mrv2"))


def vllm_sampled(inp):
    return _against_chain_verify(inp, ("mrv2_sampled",))


def sglang_sampled(inp):
    return _against_chain_verify(inp, ("target_verify_sampled",), "compat_sglang_sampled")


PDL_B2B = "ours, PDL on (back to back)"


def greedy_b1(inp):
    """Behind a plain kernel as everywhere; back to back, the better of the default
    launch and the PDL launch (`pdl_on`, the setting for calls that follow ours)."""
    c = inp.need("chain_verify", dtype="bfloat16", B=1, K=3, V=151936)[0]
    pdl = p50(c, PDL_B2B)
    b2b = [t for t in (back_to_back_time(c), pdl) if t is not None]
    met = ours_time(c) <= 2.5 and bool(b2b) and min(b2b) <= 2.0
    return ours_time(c), met, (_b2b(c) + (f", with PDL {pdl:.2f} us" if pdl else "")
                               + " (target <= 2.0 us)")


def sampled_b1(inp):
    return _at_most(inp, "chain_verify_sampled", 3.5, dtype="bfloat16", B=1, K=3, V=151936)


def greedy_bw(inp):
    return _at_least_bw(inp, "chain_verify", 0.9, lambda c: c["label"]["B"] >= 64,
                        " with B >= 64", K=4)


def _slower_than_torch(inp, suite):
    cs = inp.cases(suite)
    slow = [c for c in cs if p50(c, "torch graph") and ours_time(c) > p50(c, "torch graph")]
    return len(slow), not slow, "; ".join(
        f"{_lab(c['label'])} ({ours_time(c):.1f} vs {p50(c, 'torch graph'):.1f} us)"
        for c in slow) or f"none of {len(cs)}"


def verify_vs_torch(inp):
    return _slower_than_torch(inp, "chain_verify")


def argmax_vs_torch(inp):
    return _slower_than_torch(inp, "argmax")


def sampled_cost(inp):
    cs = inp.need("chain_verify_sampled", lambda c: p50(c, "ours (greedy)"),
                  " with a greedy timing", B=64, K=4)
    ratio = {id(c): ours_time(c) / p50(c, "ours (greedy)") for c in cs}
    worst = max(cs, key=lambda c: ratio[id(c)])
    return (round(ratio[id(worst)], 3), ratio[id(worst)] <= 2.5,
            f"worst {_lab(worst['label'])}: {ours_time(worst):.1f} / "
            f"{p50(worst, 'ours (greedy)'):.1f} us")


def _controls_at_most(inp, controls: str, limits: dict):
    found, bad = [], []
    for B, limit in limits.items():
        c = inp.need("chain_verify_controls", dtype="bfloat16", B=B, K=3, V=151936,
                     controls=controls)[0]
        found.append(f"B={B}: {ours_time(c):.1f} us (<= {limit})")
        if ours_time(c) > limit:
            bad.append(B)
    worst = max(ours_time(inp.need("chain_verify_controls", B=B, K=3, V=151936,
                                   controls=controls)[0]) / lim for B, lim in limits.items())
    return round(worst, 3), not bad, "; ".join(found)


def _controls_ratio(inp, controls: str, limit: float):
    cs = inp.need("chain_verify_controls", lambda c: p50(c, "ours (temperature only)"),
                  " with a temperature-only timing", dtype="bfloat16", K=3, V=151936,
                  controls=controls)
    ratio = {id(c): ours_time(c) / p50(c, "ours (temperature only)") for c in cs}
    worst = max(cs, key=lambda c: ratio[id(c)])
    return round(ratio[id(worst)], 3), ratio[id(worst)] <= limit, "; ".join(
        f"B={c['label']['B']}: {ours_time(c):.1f} / {p50(c, 'ours (temperature only)'):.1f}"
        " us" for c in cs)


def controls_topk_topp(inp):
    return _controls_at_most(inp, "topk_topp", {1: 11, 8: 25, 64: 130})


def controls_topp(inp):
    return _controls_at_most(inp, "topp", {1: 16, 8: 35, 64: 200})


def controls_minp(inp):
    return _controls_ratio(inp, "minp", 1.3)


def controls_off(inp):
    return _controls_ratio(inp, "off", 1.05)


def draft_tail_b1(inp):
    return _at_most(inp, "draft_tail", 2.0, B=1, V=32000, H=4096)


def draft_tail_bw(inp):
    """The issue counts the selected logits rows and the hidden rows read once; the bench
    counts the hidden rows read and written."""
    def once(c):
        lab = c["label"]
        return c["bytes"] - lab["B"] * lab["H"] * DTYPE_BYTES[lab["dtype"]]

    return _at_least_bw(inp, "draft_tail", 0.85, nbytes=once, B=256, V=151936)


def relay_b1(inp):
    return _at_most(inp, "relay", 1.5, B=1, H=7168)


def relay_bw(inp):
    return _at_least_bw(inp, "relay", 0.7, B=256)


def verify_metadata_b1(inp):
    return _at_most(inp, "verify_metadata", 3.0, B=1, context=163840, page_size=64)


def copy_inputs_small(inp):
    return _at_most(inp, "copy_inputs", 1.5,
                    lambda c: c["label"]["pairs"] <= 8 and c["label"]["pair_bytes"] <= 4096,
                    " of <= 8 pairs of <= 4 KB")


def tune_wall(inp):
    rep = inp.file("tune-report.json")
    if rep.get("wall_s") is None:
        raise Missing("tune-report.json has no wall_s")
    if rep.get("fresh") is not True:
        raise Missing("tune-report.json is not of a fresh tune (fresh is not true): the "
                      "wall time of a resumed tune says nothing about a full one")
    return rep["wall_s"], rep["wall_s"] <= 480, f"{len(_tune_keys(inp))} keys"


def _tune_keys(inp) -> list[dict]:
    rep = inp.file("tune-report.json")
    keys = rep.get("keys") or rep.get("entries")
    if not keys:
        raise Missing("tune-report.json lists no keys")
    return keys


def tune_coverage(inp):
    keys = _tune_keys(inp)
    frac, short = [], []
    for k in keys:
        grid, done = k.get("admitted"), k.get("measured")     # the report's key rows
        if not grid or done is None:
            short.append(f"{k.get('recipe', '?')} {_lab(k.get('key') or {})}: no counts")
            continue
        frac.append(done / grid)
        if done < grid / 2:
            short.append(f"{k.get('recipe', '?')} {_lab(k.get('key') or {})}: "
                         f"{done} of {grid}")
    measured = round(100 * min(frac), 1) if frac else None
    return measured, not short, (f"{len(short)} of {len(keys)} keys short: "
                                 + "; ".join(short[:10]) if short
                                 else f"all {len(keys)} keys")


def tune_quality(inp):
    q = inp.file("tuner-quality.json")
    keys = q.get("keys") or []
    n = len(keys)
    passed = sum(1 for k in keys if k.get("within_goal_at_budget"))
    within = q.get("within", 0.03)
    frac = passed / n if n else 0.0
    met = n >= 12 and frac >= 0.9 and within <= 0.03
    return (round(100 * frac, 1), met,
            f"{passed} of {n} complete keys within {100 * within:.0f}% of the exhaustive "
            f"optimum ({len(q.get('incomplete') or [])} incomplete left out)")


def _heuristic_pairs(inp, suite):
    return [(c, p50(c, HEURISTIC)) for c in inp.cases(suite)
            if c.get("tuned") == "differs" and p50(c, HEURISTIC)]


def never_slower(inp):
    slower, seen, missing = [], 0, []
    for suite in inp.suite_names():
        try:
            pairs = _heuristic_pairs(inp, suite)
        except Missing as exc:
            missing.append(str(exc))
            continue
        seen += len(pairs)
        slower += [(suite, c, h) for c, h in pairs if ours_time(c) > 1.02 * h]
    if not seen:
        raise Missing("; ".join(missing) or "no case with a heuristic-config timing "
                      f"(no bench-*.json in {inp.shown}, or no tuned table)")
    # the case's own noise: ours timed twice (the repeat is timed last)
    beyond = [(s, c, h) for s, c, h in slower
              if p50(c, REPEAT) is None
              or ours_time(c) - 1.02 * h > abs(ours_time(c) - p50(c, REPEAT))]
    detail = "; ".join(f"{s} {_lab(c['label'])}: {ours_time(c):.2f} vs {h:.2f} us"
                       + (f" (ours repeated: {p50(c, REPEAT):.2f})" if p50(c, REPEAT) else "")
                       for s, c, h in slower[:10]) or f"none of {seen} cases"
    if slower:
        detail = (f"{len(beyond)} of the {len(slower)} by more than the case's own noise "
                  f"(ours timed twice); " + detail)
    if missing:
        detail += " (not read: " + "; ".join(missing) + ")"
    return len(slower), not slower and not missing, detail


def tune_geomean(inp):
    per = {}
    for suite in ("argmax", "chain_verify"):
        pairs = _heuristic_pairs(inp, suite)
        same = sum(1 for c in inp.cases(suite) if c.get("tuned") == "same")
        g = geomean(h / ours_time(c) for c, h in pairs)
        per[suite] = (g, len(pairs), same)
    gs = [g for g, _, _ in per.values()]
    measured = round(min(gs), 3) if all(g is not None for g in gs) else None
    met = measured is not None and measured >= 1.03
    return measured, met, "; ".join(
        f"{s}: " + (f"{g:.3f}x" if g else "no case") + f" over {n} cases whose tuned config "
        f"differs ({same} where it is the heuristic's)" for s, (g, n, same) in per.items())


# --- the example's decode loop (examples/spec_decode.py, spec-decode.json) ---------------
def _e2e(inp) -> dict:
    """{B: {loop: row}} of spec-decode.json, with the profile (a GPU run)."""
    rows = inp.file("spec-decode.json").get("rows") or []
    by: dict = {}
    for r in rows:
        by.setdefault(r["B"], {})[r["loop"]] = r
    if not by or any("gpu_busy" not in r for loops in by.values() for r in loops.values()):
        raise Missing("spec-decode.json has no profiled rows (a CPU smoke run?)")
    if any(set(loops) != {"recipes", "torch"} for loops in by.values()):
        raise Missing("spec-decode.json lacks a recipes or torch row at some B")
    return by


def e2e_gpu_bound(inp):
    by = _e2e(inp)
    least = {B: min(loops["recipes"]["gpu_busy"]) for B, loops in by.items()}
    worst = min(least.values())
    return (round(100 * worst, 1), worst >= 0.9, "; ".join(
        f"B={B}: {100 * v:.1f}% (torch {100 * min(by[B]['torch']['gpu_busy']):.1f}%)"
        for B, v in sorted(least.items())))


def e2e_pieces(inp):
    by = _e2e(inp)
    ratio = {B: loops["recipes"]["pieces_total_us"] / loops["torch"]["pieces_total_us"]
             for B, loops in by.items()}
    worst = max(ratio.values())
    return (round(worst, 3), worst <= 1 / 3, "; ".join(
        f"B={B}: {by[B]['recipes']['pieces_total_us']:.1f} / "
        f"{by[B]['torch']['pieces_total_us']:.1f} us" for B in sorted(ratio)))


def e2e_tps(inp):
    """The gain of the mean tokens/s over the larger run-to-run spread of the two loops."""
    by = _e2e(inp)
    parts, least, ok = [], None, True
    for B, loops in sorted(by.items()):
        a, b = loops["recipes"]["tokens_per_s"], loops["torch"]["tokens_per_s"]
        if len(a) < 2 or len(b) < 2:
            raise Missing(f"spec-decode.json: B={B} was not run twice")
        gain = sum(a) / len(a) - sum(b) / len(b)
        noise = max(max(a) - min(a), max(b) - min(b))
        pct = 100 * gain / (sum(b) / len(b))
        ok = ok and gain > noise
        least = pct if least is None else min(least, pct)
        parts.append(f"B={B}: {gain:+.0f} tokens/s ({pct:+.1f}%), spread {noise:.0f}")
    return round(least, 2), ok, "; ".join(parts)


TARGETS = [
    ("dropin.verify_b1", "compat target_verify B=1 N=4 V=151936 bf16", "<= 2.8 us", "us",
     verify_b1),
    ("dropin.verify_all", "compat target_verify at every shape of the verify table",
     "each shape <= SGLang / 1.3 or >= 92% copy BW (logits read once)", "shapes met",
     verify_all),
    ("dropin.draft_all", "compat draft_extend (hidden) and draft_topk1, B in {1,8,64,256}, "
     "Vd in {32000,151936}, H 4096", "each <= SGLang / 1.3", "cases met", draft_all),
    ("dropin.vllm_greedy", "compat.vllm v1 and MRv2 greedy, B in {1,4,16,64,256}, K=3, "
     "V=151936 bf16, uniform and ragged", "each <= chain_verify x 1.1 (same B)",
     "x chain_verify (worst)", vllm_greedy),
    ("dropin.vllm_sampled", "compat.vllm MRv2 sampled (temperature only), same shapes",
     "each <= sampled chain_verify x 1.1 (same B)", "x chain_verify (worst)", vllm_sampled),
    ("dropin.sglang_sampled", "compat.sglang sampled verify, B in {1,8,64}, N=4, "
     "V=151936 bf16, T=0.7, with and without top_k=20/top_p=0.95",
     "each <= chain_verify x 1.1 (same inputs and controls)", "x chain_verify (worst)",
     sglang_sampled),
    ("verify.greedy_b1", "chain_verify greedy B=1 K=3 V=151936 bf16",
     "<= 2.5 us (back to back <= 2.0 us)", "us", greedy_b1),
    ("verify.sampled_b1", "chain_verify sampled B=1 K=3 V=151936 bf16", "<= 3.5 us", "us",
     sampled_b1),
    ("verify.greedy_bw", "chain_verify greedy K=4, B >= 64", ">= 90% copy BW",
     "% copy BW (worst)", greedy_bw),
    ("verify.vs_torch", "chain_verify greedy: shapes slower than torch graph", "none",
     "shapes", verify_vs_torch),
    ("argmax.vs_torch", "argmax: shapes slower than torch graph", "none", "shapes",
     argmax_vs_torch),
    ("verify.sampled_cost", "chain_verify sampled / greedy, B=64 K=4", "<= 2.5x",
     "x (worst)", sampled_cost),
    ("verify.controls_topk_topp", "chain_verify top_k=20 top_p=0.95, K=3 V=151936 bf16",
     "B=1 <= 11, B=8 <= 25, B=64 <= 130 us", "x of the limit (worst)", controls_topk_topp),
    ("verify.controls_topp", "chain_verify top_p=0.9, K=3 V=151936 bf16",
     "B=1 <= 16, B=8 <= 35, B=64 <= 200 us", "x of the limit (worst)", controls_topp),
    ("verify.controls_minp", "chain_verify min_p=0.05 / temperature only, K=3 V=151936",
     "<= 1.3x at each B", "x (worst)", controls_minp),
    ("verify.controls_off", "chain_verify controls all off / temperature only",
     "<= 1.05x at each B", "x (worst)", controls_off),
    ("draft_tail.b1", "draft_tail B=1 Vd=32000 H=4096", "<= 2.0 us", "us", draft_tail_b1),
    ("draft_tail.b256_bw", "draft_tail B=256 Vd=151936 (hidden counted read once)",
     ">= 85% copy BW", "% copy BW (worst)", draft_tail_bw),
    ("relay.b1", "relay scatter and gather B=1 H=7168", "<= 1.5 us", "us (worst)",
     relay_b1),
    ("relay.b256_bw", "relay scatter and gather B=256", ">= 70% copy BW",
     "% copy BW (worst)", relay_bw),
    ("verify_metadata.b1", "verify_metadata B=1 context 160K page 64", "<= 3.0 us", "us",
     verify_metadata_b1),
    ("copy_inputs.small", "copy_inputs, up to 8 pairs of up to 4 KB", "<= 1.5 us",
     "us (worst)", copy_inputs_small),
    ("tune.wall", "make tune, the default key set, fresh", "<= 480 s", "s", tune_wall),
    ("tune.coverage", "make tune: trials per key", "every key >= half its admitted grid",
     "% of grid (least)", tune_coverage),
    ("tune.quality", "tuner search vs exhaustive optimum",
     ">= 90% of >= 12 keys within 3%", "% of keys", tune_quality),
    ("tune.never_slower", "tuned config vs heuristic config, every suite",
     "no case more than 2% slower", "cases slower", never_slower),
    ("tune.geomean", "tuned / heuristic speedup, argmax and chain_verify",
     ">= 1.03x geomean in each", "x (least)", tune_geomean),
    ("e2e.gpu_bound", "example decode loop (one CUDA graph a step), recipes: GPU busy over "
     "the step's wall time, B in {1,4,16,64}", ">= 90% at every B", "% (least)",
     e2e_gpu_bound),
    ("e2e.pieces", "example decode loop: the recipes' pieces' GPU time a step over the "
     "torch pieces'", "<= 1/3 at every B", "x (worst)", e2e_pieces),
    ("e2e.tps", "example decode loop: recipes tokens/s over torch's",
     "above at every B by more than the spread of two runs", "% (least gain)", e2e_tps),
]


def compute(root: Path, ceiling_Bps: float | None = None) -> list[dict]:
    """Every target against the files of `root`; a missing or unusable input gives
    met=None and the reason, never an exception."""
    inp = Inputs(root, ceiling_Bps)
    out = []
    for tid, what, target, unit, fn in TARGETS:
        row = {"id": tid, "what": what, "target": target, "measured": None, "unit": unit,
               "met": None}
        try:
            measured, met, detail = fn(inp)
            row.update(measured=None if measured is None else round(float(measured), 4),
                       met=None if measured is None else bool(met), detail=detail)
            if measured is None:
                row["reason"] = detail
        except Missing as exc:
            row["reason"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - an odd file is a reason, not a crash
            row["reason"] = f"could not evaluate: {type(exc).__name__}: {exc}"
        out.append(row)
    return out


INPUTS = ("tune-report.json", "tuner-quality.json", "spec-decode.json",
          "sglang-reference.json")


def input_headers(root: Path) -> list[dict]:
    """The header (`autotune.provenance`) of every input file present in `root`, each
    with "files": BENCH.json, the bench's suite files grouped by the run that measured
    them, then `INPUTS`."""
    root = Path(root)
    bench = read_json(root / "BENCH.json")
    out = [{"files": ["BENCH.json"], **of(bench)}] if bench is not None else []
    runs: dict = {}
    for p in sorted(root.glob("bench-*.json")):
        h = suite_header(read_json(p) or {}, bench or {})
        runs.setdefault(json.dumps(h, sort_keys=True), {"files": [], **h})["files"].append(
            p.name)
    out += list(runs.values())
    return out + [{"files": [name], **of(read_json(root / name))} for name in INPUTS
                  if (root / name).is_file()]


def report_header(root: Path, argv: list[str]) -> dict:
    """targets.json's header: the GPU and versions of the bench run it reads (BENCH.json;
    null without one), this run's date and command."""
    bench = of(read_json(Path(root) / "BENCH.json"))
    return {**{k: bench.get(k) for k in FIELDS if k not in ("date", "command")},
            "date": now(), "command": command_line("python -m autotune.targets", argv)}


def markdown(doc: dict, root: Path, inp_bench: dict, ceiling_Bps: float | None) -> str:
    """TARGETS.md of targets.json's `doc` (its header, inputs and rows)."""
    rows = doc["rows"]
    shown = relative(root, Path.cwd())
    cb = ceiling_Bps or inp_bench.get("copy_bandwidth_Bps")
    met = sum(1 for r in rows if r["met"] is True)
    unknown = sum(1 for r in rows if r["met"] is None)
    lines = [f"# Speed targets: {doc.get('gpu') or Path(root).name}", "",
             f"{line(doc)} (`make targets` runs it). The GPU and versions are the bench "
             f"run's; the same rows as JSON in `{shown}/targets.json`.", "",
             f"Inputs, under `{shown}/`:", ""]
    lines += [f"- {', '.join(f'`{f}`' for f in h['files'])}: {line(h)}"
              for h in doc.get("inputs") or []]
    lines += ["", "Targets of the issues against these files"
              + (f"; bandwidth fractions against a copy ceiling of {cb / 1e12:.3f} TB/s"
                 if cb else "")
              + ". Times: each call behind a plain kernel in a CUDA graph (the bench's "
              f"primary timing). {met} of {len(rows)} met, {unknown} not evaluated.", "",
              "| id | what | target | measured | met |", "|---|---|---|---|---|"]
    for r in rows:
        m = "" if r["measured"] is None else f"{r['measured']:g} {r['unit']}"
        note = r.get("detail") if r["met"] is not None else r.get("reason")
        cell = f"{m}: {note}" if m and note else (m or note or "")
        verdict = {True: "yes", False: "**no**", None: "?"}[r["met"]]
        lines.append(f"| {r['id']} | {r['what']} | {r['target']} | "
                     f"{cell.replace('|', '/')} | {verdict} |")
    return "\n".join(lines) + "\n"


def rows_of(doc) -> list[dict]:
    """The rows of a targets.json: {header..., "inputs", "rows"}, or the bare list of
    rows an older file holds."""
    return doc if isinstance(doc, list) else (doc or {}).get("rows") or []


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    root = Path(argv[0])
    ceiling = float(argv[1]) * 1e12 if len(argv) > 1 else None
    doc = {**report_header(root, argv), "inputs": input_headers(root),
           "rows": compute(root, ceiling)}
    if root.is_dir():
        write_json(root / "targets.json", doc)
    print(markdown(doc, root, read_json(root / "BENCH.json") or {}, ceiling), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
