"""draft_tail with Triton's own software pipelining of the scan (GPU only).

Session 4 left B=256 Vd=151936 at 24.8 us against issue 5's 22.2 us (85% of 4.24 TB/s),
with a read-only kernel of the same layout (a program a row, two 16-warp programs an
SM) at 21.6 us and one of 8 KB programs at 19.7 (results/h200/NOTES.md). The hand-made
pipeline of `chunk_scan` keeps one step (two 8 KB tiles) of a program in flight, in
registers. Hypothesis: the layout is short of bytes in flight; `tl.range(num_stages=S)`
turns the loads into cp.async copies to shared memory S - 1 tiles ahead (checked in the
sm_90 PTX), so a program can keep 3-5 tiles in flight without registers. Timed here
(CUDA-graph replay medians in us, outputs compared with the reference first):

1. read-only ceilings at B=256: 8 KB programs, and a program a row summing its row
   through the same staged loop;
2. draft_tail at B=256 over its space with SPLIT 1-2 and 4-16 warps, every num_stages;
   the best five again;
3. other shapes: the dispatched config (tuned table or heuristic), the same config
   staged (num_stages 2-6, UNROLL 1), and the best B=256 configs where admitted.
It runs against commit 6a42719, where draft_tail's space has num_stages 2-6 (the scan
through `chunk_scan_staged`); the next commit took them out again, with today's
space its part 2 times the hand-pipelined configs only.
Usage: python tools/probe_staged.py OUTFILE
"""
import importlib
import sys
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from autotune.precompile import Precompiler
from autotune.registry import tunables
from autotune.timing import rotation
from recipes import _common as C

DT = importlib.import_module("recipes.draft_tail")
STAGED_BYTES = 64 * 1024   # the most shared memory the staged tiles took (commit 6a42719)
from probe_layout import _readsum, run_recipe  # noqa: E402
from probe_tail import _clone, _states, rec, sayer, verified  # noqa: E402


@triton.jit
def _rowsum(x_ptr, rows_ptr, out_ptr, R, V, stride_x, n_tiles, BLOCK: tl.constexpr,
            STAGES: tl.constexpr):
    b = tl.program_id(0)
    r = tl.load(rows_ptr + b).to(tl.int64)
    r = tl.minimum(tl.maximum(r, 0), R - 1)
    row = x_ptr + r * stride_x
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for t in tl.range(0, n_tiles, num_stages=STAGES):
        o = t * BLOCK + lanes
        acc += tl.load(row + o, mask=o < V, other=0.0).to(tl.float32)
    tl.store(out_ptr + b, tl.sum(acc, 0))


def _tag(c):
    return (f"{c['BLOCK_V']:>5} split {c['SPLIT']:>3} U{c['UNROLL']} w{c['num_warps']:<2} "
            f"S{c['num_stages']} fuse {c['FUSE_H']} bh {c['BLOCK_H']}")


def _trial(say, res, cfg, sts, master, tag=None):
    fn = (lambda s, c=cfg: run_recipe(s, c))
    tag = tag or _tag(cfg)
    if not verified(say, tag, fn, master):
        return
    t = rec(fn, sts)[0]
    res.append((t, tag, cfg))
    say(f"{tag:<58} {t:7.2f}")


def _again(say, res, sts, nb, n=5):
    res.sort(key=lambda r: r[0])
    for _, tag, cfg in res[:n]:
        tt = rec(lambda s, c=cfg: run_recipe(s, c), sts, twice=True)
        say(f"best again: {tag:<48} {tt[0]:7.2f} {tt[1]:7.2f} "
            f"({nb / tt[0] / 1e6:.2f} TB/s, {nb / tt[0] / 4.24e6:.0%})")


