"""Stage pricing of chain_verify's sampled rows at small batches: where the microseconds
of a sampled verify go, next to the greedy verify of the same shape.

    python tools/sampled_stages.py --out results/h200/stages-sampled.md   (~3 min, H200)
    python tools/sampled_stages.py --check     (stage outputs only; on the CPU under
                                                TRITON_INTERPRET=1)

The regime, the two passes and the report are those of `tools.stages`: every call
behind a plain one-element torch op in a CUDA graph, priced as time(op + call) - time(op).

Stages, each on the grid of the config's sampled launch (B*N*SPLIT programs), each a
superset of the one before:
    empty      an empty Triton kernel (launch and graph node)
    bound      pass 1 of the filtered Gumbel scan alone: per id the upper-bound score
               (Philox, two MUFU.LG2, an FFMA), per lane its max; the largest lane max and
               its lane stored per program (one tile a step, no prefetch)
    filter     the whole filtered scan (`sampled_chunk_packed`): plus the top lane scored
               exactly (its ids loaded again, IEEE division, two accurate logs), the
               bound check of every other lane, the rare extra lanes; the packed exact
               answer stored per program
    +finish    plus the arrival counter and the last program's read-back of the N slots
               (`tools.stages.finish_rows`): the N sampled tokens written
    sampled    the recipe: chain_verify with temperature (out= given), i.e. plus the
               drafts, the per-request sampling inputs and the accept logic
    exact      the recipe with config EXACT=1: every id scored exactly (same outputs)
    greedy     the recipe without temperature on the same config: the greedy scan of
               the same grid
Per shape: the greedy recipe on its own dispatched config (the bar the sampled verify is
held to) and an empty one-program kernel. Every stage's outputs are checked against
torch before anything is timed.

Configs, per shape: the tuned table's entry for the sampled key, the heuristic's, its
tiles at SPLIT for 64 to 512 programs, and 1024-id tiles on 4 warps and 2048-id tiles on
8 warps at the heuristic's SPLIT.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch
import triton
import triton.language as tl

from recipes import _common as C
from recipes import _gumbel_core as GC
from recipes._argmax_core import pack, publish_packed
from tools import stages as S

CV = importlib.import_module("recipes.chain_verify")
STAGES = ("empty", "bound", "filter", "+finish", "sampled", "exact", "greedy")
PROGRAM_TARGETS = (64, 128, 256, 512)
TILES = (("1024/4w", {"BLOCK_V": 1024, "num_warps": 4, "UNROLL": 1}),
         ("2048/8w", {"BLOCK_V": 2048, "num_warps": 8, "UNROLL": 1}))
BOUND, FILTER, FINISH = 0, 1, 2         # the stages of `_sampled_stage_kernel`


# --- the stage kernels ---------------------------------------------------------------------
@triton.jit
def _bound_chunk(row_ptr, lo, hi, n_tiles, c, seed, ctr, BLOCK: tl.constexpr):
    """Pass 1 of `_gumbel_core`'s filtered scan over ids [lo, hi): the packed (largest
    lane max of the upper-bound score, its lane)."""
    G: tl.constexpr = BLOCK // 4
    lanes = GC.tile_lanes(G)
    b1 = tl.full([G, 4], float("-inf"), tl.float32)
    for t in range(0, n_tiles):
        base = lo + t * BLOCK
        x = tl.load(row_ptr + base + lanes, mask=base + lanes < hi,
                    other=float("-inf")).to(tl.float32)
        a = x * c - GC.approx_log2_w(GC.philox_tile(seed, ctr, base // 4, G))
        b1 = tl.maximum(b1, a, propagate_nan=tl.PropagateNan.ALL)
    return tl.max(pack(tl.reshape(b1, [BLOCK]), tl.reshape(lanes, [BLOCK])), 0)


@triton.jit
def _sampled_stage_kernel(x_ptr, out_ptr, acc_ptr, cnt_ptr, temp_ptr, seed_ptr, pos_ptr, V,
                          N, stride_b, stride_j, n_split, tiles_per, BLOCK_V: tl.constexpr,
                          PREFETCH: tl.constexpr, MAXC: tl.constexpr, NP: tl.constexpr,
                          STAGE: tl.constexpr, PDL: tl.constexpr):
    """BOUND: `_bound_chunk` per program (out int64 [programs]); FILTER: the filtered
    scan's packed answer per program (out int64 [programs]); FINISH: published to the
    row's slot, the request's last program writes the N tokens (out int32 [B*N]) and puts
    slots and counter back to rest. Every request samples (temperature > 0)."""
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    b, row, lo, hi, row_ptr = S.chunk_of(pid, x_ptr, V, N, stride_b, stride_j, n_split,
                                         tiles_per, BLOCK_V)
    T = tl.load(temp_ptr + b).to(tl.float32)
    seed = tl.load(seed_ptr + b).to(tl.int64)
    ctr = (tl.load(pos_ptr + b).to(tl.int64) + row - b.to(tl.int64) * N).to(tl.uint32)
    if STAGE == 0:                      # BOUND
        c = tl.math.div_rn(tl.full([], GC.LOG2E, tl.float32), T)
        packed = _bound_chunk(row_ptr, lo, hi, tiles_per, c, seed, ctr, BLOCK_V)
    else:
        packed = GC.sampled_chunk_packed(row_ptr, lo, hi, tiles_per, T, seed, ctr, BLOCK_V,
                                         0, MAXC, PREFETCH)
    C.pdl_release(PDL)
    if STAGE == 2:                      # FINISH
        arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + b)
        S.finish_rows(arrived, b, out_ptr, acc_ptr, cnt_ptr, N, n_split, NP, "relaxed")
    else:
        tl.store(out_ptr + pid, packed)


# --- one shape's inputs and calls ------------------------------------------------------------
class SampledShape(S.Shape):
    """Input sets of one sampled (B, N, V, dtype) and the calls of every stage on them.
    `_setup`, `plan`, `label`, `timed` and `timed_calls` are the greedy shape's."""

    def __init__(self, B, N, V, dtype, device, sets=None):
        self.states = [{"x": x, "d": d, "kw": kw}
                       for x, d, kw in self._setup(B, N, V, dtype, device, True, sets)]
        # what `check` compares against, on the first input set (the same for every config)
        s0 = self.states[0]
        self.ref = CV.reference(s0["x"], s0["d"], **s0["kw"])
        self.greedy_ref = CV.reference(s0["x"], s0["d"])
        self.want = CV.target_tokens(s0["x"], B, N - 1, **s0["kw"]).view(-1)
        self.a = None                     # `bounds` of the first input set, when needed
        self.vout = CV.VerifyResult(*[torch.empty_like(t) for t in self.ref])
        self.gout = CV.VerifyResult(*[torch.empty_like(t) for t in self.ref])

    def calls(self, cfg) -> dict:
        grid, split, tiles_per, pdl = self.plan(cfg)
        N, V = self.N, self.V
        kw = dict(num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl > 0)

        def stage(which, out):
            def call(s):
                x, sk = s["x"], s["kw"]
                acc, cnt = C.WORKSPACE.get(self.device, self.B * N * split, self.B)
                _sampled_stage_kernel[(grid,)](
                    x, out, acc, cnt, sk["temperature"], sk["seeds"], sk["positions"], V, N,
                    N * x.stride(0), x.stride(0), split, tiles_per, BLOCK_V=cfg["BLOCK_V"],
                    PREFETCH=cfg["UNROLL"] == 2, MAXC=CV.MAXC, NP=C.next_pow2(N),
                    STAGE=which, PDL=pdl, **kw)
            return call

        return {
            "empty": lambda s: S.empty_kernel[(grid,)](s["x"], PDL=pdl, **kw),
            "bound": stage(BOUND, self.slots),
            "filter": stage(FILTER, self.slots),
            "+finish": stage(FINISH, self.tokens),
            "sampled": lambda s: CV.chain_verify(s["x"], s["d"], out=self.vout, config=cfg,
                                                 **s["kw"]),
            "exact": lambda s: CV.chain_verify(s["x"], s["d"], out=self.vout,
                                               config={**cfg, "EXACT": 1}, **s["kw"]),
            "greedy": lambda s: CV.chain_verify(s["x"], s["d"], out=self.gout, config=cfg),
        }

    def configs(self) -> list[tuple[str, dict]]:
        """The tuned entry of the sampled key, the heuristic's, its tiles at SPLIT for
        64..512 programs, two other tiles at its SPLIT; only configs the tuner admits."""
        return S.configs_for(self, PROGRAM_TARGETS, TILES,
                             admit=lambda cfg: CV.constraint(cfg, self.key))

    def per_shape_calls(self) -> dict:
        pdl = C.pdl(self.device, 1)
        return {
            "empty (1 program)": lambda s: S.empty_kernel[(1,)](s["x"], PDL=pdl,
                                                                 num_warps=4,
                                                                 launch_pdl=pdl > 0),
            "greedy (dispatched)": lambda s: CV.chain_verify(s["x"], s["d"], out=self.gout),
        }

    def bounds(self, s) -> torch.Tensor:
        """The pass-1 value a of every id (float64 [B*N, V]; `_gumbel_core.approx_log2_w`
        with exact logs): what the bound stage's lane maxima approximate."""
        B, N, V = self.B, self.N, self.V
        kw = s["kw"]
        ctr = (kw["positions"].long()[:, None] + torch.arange(N, device=self.device)).view(-1)
        bits = GC.stream_bits(kw["seeds"].long().repeat_interleave(N), ctr, V)
        i = torch.where(bits >= 2**31, bits - 2**32, bits)
        scale = torch.tensor(GC.SCALE, dtype=torch.float32, device=self.device)
        ua = (i.to(torch.float32).abs() * scale).double()        # rounded as the kernel
        log2e = GC.LOG2E.value
        d = (1 - ua) * log2e
        w = torch.where(d < GC.SERIES_BELOW.value, d, -torch.log2(ua))
        c = log2e / kw["temperature"].double().repeat_interleave(N)[:, None]
        return s["x"].reshape(B * N, V).double() * c - torch.log2(w)

    def check(self, cfg) -> None:
        """Every stage computes what it claims on the first input set (raises if not)."""
        s = self.states[0]
        grid, split, tiles_per, _ = self.plan(cfg)
        calls = self.calls(cfg)
        calls["bound"](s)
        got = S.host_unpack(self.slots[:grid])[0].double().view(-1, split)
        span = tiles_per * cfg["BLOCK_V"]
        if self.a is None:
            self.a = self.bounds(s)
        a = torch.nn.functional.pad(self.a, (0, split * span - self.V), value=float("-inf"))
        chunk_max = a.view(-1, split, span).amax(dim=2)
        # within the bound's own slack (EABS = 2^-7 natural units; lg2.approx near u = 1)
        if not torch.allclose(got, chunk_max, rtol=1e-5, atol=2e-2):
            raise AssertionError(f"bound stage: lane maxima differ at {cfg}")
        calls["filter"](s)
        packed = self.slots[:grid].view(-1, split).max(dim=1).values
        if not torch.equal(S.host_unpack(packed)[1], self.want):
            raise AssertionError(f"filter stage: sampled tokens differ at {cfg}")
        self.tokens.fill_(-1)
        calls["+finish"](s)
        if not torch.equal(self.tokens.long(), self.want):
            raise AssertionError(f"+finish stage: sampled tokens differ at {cfg}")
        for name, ref, out in (("sampled", self.ref, self.vout), ("exact", self.ref, self.vout),
                               ("greedy", self.greedy_ref, self.gout)):
            calls[name](s)
            if not all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)):
                raise AssertionError(f"{name} differs from its reference at {cfg}")
        S.check_at_rest(self, split, cfg)


def main(argv=None) -> int:
    return S.cli(argv, prog="python tools/sampled_stages.py", doc=__doc__,
                 title="Stage pricing of chain_verify's sampled rows at small batches",
                 make_shape=SampledShape, stages=STAGES, heads=STAGES,
                 default_shapes=((1, 4), (4, 4), (8, 4)))


if __name__ == "__main__":
    sys.exit(main())
