"""The benchmark of examples/spec_decode.py: the step graph with the recipes vs the same
graph in plain torch -> results/<gpu>/spec-decode.md and spec-decode.json.

For each batch size B (K fixed), each loop runs `runs` timed decodes after a warm-up one
(alternating loops, so drift hits both): tokens/s = B x new tokens / the decode loop's
wall time (the host's reads every few steps included, the prefill excluded), ms a step,
mean acceptance length. Then torch.profiler over graph replays: the step graph's GPU busy
time (the union of its kernels' intervals, the side stream's overlap counted once) over
the step's wall time; and every piece of the step captured alone as a graph over the same
buffers and replayed, for its kernel time a step (the pieces of one kind summed: K
draft_tails, two verify_metadata builds). The model forwards are timed the same way.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from spec_decode import SpecDecoder, build, capture, random_prompts, target_generate

PIECE_ORDER = ("copy_inputs", "relay_gather", "verify_metadata", "draft_tail",
               "chain_verify", "relay_scatter")
MODEL_ORDER = ("draft forward + lm_head", "verify forward + lm_head")
GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def _trace(prof) -> list:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return json.loads(Path(path).read_text()).get("traceEvents", [])
    finally:
        os.unlink(path)


def _spans(events, lo=float("-inf"), hi=float("inf")):
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                  if e.get("ph") == "X" and e.get("cat") in GPU_EVENTS
                  and lo <= float(e["ts"]) < hi)


def gpu_time(fn, replays, device):
    """(busy, summed) GPU microseconds a call of fn over `replays` calls, from
    torch.profiler: busy is the union of the kernels' intervals, summed their total."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            fn()
        torch.cuda.synchronize(device)
    spans = _spans(_trace(prof))
    if not spans:
        raise RuntimeError("torch.profiler recorded no GPU kernels over the graph replays")
    total = sum(b - a for a, b in spans)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy / replays, total / replays


def gpu_times(fns, replays, device):
    """Summed GPU microseconds a call of each fn, in one profiler session: each fn's
    replays in a window of their own (a sync on either side), told apart by time."""
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, fn in enumerate(fns):
            with record_function(f"piece:{i}"):
                for _ in range(replays):
                    fn()
                torch.cuda.synchronize(device)
    events = _trace(prof)
    win = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("piece:"):
            win[int(e["name"].split(":")[1])] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    if len(win) != len(fns):
        raise RuntimeError(f"torch.profiler: {len(win)} of {len(fns)} piece windows found")
    out = []
    for i in range(len(fns)):
        spans = _spans(events, *win[i])
        if not spans:
            raise RuntimeError(f"torch.profiler recorded no GPU kernels in piece {i}")
        out.append(sum(b - a for a, b in spans) / replays)
    return out


def request_mix(n: int, mix: str) -> dict:
    """The sampling parameters of requests 0..n-1 as `SpecDecoder.generate` takes them:
    "greedy": none; "mixed": every other request (the odd ones) samples at T=0.7 with
    top_k=20 and top_p=0.95 (a chat default), each with its own seed."""
    if mix == "greedy":
        return {}
    odd = [i % 2 == 1 for i in range(n)]
    return dict(temperature=[0.7 if o else 0.0 for o in odd], seeds=[1000 + i for i in range(n)],
                top_k=[20 if o else 0 for o in odd], top_p=[0.95 if o else 1.0 for o in odd])


def mix_text(mix: str) -> str:
    return ("greedy requests" if mix == "greedy" else
            "greedy and sampled requests in one batch (every other request samples at "
            "T=0.7 with top_k=20, top_p=0.95)")


def profile_step(dec: SpecDecoder, B: int, replays: int, sampled: bool = False) -> dict:
    """The step graph's busy and kernel time, and each piece's kernel time a step."""
    st = dec.batch(B, sampled)
    busy, total = gpu_time(st.graph.replay, replays, dec.device)
    graphs = [(p.name, capture(p.run, dec.device)) for p in st.pieces]
    per = {}
    for name, t in zip((n for n, _ in graphs),
                       gpu_times([g.replay for _, g in graphs], replays, dec.device),
                       strict=True):
        per[name] = per.get(name, 0.0) + t
    return dict(busy_us=busy, kernel_us=total, pieces_us=per)


def _versions(device) -> dict:
    import transformers
    import triton
    return dict(gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else
                "CPU (Triton interpreter, tiny smoke model: not a measurement)",
                torch=torch.__version__, triton=triton.__version__,
                transformers=transformers.__version__,
                date=datetime.datetime.now(datetime.timezone.utc)
                .strftime("%Y-%m-%d %H:%M UTC"))


def _results_dir(device) -> Path:
    from recipes._configs import gpu_slug, results_root
    return results_root() / gpu_slug(device)


