"""Read the committed benchmark JSON of a GPU and print the issues' speed targets
against the measured times, as a markdown table.

Usage: python tools/targets.py results/h200 [copy_TBps]   (or `make targets`)
copy_TBps: the copy-bandwidth ceiling for the bandwidth fractions (default: the one the
bench run measured and wrote into BENCH.json). Where the run measured a copy curve, each
bandwidth row also gives the time of a copy of the same bytes over ours ("same-size
copy": a plain copy of a few megabytes reaches half the asymptotic ceiling)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autotune.bench import copy_time_at, ours_time  # noqa: E402
from recipes.draft_tail import _bytes as draft_tail_bytes  # noqa: E402

root = Path(sys.argv[1])
ceiling = float(sys.argv[2]) * 1e12 if len(sys.argv) > 2 else None


def cases(suite):
    d = json.loads((root / f"bench-{suite}.json").read_text())
    return d["cases"]


ours = ours_time      # the statistic BENCH.md reports


def pick(suite, **label):
    return [c for c in cases(suite) if all(c["label"].get(k) == v for k, v in label.items())]


BENCH = json.loads((root / "BENCH.json").read_text())


def bw(c):
    cb = ceiling or BENCH["copy_bandwidth_Bps"]
    return c["bytes"] / (ours(c) * 1e-6) / cb


def bw_text(c):
    """'T us, X%' of the ceiling, and of a same-size copy where the run has the curve."""
    text = f"{ours(c):.1f} us, {100 * bw(c):.0f}%"
    t = copy_time_at(BENCH.get("copy_curve"), c["bytes"])
    return text + (f"; same-size copy {t:.1f} us: {100 * t / ours(c):.0f}%" if t else "")


rows = []
c = pick("chain_verify", dtype="bfloat16", B=1, K=3, V=151936)[0]
rows.append(("chain_verify greedy B=1 K=3 V=151936 bf16", "<= 2.0 us", f"{ours(c):.2f} us"))
for c in pick("chain_verify", K=4):
    if c["label"]["B"] >= 64:
        lab = c["label"]
        rows.append((f"chain_verify greedy B={lab['B']} K=4 V={lab['V']} {lab['dtype']}",
                     ">= 90% copy BW", bw_text(c)))
slow = [c for c in cases("chain_verify")
        if "torch graph" in c["timings"] and ours(c) > c["timings"]["torch graph"]["p50"]]
rows.append(("chain_verify greedy: shapes slower than torch graph", "none",
             ", ".join(f"B={c['label']['B']} K={c['label']['K']} V={c['label']['V']} "
                       f"{c['label']['dtype']} ({ours(c):.1f} vs "
                       f"{c['timings']['torch graph']['p50']:.1f} us)" for c in slow) or "none"))
for name, suite in (("argmax", "argmax"),):
    slow = [c for c in cases(suite) if ours(c) > c["timings"]["torch graph"]["p50"]]
    rows.append((f"{name}: shapes slower than torch graph", "none", str(len(slow))))
c = pick("chain_verify_sampled", dtype="bfloat16", B=1, K=3, V=151936)
if c:
    rows.append(("chain_verify sampled B=1 K=3 V=151936 bf16", "<= 3.0 us", f"{ours(c[0]):.2f} us"))
for c in pick("chain_verify_sampled", B=64, K=4):
    g = c["timings"].get("ours (greedy)", {}).get("p50")
    if g:
        rows.append((f"sampled/greedy B=64 K=4 V={c['label']['V']} {c['label']['dtype']}",
                     "<= 2.5x", f"{ours(c):.1f} / {g:.1f} us = {ours(c) / g:.2f}x"))
for c in pick("draft_tail", B=1, V=32000, H=4096):
    rows.append(("draft_tail B=1 Vd=32000 H=4096", "<= 2.0 us", f"{ours(c):.2f} us"))
for c in pick("draft_tail", B=256, V=151936):
    # the bench counts the hidden rows read and written; the issue counts the selected
    # logits rows and the hidden rows read once
    read_once = draft_tail_bytes(c["label"], hidden_passes=1)
    frac = read_once / (ours(c) * 1e-6) / (ceiling or BENCH["copy_bandwidth_Bps"])
    rows.append((f"draft_tail B=256 Vd=151936 H={c['label']['H']}", ">= 85% copy BW",
                 bw_text(c) + f"; the issue's count (hidden read once): {100 * frac:.0f}%"))
for c in cases("relay"):
    lab = c["label"]
    if lab.get("B") == 1 and lab.get("H") == 7168:
        rows.append((f"relay {lab.get('mode')} B=1 H=7168", "<= 1.5 us", f"{ours(c):.2f} us"))
    if lab.get("B") == 256:
        rows.append((f"relay {lab.get('mode')} B=256 H={lab.get('H')}", ">= 70% copy BW",
                     bw_text(c)))
for c in cases("verify_metadata"):
    lab = c["label"]
    if lab.get("B") == 1 and lab.get("context") == 163840 and lab.get("page_size") == 64:
        rows.append(("verify_metadata B=1 160K page 64", "<= 3.0 us", f"{ours(c):.2f} us"))
for c in cases("copy_inputs"):
    rows.append((f"copy_inputs {c['label']}", "<= 1.5 us (8 x <= 4 KB)", f"{ours(c):.2f} us"))
cb = (ceiling or BENCH["copy_bandwidth_Bps"]) / 1e12
print(f"# Speed targets: {BENCH['gpu']}\n\nMade by `make targets` "
      f"(`python tools/targets.py {' '.join(sys.argv[1:])}`).\n")
print(f"Targets of the issues against `{root}/bench-*.json` ({BENCH['gpu']}, torch "
      f"{BENCH['torch']}, triton {BENCH['triton']}, {BENCH['date']}); bandwidth fractions "
      f"against a copy ceiling of {cb:.3f} TB/s"
      + (", and against a copy of the same bytes (the run's copy curve)"
         if BENCH.get("copy_curve") else "") + ".\n")
print("| what | target | measured |\n|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} |")