def main(path):
    dev = torch.device("cuda")
    sms = C.sm_count(dev)
    say = sayer(path)
    say(f"# {torch.cuda.get_device_name(dev)} ({sms} SMs); torch {torch.__version__}, "
        f"triton {triton.__version__}; graph-replay medians in us")

    B, V, H = 256, 151936, 4096
    key = DT.tune_key(torch.bfloat16, V, B, H)
    nb = DT._bytes(key)
    nb1 = DT._bytes(key, hidden_passes=1)
    sts = _states(key, dev, rotation(nb))
    master = _clone(sts[0])
    say(f"## B={B} V={V} H={H} bf16: {nb / 1e6:.2f} MB (issue's count {nb1 / 1e6:.2f} MB: "
        f"85% of 4.24 TB/s is {nb1 / 4.24e6 / 0.85:.2f} us)")
    xs = [torch.randn(nb // 2, device=dev).to(torch.bfloat16) for _ in range(rotation(nb))]
    part = torch.empty(C.cdiv(nb // 2, 4096), device=dev)
    t = rec(lambda x: _readsum[(C.cdiv(nb // 2, 4096),)](x, part, nb // 2, BLOCK=4096,
                                                          num_warps=4), xs, twice=True)
    say(f"read-only, 8 KB a program, same bytes              {t[0]:7.2f} {t[1]:7.2f}")
    sums = torch.empty(B, device=dev)
    for bv, w in ((4096, 16), (4096, 8), (2048, 8), (8192, 16)):
        for S in (1, 2, 3, 4, 6):
            if (S - 1) * bv * 2 > STAGED_BYTES:
                continue
            try:
                t = rec(lambda s, bv=bv, w=w, S=S: _rowsum[(B,)](
                    s["logits"], s["rows"], sums, s["logits"].shape[0], V,
                    s["logits"].stride(0), C.cdiv(V, bv), BLOCK=bv, STAGES=S, num_warps=w,
                    num_stages=S), sts)
                say(f"read-only, a program a row {bv} w{w} S{S}{'':<14} {t[0]:7.2f}")
            except Exception as e:  # noqa: BLE001
                say(f"read-only {bv} w{w} S{S}: ERROR {type(e).__name__}: {str(e)[:120]}")

    say("dispatched (tuned table or heuristic):")
    res0 = []
    _trial(say, res0, None, sts, master, tag="dispatched")
    res = []
    tun = tunables()["draft_tail"]
    configs = [c for c in tun.configs(key)
               if c["SPLIT"] <= 2 and c["BLOCK_V"] >= 2048 and c["FUSE_H"]]
    say(f"{len(configs)} configs (SPLIT <= 2, BLOCK_V >= 2048, FUSE_H 1)")
    pre = Precompiler(12)
    pre.submit(SimpleNamespace(tunable=tun), sts[0], configs)
    for cfg in configs:
        _trial(say, res, cfg, sts, master)
    _again(say, res + res0, sts, nb1)
    best = [c for _, _, c in sorted(res, key=lambda r: r[0])[:4]]

    for B, V, H in ((256, 151936, 7168), (64, 151936, 4096), (16, 151936, 4096),
                    (8, 151936, 4096), (1, 32000, 4096)):
        key = DT.tune_key(torch.bfloat16, V, B, H)
        nb = DT._bytes(key, hidden_passes=1)
        sts = _states(key, dev, rotation(DT._bytes(key)))
        master = _clone(sts[0])
        say(f"## B={B} V={V} H={H}")
        res = []
        _trial(say, res, None, sts, master, tag="dispatched")
        base = DT.resolve_config(None, key, dev)
        cands = [{**base, "UNROLL": 1, "num_stages": S} for S in DT.SPACE["num_stages"]]
        if base["UNROLL"] > 1:
            cands.append({**base, "UNROLL": 2, "num_stages": 1})
        cands += [{**c} for c in best]
        seen = []
        for c in cands:
            fused = {**c, "FUSE_H": int(c["FUSE_H"] and DT._can_fuse(
                H, c["SPLIT"], c["num_warps"]))}
            if fused in seen or not DT.constraint(fused, key):
                continue
            seen.append(fused)
            _trial(say, res, fused, sts, master)
        _again(say, res, sts, nb, n=3)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-staged.txt")