def _mean(xs):
    return sum(xs) / len(xs)


@torch.no_grad()
def run_bench(args, device) -> int:
    cuda = device.type == "cuda"
    size = "bench" if cuda and not args.tiny else "tiny"
    dtype = torch.bfloat16 if cuda else torch.float32
    hf, target, draft = build(size, dtype, device, args.seed, args.layers, args.arch)
    V, H = hf.config.vocab_size, hf.config.hidden_size
    N = args.new_tokens or (64 if cuda else 4)
    K = (args.K or [3])[0]
    batches = args.batch or ([1, 4, 16, 64] if cuda else [2])
    runs = max(1, args.runs)
    lengths = [32 + 24 * (i % 5) if cuda else 3 + i % 4 for i in range(max(batches))]
    prompts = random_prompts(V, lengths, args.seed)
    max_len = max(lengths) + N + 2 * K + 2
    replays = 20 if cuda else 0
    t0 = time.perf_counter()
    decs = {ops: SpecDecoder(target, draft, K, ops=ops, max_requests=max(batches),
                             max_len=max_len, page_size=16 if cuda else 4)
            for ops in ("recipes", "torch")}
    mix = request_mix(max(batches), args.mix)
    rows, same = [], []
    for B in batches:
        kw = {n: v[:B] for n, v in mix.items()}
        greedy = [i for i in range(B) if not kw or kw["temperature"][i] <= 0]
        got = {ops: [] for ops in decs}
        for dec in decs.values():
            dec.generate(prompts[:B], N, **kw)           # warm-up (and the capture)
        for _ in range(runs):
            for ops, dec in decs.items():
                got[ops].append(dec.generate(prompts[:B], N, **kw))
        a, b = (got[ops][0].tokens for ops in ("recipes", "torch"))
        same.append((B, all(a[i] == b[i] for i in greedy), len(greedy)))
        for ops, dec in decs.items():
            gens = got[ops]
            prof = profile_step(dec, B, replays, bool(kw)) if cuda else None
            ms = [1e3 * g.seconds / g.steps for g in gens]
            row = dict(B=B, K=K, loop=ops, tokens_per_s=[B * N / g.seconds for g in gens],
                       ms_per_step=ms, steps=[g.steps for g in gens],
                       accept_len=gens[0].mean_accepted + 1)
            if prof:
                row.update(busy_us=prof["busy_us"], kernel_us=prof["kernel_us"],
                           gpu_busy=[prof["busy_us"] / (1e3 * m) for m in ms],
                           pieces_us={k: prof["pieces_us"][k] for k in PIECE_ORDER},
                           model_us={k: prof["pieces_us"][k] for k in MODEL_ORDER},
                           commit_us=prof["pieces_us"]["commit"])
                row["pieces_total_us"] = sum(row["pieces_us"].values())
            rows.append(row)
    ref = [i for i in range(max(batches)) if not mix or mix["temperature"][i] <= 0][:4]
    want = target_generate(hf, [prompts[i] for i in ref], N)
    last = decs["recipes"].generate(prompts[:max(batches)], N, **mix).tokens
    vs_hf = [last[i] == w for i, w in zip(ref, want, strict=True)]
    seconds = time.perf_counter() - t0

    meta = dict(_versions(device), command=args.command, seconds=round(seconds),
                model=dict(arch=args.arch, vocab=V, hidden=H,
                           layers=hf.config.num_hidden_layers,
                           heads=hf.config.num_attention_heads,
                           kv_heads=hf.config.num_key_value_heads,
                           intermediate=hf.config.intermediate_size,
                           draft_layers=draft.n_layers, dtype=str(dtype).replace("torch.", "")),
                new_tokens=N, K=K, runs=runs, prompt_lengths=[min(lengths), max(lengths)],
                check_every=decs["recipes"].check_every, replays=replays,
                mix=mix_text(args.mix), same_tokens={str(B): s for B, s, _ in same},
                greedy_requests={str(B): n for B, _, n in same}, vs_generate=vs_hf)
    out = Path(args.out) if args.out else _results_dir(device) / "spec-decode.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta, rows=rows), indent=1) + "\n")
    text = report(meta, rows)
    out.write_text(text)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.json').name}")
    return 0 if all(s for _, s, _ in same) else 1


def _runs(xs, fmt):
    return " / ".join(format(x, fmt) for x in xs)


