"""Quick GPU probe of argmax / chain_verify: a few configs at the target shapes.
Prints a table; used while developing (numbers go to NOTES.md by hand of the runner)."""

import importlib
import sys

import torch

import recipes
from autotune.timing import rotation, time_graph
from recipes import chain_verify as _cv  # noqa: F401

CV = importlib.import_module("recipes.chain_verify")
A = importlib.import_module("recipes.argmax")
dev = torch.device("cuda")
COPY = None


def copy_bw():
    x = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    t = time_graph(lambda s: torch.neg(x, out=y), [0], calls_per_replay=5, reps=20)
    return 2 * x.numel() * 4 / (t.p50 * 1e-6)


def bench_verify(B, K, V, dtype, cfgs):
    key = CV.tune_key(dtype, V, B, K)
    nb = CV._bytes(key)
    n = rotation(nb)
    states = []
    for i in range(n):
        x, d = CV.make_inputs(key, dev, i)
        states.append((x, d, CV.reference(x, d)))
    rows = []
    for name, cfg in cfgs:
        try:
            for x, d, want in states[:1]:
                got = recipes.chain_verify(x, d, config=cfg)
                ok = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            t = time_graph(lambda s, c=cfg: recipes.chain_verify(s[0], s[1], config=c), states,
                           reps=30)
            rows.append((f"verify B={B} K={K} V={V} {str(dtype)[6:]}", name, t.p50, nb / (t.p50 * 1e-6) / COPY, ok))
        except Exception as e:  # noqa
            rows.append((f"verify B={B} K={K} V={V}", name, float("nan"), 0, repr(e)[:80]))
    t = time_graph(lambda s: CV.reference(s[0], s[1]), states, reps=20)
    rows.append((f"verify B={B} K={K} V={V} {str(dtype)[6:]}", "torch graph", t.p50, nb / (t.p50 * 1e-6) / COPY, True))
    return rows


if __name__ == "__main__":
    COPY = copy_bw()
    print(f"copy bandwidth {COPY/1e12:.3f} TB/s")
    out = []
    def cf(b, s, w, st=1, u=1):
        return (f"B{b} s{s} w{w} st{st} u{u}",
                {"BLOCK_V": b, "SPLIT": s, "num_warps": w, "num_stages": st, "UNROLL": u})
    plans = {
        (1, 3): [("heuristic", None)] + [cf(b, s, w, 1, u) for b in (1024, 2048, 4096)
                                         for s in (16, 32, 64, 128) for w in (4, 8)
                                         for u in (1, 2)],
        (64, 4): [("heuristic", None)] + [cf(b, s, w, st, u) for b in (2048, 4096)
                                          for s in (1, 2, 4) for w in (4, 8, 16)
                                          for st in (1, 3) for u in (1, 2) if b >= 128 * w],
        (256, 7): [("heuristic", None)] + [cf(b, s, w, st, u) for b in (2048, 4096)
                                           for s in (1, 2) for w in (8, 16)
                                           for st in (1, 3) for u in (1, 2)],
    }
    for (B, K), cfgs in plans.items():
        rows = bench_verify(B, K, 151936, torch.bfloat16, cfgs)
        rows.sort(key=lambda r: r[2])
        out += rows[:8] + [r for r in rows if r[1] in ("heuristic", "torch graph")]
    with open(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", "w") as f:
        for r in out:
            line = f"{r[0]:<36} {r[1]:<24} {r[2]:8.2f} us  bw {r[3]:.3f}  ok={r[4]}"
            print(line)
            f.write(line + "\n")
