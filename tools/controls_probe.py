"""Times chain_verify with the sampling controls at the issue's target shapes (H200:
K=3, V=151936 bf16, T=0.7), behind a plain kernel in a CUDA graph (autotune.timing),
against the temperature-only call on the same inputs. Prints a markdown table at the
end, and each time to stderr as it is measured (a run cut short keeps what it timed).
Each (batch, set of controls passed) is first called once in its own process (`--jobs`,
default 8), on the dispatched and on the heuristic config, so that the kernels compile
in parallel into Triton's disk cache (cold, a controls binary takes tens of seconds);
a bench run after it on the same cache finds them built."""
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch

import recipes
from autotune.timing import plain_op, time_graph
from recipes import _configs as dispatch

CASES = {"temperature only": {}, "controls_topk_topp": {"top_k": 20, "top_p": 0.95},
         "topk50_topp": {"top_k": 50, "top_p": 0.95}, "controls_topp": {"top_p": 0.9},
         "controls_minp": {"min_p": 0.05},
         "controls_off": {"top_k": 0, "top_p": 1.0, "min_p": 0.0}}
K, V = 3, 151936


def call(s):
    return recipes.chain_verify(s["x"], s["d"], out=s["out"], **s["kw"])


def inputs(B: int, dev):
    g = torch.Generator(device=dev).manual_seed(B)
    x = torch.randn(B * (K + 1), V, generator=g, device=dev).to(torch.bfloat16)
    d = torch.argmax(x, 1).view(B, K + 1)[:, :K].contiguous()
    kw = {"temperature": torch.full((B,), 0.7, device=dev),
          "seeds": torch.randint(0, 2**40, (B,), generator=g, device=dev),
          "positions": torch.randint(0, 2**20, (B,), generator=g, device=dev)}
    return x, d, kw


def controls(name: str, B: int, dev):
    return {n: torch.full((B,), v, device=dev,
                          dtype=torch.int64 if n == "top_k" else torch.float32)
            for n, v in CASES[name].items()}


def warm(job, heuristic_too: bool = False):
    """One call on the dispatched config, so that its binary is in the disk cache; with
    `heuristic_too` one more on the heuristic's (the bench times both where a table's
    config differs)."""
    B, name = job
    dev = torch.device("cuda")
    x, d, kw = inputs(B, dev)
    c = controls(name, B, dev)
    recipes.chain_verify(x, d, **kw, **c)
    if heuristic_too:
        with dispatch.heuristic_only():
            recipes.chain_verify(x, d, **kw, **c)
    torch.cuda.synchronize()


def warm_for_bench(job):
    warm(job, heuristic_too=True)


def warm_jobs(batches) -> list:
    """One (B, case) per set of controls passed: cases that differ only in values (top_k
    20 and 50) share a binary."""
    seen = {}
    for B in batches:
        for name, c in CASES.items():
            seen.setdefault((B, tuple(sorted(c))), (B, name))
    return list(seen.values())


def main(batches=(1, 8, 64), jobs: int = 8):
    if jobs > 1:
        t0 = time.perf_counter()
        todo = warm_jobs(batches)
        with mp.get_context("spawn").Pool(jobs) as pool:
            pool.map(warm_for_bench, todo)
        print(f"warm-up: {len(todo)} calls in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    dev = torch.device("cuda")
    rows = ["| case | " + " | ".join(f"B={b} us" for b in batches) + " |",
            "|---|" + "---|" * len(batches)]
    res = {name: [] for name in CASES}
    for B in batches:
        x, d, kw = inputs(B, dev)
        out = recipes.chain_verify(x, d, **kw)
        for name in CASES:
            state = {"x": x, "d": d, "out": out, "kw": {**kw, **controls(name, B, dev)}}
            call(state)
            t = time_graph(call, [state], reps=20, behind=plain_op(dev))
            res[name].append(statistics.median(t.samples))
            print(f"B={B} {name}: {res[name][-1]:.2f} us", file=sys.stderr, flush=True)
    for name, ts in res.items():
        rows.append(f"| {name} | " + " | ".join(f"{t:.2f}" for t in ts) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    args = sys.argv[1:]
    jobs = 8
    if "--jobs" in args:
        i = args.index("--jobs")
        jobs = int(args[i + 1])
        del args[i:i + 2]
    main(tuple(int(b) for b in args) or (1, 8, 64), jobs)