def report(meta, rows) -> str:
    m = meta["model"]
    timed = "gpu_busy" in rows[0]
    md = ["# Speculative decoding, the whole step one CUDA graph: recipes vs plain torch", "",
          f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, transformers "
          f"{meta['transformers']}, {meta['date']}", "", f"Made by `{meta['command']}` "
          f"({meta['seconds']} s).", "",
          f"Model: a compact {m['arch']} (examples/paged_llama.py) over the weights of a "
          f"random-init Hugging Face model: hidden {m['hidden']}, {m['layers']} layers, "
          f"{m['heads']} heads / {m['kv_heads']} KV heads, MLP {m['intermediate']}, "
          f"V={m['vocab']}, {m['dtype']}; the draft: its first {m['draft_layers']} layer(s) "
          "with its embedding, norm and lm_head (the deeper layers' output projections "
          "scaled down so that acceptance is partial). Paged KV cache, "
          f"{meta.get('mix', 'greedy requests')}, prompts of "
          f"{meta['prompt_lengths'][0]}-{meta['prompt_lengths'][1]} tokens, "
          f"{meta['new_tokens']} new tokens a request, K={meta['K']}. Each loop: "
          f"{meta['runs']} timed runs after a warm-up (the two values in a cell); the host "
          f"replays the step graph and reads the pool every {meta['check_every']} steps.",
          "", "tokens/s: B x new tokens over the decode loop's wall time (prefill excluded). "
          "ms/step: wall time / step replays. accept len: accepted drafts + the bonus, a "
          "request a step. GPU busy: the union of the step graph's kernel intervals "
          f"(torch.profiler, {meta['replays']} replays) over ms/step.", ""]
    head = ["B", "loop", "tokens/s", "ms/step", "accept len", "GPU busy"]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        md.append(f"| {r['B']} | {r['loop']} | {_runs(r['tokens_per_s'], '.0f')} | "
                  f"{_runs(r['ms_per_step'], '.3f')} | {r['accept_len']:.2f} | "
                  + (_runs([100 * b for b in r['gpu_busy']], '.1f') + "%" if timed else "-")
                  + " |")
    if timed:
        md += ["", "## GPU kernel time a step, piece by piece (us)", "",
               "Each piece captured alone as a graph over the step's buffers and replayed "
               f"{meta['replays']} times under torch.profiler; a kind's pieces summed "
               "(K draft_tails, two verify_metadata builds). recipes: the recipe; torch: "
               "its plain torch counterpart. The commit is the same torch code in both "
               "loops. share: the pieces' kernel time over the step graph's.", ""]
        head = ["B", "loop", *PIECE_ORDER, "pieces", "commit", *MODEL_ORDER, "step graph",
                "pieces' share"]
        md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            cells = [f"{r['pieces_us'][k]:.1f}" for k in PIECE_ORDER]
            cells += [f"**{r['pieces_total_us']:.1f}**", f"{r['commit_us']:.1f}"]
            cells += [f"{r['model_us'][k]:.1f}" for k in MODEL_ORDER]
            cells += [f"{r['kernel_us']:.1f}",
                      f"{100 * r['pieces_total_us'] / r['kernel_us']:.1f}%"]
            md.append(f"| {r['B']} | {r['loop']} | " + " | ".join(cells) + " |")
        md += ["", "## Recipes against torch", ""]
        by = {(r["B"], r["loop"]): r for r in rows}
        for B in sorted({r["B"] for r in rows}):
            a, b = by[(B, "recipes")], by[(B, "torch")]
            gain = _mean(a["tokens_per_s"]) - _mean(b["tokens_per_s"])
            noise = max(abs(x[0] - x[-1]) for x in (a["tokens_per_s"], b["tokens_per_s"]))
            pct = 100 * gain / _mean(b["tokens_per_s"])
            md.append(f"- B={B}: tokens/s {gain:+.0f} ({pct:+.1f}%; "
                      f"run-to-run spread {noise:.0f}); pieces {a['pieces_total_us']:.1f} us vs "
                      f"{b['pieces_total_us']:.1f} us a step "
                      f"({a['pieces_total_us'] / b['pieces_total_us']:.2f}x), "
                      f"{100 * a['pieces_total_us'] / a['kernel_us']:.1f}% vs "
                      f"{100 * b['pieces_total_us'] / b['kernel_us']:.1f}% of the step's "
                      "kernel time")
    md += ["", "## Lossless", ""]
    greedy = meta.get("greedy_requests", {})
    md += [f"- B={B}: the recipes and torch loops emit "
           + ("the same tokens" if s else "DIFFERENT tokens")
           + (f" on the {greedy[B]} greedy requests (sampled ones draw from other streams: "
              "equal in distribution)" if B in greedy and int(greedy[B]) < int(B) else "")
           for B, s in meta["same_tokens"].items()]
    n = len(meta["vs_generate"])
    eq = sum(meta["vs_generate"])
    md.append(f"- against the Hugging Face model's own `generate` ({m['dtype']}, one prompt "
              f"at a time), the recipes loop's first {n} greedy requests: {eq} of {n} equal "
              "(float32 is exact, `--check` and the tests; in bfloat16 a forward over K+1 "
              "positions may round a near tie the other way)")
    return "\n".join(md) + "\n"
