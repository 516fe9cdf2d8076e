"""Stage pricing of the small-batch verify path: where the microseconds of chain_verify's
one launch go at B <= 16, and what the SGLang adapter adds on top.

    python tools/stages.py --out results/h200/stages.md     (about 2 minutes on an H200)
    python tools/stages.py --check      (stage outputs only; on the CPU under
                                         TRITON_INTERPRET=1)
    python tools/stages.py --shape 2x4 --configs tuned,heuristic \
        --stages split+finish,chain_verify   (a subset: shapes, configs, stages)

Regime: every call runs behind a plain one-element torch op (`tick.add_(1)`) in a CUDA
graph, as a step graph runs the verify behind the op before it, and its price is
time(op + call) - time(op): medians of graph replays (`timing.time_graph`: warm-up,
replays behind a GPU sleep), over input sets rotated as the benchmarks rotate them
(`timing.rotation`). Every price is measured twice (two passes over everything, so that
drift shows too); the report gives both, and the table printed last their mean and the
largest gap between the two passes.

Stages, each on the same grid as the config's chain_verify launch (B*N*SPLIT programs,
SPLIT after `split_plan`'s clamp), each a superset of the one before:
    empty         an empty Triton kernel (launch and graph node; also with 1 program)
    read          every program reads its chunk of the logits rows (a float sum, no
                  argmax) and stores one float
    split         the split argmax of `_argmax_core` (`chunk_argmax_packed`): every chunk
                  stores its packed max; no arrival counter, no finish
    split+finish  plus the per-request arrival counter (`publish_packed`) and the last
                  program's finish: the N slots read back to rest, N indices written
    release       split+finish with a release-only counter add and an acquiring slot
                  read (no acquire in the programs that are not last). A price, not a
                  protocol: the acquire is on the slots, not on the released counter
    spin          split+finish without a counter or fence: each program exchanges its
                  candidate into a slot of its own, the request's last program exchanges
                  them back until each has given one (only where the whole grid is
                  resident, from the compiled kernel's registers and shared memory)
    chain_verify  the recipe (out= given), i.e. plus the drafts and the accept logic
    adapter       recipes.compat.sglang.target_verify_topk1_postprocess (out= given):
                  the same launch with the SGLang layout written by the finish
    torch.argmax  torch.argmax over the B*N rows (out= given), once per shape
The read, split, split+finish, release and spin kernels are this script's own
experiments, each pricing a stage; every stage's outputs are checked against torch
before anything is timed.

Configs, per shape: the tuned table's entry for the exact key (read from the table file
and passed explicitly, whether or not dispatch would use that table now), the heuristic's,
and the heuristic's tiles with SPLIT set for 32 to 512 programs (where the space reaches).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch
import triton
import triton.language as tl

from autotune.timing import rotation, time_graph
from recipes import _common as C
from recipes import _configs as dispatch
from recipes._argmax_core import (
    PACKED_EMPTY,
    SPLIT_SPACE,
    chunk_argmax_packed,
    lane_vec,
    publish_packed,
    split_plan,
    unpack_index,
)
from recipes.compat import sglang as S

CV = importlib.import_module("recipes.chain_verify")
STAGES = ("empty", "read", "split", "split+finish", "release", "spin", "chain_verify",
          "adapter")
PROGRAM_TARGETS = (32, 64, 128, 256, 512)


# --- the stage kernels ---------------------------------------------------------------------
@triton.jit
def empty_kernel(x_ptr, PDL: tl.constexpr):
    C.pdl_enter(PDL)


@triton.jit
def chunk_of(pid, x_ptr, V, N, stride_b, stride_j, n_split, tiles_per,
              BLOCK_V: tl.constexpr):
    """(b, row b*N + j, lo, hi, row pointer) of program pid, as chain_verify cuts them."""
    per_req = N * n_split
    b = pid // per_req
    rem = pid - b * per_req
    j = rem // n_split
    lo = (rem - j * n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    row_ptr = x_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_j
    return b, b.to(tl.int64) * N + j, lo, hi, row_ptr


READ, SPLIT, FINISH, SPIN, RELEASE = 0, 1, 2, 3, 4   # the stages of `_stage_kernel`


@triton.jit
def _spin_finish(packed, pid, b, out_ptr, acc_ptr, N, n_split, NP: tl.constexpr,
                 SP: tl.constexpr):
    """SPIN: no counter. Every program of a request but its last exchanges its packed
    candidate into its own slot; the last exchanges those slots back to rest until each
    has given one, folds them per row and writes the N indices. Needs every program of
    the request resident, or earlier in dispatch order than the last."""
    per_req = N * n_split
    p = pid - b * per_req
    slots = acc_ptr + b.to(tl.int64) * per_req
    if p < per_req - 1:
        tl.atomic_xchg(slots + p, packed, sem="relaxed")
    else:
        lanes = tl.arange(0, SP)
        got = lanes >= per_req - 1
        vals = tl.where(lanes == per_req - 1, packed, PACKED_EMPTY)
        while tl.min(got.to(tl.int32), 0) == 0:
            v = tl.atomic_xchg(slots + lanes, PACKED_EMPTY, mask=~got, sem="relaxed")
            new = (v != PACKED_EMPTY) & ~got
            vals = tl.where(new, v, vals)
            got = got | new
        jj = tl.arange(0, NP)
        mine = (lanes[None, :] // n_split) == jj[:, None]
        best = tl.max(tl.where(mine, vals[None, :], PACKED_EMPTY), 1)
        tl.store(out_ptr + b.to(tl.int64) * N + jj, unpack_index(best), mask=jj < N)


@triton.jit
def _stage_kernel(x_ptr, out_ptr, acc_ptr, cnt_ptr, V, N, stride_b, stride_j, n_split,
                  tiles_per, BLOCK_V: tl.constexpr, UNROLL: tl.constexpr, VEC: tl.constexpr,
                  NP: tl.constexpr, STAGE: tl.constexpr, PDL: tl.constexpr,
                  SP: tl.constexpr = 1):
    """READ: a float sum of the chunk, stored per program (out float32 [programs]);
    SPLIT: the chunk's packed argmax, stored per program (out int64 [programs]);
    FINISH: published to its row's slot, and the request's last program writes the N
    indices (out int32 [B*N]) and puts slots and counter back to rest; RELEASE: the
    same with a release-only counter add; SPIN: `_spin_finish` (no counter)."""
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    b, row, lo, hi, row_ptr = chunk_of(pid, x_ptr, V, N, stride_b, stride_j, n_split,
                                        tiles_per, BLOCK_V)
    if STAGE == 0:                      # READ
        lanes = tl.arange(0, BLOCK_V)
        acc = tl.zeros([BLOCK_V], tl.float32)
        for t in range(0, tiles_per, UNROLL):
            for u in tl.static_range(UNROLL):
                o = lo + (t + u) * BLOCK_V + lanes
                acc += tl.load(row_ptr + o, mask=o < hi, other=0.0).to(tl.float32)
        C.pdl_release(PDL)
        tl.store(out_ptr + pid, tl.sum(acc, 0))
    else:
        packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
        C.pdl_release(PDL)
        if STAGE == 1:                  # SPLIT
            tl.store(out_ptr + pid, packed)
        elif STAGE == 3:                # SPIN
            _spin_finish(packed, pid, b, out_ptr, acc_ptr, N, n_split, NP, SP)
        elif STAGE == 4:                # RELEASE
            tl.atomic_max(acc_ptr + row, packed, sem="relaxed")
            arrived = tl.atomic_add(cnt_ptr + b, 1, sem="release")
            finish_rows(arrived, b, out_ptr, acc_ptr, cnt_ptr, N, n_split, NP, "acquire")
        else:                           # FINISH
            arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + b)
            finish_rows(arrived, b, out_ptr, acc_ptr, cnt_ptr, N, n_split, NP, "relaxed")


@triton.jit
def finish_rows(arrived, b, out_ptr, acc_ptr, cnt_ptr, N, n_split, NP: tl.constexpr,
                 SEM: tl.constexpr):
    """The request's last arrival: exchange its N slots back to rest (with `SEM`), write
    the N indices and put the counter back to rest."""
    if arrived == N * n_split - 1:
        jj = tl.arange(0, NP)
        rows = b.to(tl.int64) * N + jj
        got = tl.atomic_xchg(acc_ptr + rows, tl.full([NP], PACKED_EMPTY, tl.int64),
                             sem=SEM, mask=jj < N)
        tl.store(out_ptr + rows, unpack_index(got), mask=jj < N)
        tl.store(cnt_ptr + b, 0)


# --- one shape's inputs and calls ------------------------------------------------------------
def programs_per_sm(kernel, num_warps: int, device) -> int:
    """Programs of a compiled kernel one SM holds at once: threads, registers (allocated
    per warp in units of 256), shared memory and the 32-block limit."""
    kernel._init_handles()              # loads the binary; sets n_regs
    props = torch.cuda.get_device_properties(device)
    threads = 32 * num_warps
    regs_warp = -(-max(1, kernel.n_regs) * 32 // 256) * 256
    by_regs = props.regs_per_multiprocessor // (regs_warp * num_warps)
    by_threads = props.max_threads_per_multi_processor // threads
    smem = kernel.metadata.shared
    by_smem = (props.shared_memory_per_multiprocessor // smem) if smem else 32
    return max(0, min(32, by_regs, by_threads, by_smem))


class Shape:
    """Input sets of one (B, N, V, dtype) and the calls of every stage on them."""

    def __init__(self, B, N, V, dtype, device, sets=None):
        made = self._setup(B, N, V, dtype, device, False, sets)
        rows = B * N
        self.ridx = torch.arange(rows, device=device).view(B, N)
        self.rnext = (torch.arange(1, N + 1, device=device).repeat(B, 1)
                      .masked_fill_(torch.arange(N, device=device) == N - 1, -1))
        self.seq = torch.arange(100, 100 + B, device=device)
        self.sums = torch.empty(self.slots.numel(), dtype=torch.float32, device=device)
        self.amax = torch.empty(rows, dtype=torch.int64, device=device)
        self.states = []
        for x, d, _ in made:
            t = torch.argmax(x, dim=-1).view(B, N)
            self.states.append({"x": x, "d": d, "cand": torch.cat([t[:, :1], d], dim=1)})
        s0 = self.states[0]
        self.vout = CV.VerifyResult(*[torch.empty_like(t) for t in CV.reference(s0["x"],
                                                                             s0["d"])])
        self.aout = S.target_verify_topk1_postprocess(
            s0["x"], s0["cand"], self.ridx, self.rnext, self.seq,
            config=CV.heuristic(self.key, device))

    def _setup(self, B, N, V, dtype, device, sampled: bool, sets):
        """What every stage shape holds (its key, the op's tensor, the stage kernels'
        token and per-program outputs); returns `sets` input sets of
        `autotune.suites.chain_verify.make_inputs` (default: the bench's rotation)."""
        self.B, self.N, self.V, self.dtype, self.device = B, N, V, dtype, device
        self.only = None                  # the stages to time (None: every one)
        self.key = CV.tune_key(dtype, V, B, N - 1, sampled=sampled)
        if sets is None:
            sets = rotation(B * N * V * dtype.itemsize, device)
        rows = B * N
        self.tick = torch.zeros(1, device=device)
        self.tokens = torch.empty(rows, dtype=torch.int32, device=device)
        # one slot a program of the largest grid
        self.slots = torch.empty(rows * max(SPLIT_SPACE["SPLIT"]), dtype=torch.int64,
                                 device=device)
        from autotune.suites.chain_verify import make_inputs
        return [make_inputs(self.key, device, seed=i) for i in range(sets)]

    def label(self) -> str:
        return f"B={self.B} N={self.N} V={self.V} {str(self.dtype).replace('torch.', '')}"

    def plan(self, cfg):
        """(programs, SPLIT after the clamp, tiles per program, PDL mode) of a config."""
        split, tiles_per = split_plan(self.V, cfg["BLOCK_V"], cfg["SPLIT"])
        grid = self.B * self.N * split
        return grid, split, tiles_per, C.pdl(self.device, grid)

    def calls(self, cfg) -> dict:
        """Stage name -> call(state) for one config."""
        grid, split, tiles_per, pdl = self.plan(cfg)
        N, V = self.N, self.V
        kw = dict(num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl > 0)
        tile = dict(BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"], PDL=pdl,
                    VEC=lane_vec(self.dtype.itemsize, cfg["BLOCK_V"], cfg["num_warps"]))

        def stage(which, out):
            sp = C.next_pow2(N * split) if which == SPIN else 1

            def call(s):
                x = s["x"]
                acc, cnt = C.WORKSPACE.get(self.device, self.B * N * split, self.B)
                _stage_kernel[(grid,)](x, out, acc, cnt, V, N, N * x.stride(0), x.stride(0),
                                       split, tiles_per, **tile, NP=C.next_pow2(N),
                                       STAGE=which, SP=sp, **kw)
            return call

        calls = {
            "empty": lambda s: empty_kernel[(grid,)](s["x"], PDL=pdl, **kw),
            "read": stage(READ, self.sums),
            "split": stage(SPLIT, self.slots),
            "split+finish": stage(FINISH, self.tokens),
            "release": stage(RELEASE, self.tokens),
            "spin": stage(SPIN, self.tokens),
            "chain_verify": lambda s: CV.chain_verify(s["x"], s["d"], out=self.vout,
                                                      config=cfg),
            "adapter": lambda s: S.target_verify_topk1_postprocess(
                s["x"], s["cand"], self.ridx, self.rnext, self.seq, out=self.aout,
                config=cfg),
        }
        if not self.resident(cfg):        # a spin on a program that cannot run would hang
            del calls["spin"]
        return calls

    def timed(self, stage: str) -> bool:
        """Whether `stage` is one of those asked for (`only`)."""
        return self.only is None or stage in self.only

    def timed_calls(self, cfg) -> dict:
        """`calls`, only the stages asked for."""
        return {k: v for k, v in self.calls(cfg).items() if self.timed(k)}

    def resident(self, cfg) -> bool:
        """Whether every program of the spin stage's grid can be resident at once (from
        the compiled kernel's registers and shared memory; always under the interpreter,
        which runs programs in order, the last one last)."""
        if self.device.type != "cuda":
            return True
        grid, split, tiles_per, pdl = self.plan(cfg)
        x = self.states[0]["x"]
        acc, cnt = C.WORKSPACE.get(self.device, self.B * self.N * split, self.B)
        k = _stage_kernel.warmup(x, self.tokens, acc, cnt, self.V, self.N, 1, 1, split,
                                 tiles_per, BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"],
                                 VEC=lane_vec(x.element_size(), cfg["BLOCK_V"],
                                              cfg["num_warps"]),
                                 PDL=pdl, NP=C.next_pow2(self.N), STAGE=SPIN,
                                 SP=C.next_pow2(self.N * split), num_warps=cfg["num_warps"],
                                 num_stages=1, grid=(grid,))
        return grid <= C.sm_count(self.device) * programs_per_sm(k, cfg["num_warps"],
                                                                  self.device)

    def configs(self) -> list[tuple[str, dict]]:
        return configs_for(self)

    def per_shape_calls(self) -> dict:
        pdl = C.pdl(self.device, 1)
        return {
            "empty (1 program)": lambda s: empty_kernel[(1,)](s["x"], PDL=pdl, num_warps=4,
                                                                launch_pdl=pdl > 0),
            "torch.argmax": lambda s: torch.argmax(s["x"], dim=-1, out=self.amax),
        }

    def check(self, cfg) -> None:
        """Every stage computes what it claims on the first input set (raises if not)."""
        s = self.states[0]
        grid, split, _, _ = self.plan(cfg)
        calls = self.calls(cfg)
        x = s["x"].float()
        want = torch.argmax(x, dim=-1)
        calls["read"](s)
        sums = self.sums[:grid].view(-1, split).sum(dim=1)
        if not torch.allclose(sums, x.sum(dim=-1), rtol=1e-3, atol=1e-2):
            raise AssertionError(f"read stage: row sums differ at {cfg}")
        calls["split"](s)
        packed = self.slots[:grid].view(-1, split).max(dim=1).values
        if not torch.equal(host_unpack(packed)[1], want):
            raise AssertionError(f"split stage: argmax differs at {cfg}")
        for name in ("split+finish", "release", "spin"):
            if name in calls and self.timed(name):
                self.tokens.fill_(-1)
                calls[name](s)
                if not torch.equal(self.tokens.long(), want):
                    raise AssertionError(f"{name} stage: argmax differs at {cfg}")
        ref = CV.reference(s["x"], s["d"])
        calls["chain_verify"](s)
        calls["adapter"](s)
        if not all(torch.equal(a, b) for a, b in zip(self.vout, ref, strict=True)):
            raise AssertionError(f"chain_verify differs from its reference at {cfg}")
        a = self.aout
        if not (torch.equal(a.predict, ref.tokens.clamp(min=0).flatten())
                and torch.equal(a.num_correct_drafts, ref.accept_len)
                and torch.equal(a.bonus_tokens, ref.bonus)
                and torch.equal(a.select_index, ref.select_index)):
            raise AssertionError(f"the adapter differs from chain_verify at {cfg}")
        check_at_rest(self, split, cfg)


def host_unpack(packed: torch.Tensor):
    """(float32 values, int64 indices) of packed int64 keys on the host: the inverse of
    `pack` (a NaN key gives NaN)."""
    key = (packed >> 32).to(torch.int32)
    bits = torch.where(key >= 0, key, (-key) | torch.iinfo(torch.int32).min)
    return bits.view(torch.float32), 0x7FFFFFFF - (packed & 0xFFFFFFFF)


def check_at_rest(shape, split: int, cfg: dict) -> None:
    """The stage-2 slots and counters a shape's launches used are back at rest."""
    acc, cnt = C.WORKSPACE.get(shape.device, shape.B * shape.N * split, shape.B)
    if not (bool((acc == C.INT64_MIN).all()) and bool((cnt == 0).all())):
        raise AssertionError(f"the workspace is not at rest after {cfg}")


def configs_for(shape: Shape, targets=PROGRAM_TARGETS, tiles=(),
                admit=None) -> list[tuple[str, dict]]:
    """(label, config): the tuned entry of the shape's exact key, the heuristic's, the
    heuristic's tiles at SPLIT values for `targets` programs, and `tiles` ((label,
    overrides of the heuristic's config) at its SPLIT); one per launch (SPLITs that clamp
    alike are one), none that `admit(config)` refuses."""
    out = []
    heur = CV.heuristic(shape.key, shape.device)
    path = dispatch.find_table(dispatch.gpu_slug(shape.device), CV.NAME)
    if path is not None:
        out += [("tuned", {**heur, **e["config"]}) for e in dispatch.load_table(path)["entries"]
                if e["key"] == shape.key]
    out.append(("heuristic", heur))
    rows = shape.B * shape.N
    for target in targets:
        split = 1 << max(0, (target // rows).bit_length() - 1)   # a power of two
        if split in SPLIT_SPACE["SPLIT"]:
            out.append((f"SPLIT={split}", {**heur, "SPLIT": split}))
    out += [(label, {**heur, **over}) for label, over in tiles]
    seen, kept = set(), []
    for label, cfg in out:
        sig = (shape.plan(cfg)[:3], tuple(sorted((k, v) for k, v in cfg.items()
                                                 if k != "SPLIT")))
        if sig not in seen and (admit is None or admit(cfg)):
            seen.add(sig)
            kept.append((label, cfg))
    return kept


def cfg_str(cfg: dict) -> str:
    return f"{cfg['BLOCK_V']}/{cfg['SPLIT']}/{cfg['num_warps']}w/u{cfg['UNROLL']}"


# --- timing ------------------------------------------------------------------------------
def behind_op(shape: Shape, fn, reps: int) -> float:
    """Median us of one (op + fn) per call in a CUDA graph (fn None: the op alone)."""
    def body(s):
        shape.tick.add_(1)
        if fn is not None:
            fn(s)
    return time_graph(body, shape.states, reps=reps, device=shape.device).p50


def measure(shapes, reps: int, log=print, keep=None) -> dict:
    """{shape label: {"op": [us, us], "per_shape": {stage: [us, us]}, "configs":
    [(label, cfg, programs, {stage: [us, us]})]}}: prices (op already subtracted), one
    per pass, each logged as it is measured. keep: the config labels to price (None:
    every one of `configs_for`)."""
    res = {}
    for shape in shapes:
        cfgs = [(label, cfg) for label, cfg in shape.configs()
                if keep is None or label in keep]
        for _, cfg in cfgs:        # (also compiles every kernel before any timing)
            shape.check(cfg)
        res[shape.label()] = {"op": [], "per_shape": {}, "configs": [
            (label, cfg, shape.plan(cfg)[0], {st: [] for st in shape.timed_calls(cfg)})
            for label, cfg in cfgs]}
    for rep in range(2):
        for shape in shapes:
            r = res[shape.label()]
            t0 = time.perf_counter()
            op = behind_op(shape, None, reps)
            r["op"].append(op)
            for name, fn in shape.per_shape_calls().items():
                r["per_shape"].setdefault(name, []).append(behind_op(shape, fn, reps) - op)
            for _, cfg, _, prices in r["configs"]:
                for name, fn in shape.timed_calls(cfg).items():
                    prices[name].append(behind_op(shape, fn, reps) - op)
            log(f"pass {rep + 1}: {shape.label()} in {time.perf_counter() - t0:.1f} s "
                f"(op alone {op:.2f} us)")
            for label, cfg, _, prices in r["configs"]:
                log(f"  {label} {cfg_str(cfg)}: " + ", ".join(
                    f"{k} {v[-1]:.2f}" for k, v in prices.items()))
    return res


# --- report ------------------------------------------------------------------------------
def two(v) -> str:
    return " / ".join(f"{x:.2f}" for x in v)


def render_md(res: dict, header: list[str], title: str, doc: str, stages) -> str:
    """The markdown report: `title`, the header, paragraphs 3-5 of `doc` (the regime, the
    stages, what is checked), then one table a shape (`stages` as columns)."""
    about = doc.split("\n\n")[2:]
    lines = [f"# {title}", "", *header, "",
             about[0].replace("\n", " "), "", "```", *about[1].splitlines(), "```", "",
             about[2].replace("\n", " "), "",
             "Prices in microseconds, time(op + call) - time(op), pass 1 / pass 2. Config: "
             "BLOCK_V/SPLIT/num_warps/UNROLL (SPLIT as asked; programs after the clamp).", ""]
    for label, r in res.items():
        lines += [f"## {label}", "", f"op alone: {two(r['op'])} us; "
                  + "; ".join(f"{k}: {two(v)} us" for k, v in r["per_shape"].items()), ""]
        lines.append("| config | | programs | " + " | ".join(stages) + " |")
        lines.append("|---|---|---:|" + "---:|" * len(stages))
        for name, cfg, progs, prices in r["configs"]:
            lines.append(f"| {name} | {cfg_str(cfg)} | {progs} | "
                         + " | ".join(two(prices[s]) if s in prices else "-"
                                      for s in stages) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def short_table(res: dict, cols, heads) -> str:
    """One line per (shape, config): the mean of the two passes per stage (`cols`, headed
    `heads`); the noise line gives the largest gap between passes."""
    out = []
    gap = 0.0
    for label, r in res.items():
        ps = "  ".join(f"{k} {sum(v) / 2:.2f}" for k, v in r["per_shape"].items())
        out.append(f"{label}: op {sum(r['op']) / 2:.2f} us; {ps}")
        out.append(f"  {'config':<24}{'progs':>6}" + "".join(f"{h:>9}" for h in heads))
        for name, cfg, progs, prices in r["configs"]:
            out.append(f"  {name[:10]:<10} {cfg_str(cfg):<13}{progs:>6}"
                       + "".join(f"{sum(prices[c]) / 2:>9.2f}" if c in prices
                                 else f"{'-':>9}" for c in cols))
            gap = max([gap] + [abs(v[0] - v[1]) for v in prices.values()])
        for v in r["per_shape"].values():
            gap = max(gap, abs(v[0] - v[1]))
    out.append(f"(us behind a one-element torch op, mean of 2 passes; largest gap between "
               f"passes {gap:.2f} us)")
    return "\n".join(out)


def parse_shape(text: str):
    try:
        b, n = (int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape: expected BxN (e.g. 1x4), got {text!r}") from None
    return b, n


def cli(argv, *, prog: str, doc: str, title: str, make_shape, stages, heads,
        default_shapes) -> int:
    """The command line of a stage pricing (this module's and `tools.sampled_stages`):
    `make_shape(B, N, V, dtype, device, sets=None)` gives a shape with `configs`, `check`,
    `calls` and `per_shape_calls`; `stages` are its stage names."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--out", default=None, help="markdown report (e.g. results/h200/...md)")
    p.add_argument("--shape", action="append", type=parse_shape, default=[], metavar="BxN",
                   help="batch x tokens per request (default: "
                        + ", ".join(f"{b}x{n}" for b, n in default_shapes) + ")")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--reps", type=int, default=40, help="graph replays per median")
    p.add_argument("--check", action="store_true",
                   help="only check every stage's outputs (small shapes; runs under the "
                        "Triton interpreter too)")
    p.add_argument("--stages", default=None, metavar="NAMES",
                   help=f"comma-separated stages to time (default: all of {', '.join(stages)})")
    p.add_argument("--configs", default=None, metavar="LABELS",
                   help="comma-separated configs to time, by label (default: all)")
    a = p.parse_args(argv)
    only = None if a.stages is None else a.stages.split(",")
    if only is not None and not set(only) <= set(stages):
        p.error(f"--stages: expected names among {', '.join(stages)}, got {a.stages!r}")
    dtype = getattr(torch, a.dtype)
    if a.check:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for B, N, V in ((1, 4, 5000), (3, 2, 3000)):
            shape = make_shape(B, N, V, dtype, dev, sets=1)
            for label, cfg in shape.configs():
                shape.check(cfg)
                print(f"ok: {shape.label()} {label} {cfg_str(cfg)}")
        return 0
    if not torch.cuda.is_available():
        print(f"{prog}: timing needs a CUDA GPU (use --check on the CPU)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    shapes = [make_shape(B, N, a.vocab, dtype, dev) for B, N in (a.shape or default_shapes)]
    for shape in shapes:
        shape.only = only
    res = measure(shapes, a.reps, keep=None if a.configs is None else a.configs.split(","))
    header = [f"GPU: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, triton "
              f"{triton.__version__}, Python {platform.python_version()}; "
              f"{datetime.datetime.now().isoformat(timespec='seconds')}; "
              f"{time.perf_counter() - t0:.0f} s",
              f"Command: `{prog} {' '.join(sys.argv[1:] if argv is None else argv)}`"]
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(render_md(res, header, title, doc, stages))
        print(f"wrote {a.out}")
    print(short_table(res, cols=stages, heads=heads))
    return 0


def main(argv=None) -> int:
    return cli(argv, prog="python tools/stages.py", doc=__doc__,
               title="Stage pricing of chain_verify at small batches", make_shape=Shape,
               stages=STAGES, heads=("empty", "read", "split", "+finish", "release", "spin",
                                     "verify", "adapter"),
               default_shapes=((1, 4), (4, 4), (8, 4)))


if __name__ == "__main__":
    sys.exit(main())
