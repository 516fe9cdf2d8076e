"""Times chain_verify with the sampling controls at the issue's target shapes (H200:
K=3, V=151936 bf16, T=0.7), behind a plain kernel in a CUDA graph (autotune.timing),
against the temperature-only call on the same inputs. Prints a markdown table."""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch

import recipes
from autotune.timing import plain_op, time_graph

CASES = {"temperature only": {}, "controls_topk_topp": {"top_k": 20, "top_p": 0.95},
         "controls_topp": {"top_p": 0.9}, "controls_minp": {"min_p": 0.05},
         "controls_off": {"top_k": 0, "top_p": 1.0, "min_p": 0.0}}


def call(s):
    return recipes.chain_verify(s["x"], s["d"], out=s["out"], **s["kw"])


def main(batches=(1, 8, 64)):
    dev = torch.device("cuda")
    K, V = 3, 151936
    rows = ["| case | " + " | ".join(f"B={b} us" for b in batches) + " |",
            "|---|" + "---|" * len(batches)]
    res = {name: [] for name in CASES}
    for B in batches:
        g = torch.Generator(device=dev).manual_seed(B)
        x = torch.randn(B * (K + 1), V, generator=g, device=dev).to(torch.bfloat16)
        d = torch.argmax(x, 1).view(B, K + 1)[:, :K].contiguous()
        kw = {"temperature": torch.full((B,), 0.7, device=dev),
              "seeds": torch.randint(0, 2**40, (B,), generator=g, device=dev),
              "positions": torch.randint(0, 2**20, (B,), generator=g, device=dev)}
        out = recipes.chain_verify(x, d, **kw)
        for name, c in CASES.items():
            ck = {n: torch.full((B,), v, device=dev,
                                dtype=torch.int64 if n == "top_k" else torch.float32)
                  for n, v in c.items()}
            state = {"x": x, "d": d, "out": out, "kw": {**kw, **ck}}
            call(state)
            t = time_graph(call, [state], reps=20, behind=plain_op(dev))
            res[name].append(statistics.median(t.samples))
    for name, ts in res.items():
        rows.append(f"| {name} | " + " | ".join(f"{t:.2f}" for t in ts) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main(tuple(int(b) for b in sys.argv[1:]) or (1, 8, 64))
