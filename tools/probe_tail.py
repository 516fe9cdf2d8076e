"""Where does draft_tail's time go, and which one-launch layout is fastest? (GPU only)

Issue 5 asks for B=1 Vd=32000 H=4096 in at most 2.0 us (graph-replayed; inputs rotated,
so at B=1 they sit in L2) and B=256 Vd=151936 at 85% of the copy bandwidth. Session 2
measured 3.19 us and 77%. This probe times, in CUDA-graph replays (each variant twice):

1. the recipe as it is (`draft_tail(config=...)`) over its configs, and at its best
   config without the map, the hidden rows, positions/draft_tokens, or all of them
   (what each extra costs);
2. `_v2`, a candidate kernel with three switches:
   * the hidden copy fused into the argmax programs (program s of a row copies slice s
     of its hidden row; the loads go out before the scan, the stores after it) instead
     of separate copy programs;
   * COMBINE: 0 = the recipe's stage 2 (relaxed max into a slot, acq_rel arrival
     counter, the last program exchanges the slot back); 1 = one slot per chunk (plain
     store, counter, the last program loads the row's slots at once); 2 = a tree of
     pairwise exchanges (a program exchanges its candidate into its pair's slot: EMPTY
     back means it came first and stops, a candidate back means it came second and goes
     up a level; no counter, no fence; the root's program finishes);
   * MAP_PRE (COMBINE 1, one tile a chunk): each program loads its chunk's token_map
     slice with the logits and stores its own winner's target id next to its candidate,
     so the last program needs no map load after the combine.
Every variant's outputs (tokens, probs, hidden, positions, draft_tokens) are compared
with the reference first; a variant that differs is reported, not timed.
Usage: python tools/probe_tail.py OUTFILE
"""
import sys

import torch
import triton
import triton.language as tl

from autotune.timing import rotation, time_graph
from recipes import _common as C
from recipes import draft_tail as DT_MOD  # noqa: F401  (registers the recipe)
from recipes._argmax_core import PACKED_EMPTY, chunk_argmax_packed, split_plan, unpack_index
from recipes.draft_tail import (
    SPACE,
    DraftTail,
    _bytes,
    constraint,
    draft_tail,
    make_inputs,
    reference,
    tune_key,
)


@triton.jit
def _v2(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
        acc_ptr, cnt_ptr, slot_ptr, mtok_ptr,
        R, V, stride_x, stride_map, stride_pos, stride_dt, dt_col, n_split, tiles_per,
        H, stride_h, h_slice,
        HAS_HIDDEN: tl.constexpr, ONE_CHUNK: tl.constexpr, COMBINE: tl.constexpr,
        MAP_PRE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
        UNROLL: tl.constexpr, SP: tl.constexpr, LEVELS: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // n_split
    s = pid % n_split
    first = s == 0
    pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos, mask=first, other=0)
    r = tl.load(rows_ptr + b).to(tl.int64)
    r = tl.minimum(tl.maximum(r, 0), R - 1)
    if HAS_HIDDEN:
        hl = tl.arange(0, BLOCK_H)
        hc = s * h_slice + hl
        hm = (hl < h_slice) & (hc < H)
        hv = tl.load(h_ptr + r * stride_h + hc, mask=hm)
    lo = s * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    if MAP_PRE:
        mo = lo + tl.arange(0, BLOCK_V)
        mv = tl.load(map_ptr + mo.to(tl.int64) * stride_map, mask=mo < hi, other=0)
    packed = chunk_argmax_packed(x_ptr + r * stride_x, lo, hi, tiles_per, BLOCK_V, UNROLL)
    if HAS_HIDDEN:
        tl.store(hout_ptr + b.to(tl.int64) * H + hc, hv, mask=hm)
    tl.store(probs_ptr + b, 1.0, mask=first)
    tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1, mask=first)
    done = s < 0          # a scalar i1: does this program write the row's token?
    win = packed
    tok = packed
    if ONE_CHUNK:
        done = s >= 0
    elif COMBINE == 0:
        tl.atomic_max(acc_ptr + b, packed, sem="relaxed")
        arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
        if arrived == n_split - 1:
            win = tl.atomic_xchg(acc_ptr + b, PACKED_EMPTY, sem="relaxed")
            tl.store(cnt_ptr + b, 0)
            done = s >= 0
    elif COMBINE == 1:
        base = b.to(tl.int64) * SP
        tl.store(slot_ptr + base + s, packed)
        if MAP_PRE:
            t = unpack_index(packed)
            mine = tl.max(tl.where(mo == t, mv.to(tl.int64), -(2**63)), 0)
            tl.store(mtok_ptr + base + s, mine)
        arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
        if arrived == n_split - 1:
            k = tl.arange(0, SP)
            c = tl.load(slot_ptr + base + k, mask=k < n_split, other=PACKED_EMPTY,
                        cache_modifier=".cg")
            win = tl.max(c, 0)
            if MAP_PRE:
                mt = tl.load(mtok_ptr + base + k, mask=k < n_split, other=0,
                             cache_modifier=".cg")
                tok = tl.max(tl.where(c == win, mt, -(2**63)), 0)
            tl.store(cnt_ptr + b, 0)
            done = s >= 0
    else:
        base = b.to(tl.int64) * SP
        node = SP + s
        alive = s >= 0
        for lv in tl.static_range(LEVELS):
            # node sits at depth LEVELS - lv; its sibling's subtree starts at this leaf
            sib_leaf = ((node ^ 1) - (SP >> lv)) << lv
            if alive & (sib_leaf < n_split):
                old = tl.atomic_xchg(slot_ptr + base + (node >> 1), win, sem="relaxed")
                if old == PACKED_EMPTY:
                    alive = s < 0
                else:
                    win = tl.maximum(win, old)
                    tl.store(slot_ptr + base + (node >> 1), PACKED_EMPTY)
            node = node >> 1
        done = alive
    if done:
        if MAP_PRE:
            token = tok
        else:
            token = tl.load(map_ptr + unpack_index(win).to(tl.int64) * stride_map).to(tl.int64)
        tl.store(tok_ptr + b, token)
        tl.store(dt_ptr + b.to(tl.int64) * stride_dt + dt_col, token)


class V2:
    """Host side of `_v2` for one shape: buffers at rest and the launch."""

    def __init__(self, B, device):
        self.slots = torch.full((B * 256,), -(2**63), dtype=torch.int64, device=device)
        self.cslots = torch.zeros(B * 256, dtype=torch.int64, device=device)
        self.mtok = torch.zeros(B * 256, dtype=torch.int64, device=device)
        self.acc = torch.full((B,), -(2**63), dtype=torch.int64, device=device)
        self.cnt = torch.zeros(B, dtype=torch.int32, device=device)

    def __call__(self, st, cfg):
        x, rows, hid, tmap = st["logits"], st["rows"], st["hidden"], st["token_map"]
        pos, dt, out = st["positions"], st["draft_tokens"], st["out"]
        R, V = x.shape
        B = rows.shape[0]
        split, tiles = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
        H = hid.shape[1]
        h_slice = -(-C.cdiv(H, split) // 8) * 8
        SP = C.next_pow2(split)
        _v2[(B * split,)](
            x, rows, tmap, out.tokens, out.probs, pos, dt, hid, out.hidden,
            self.acc, self.cnt, self.cslots if cfg["COMBINE"] == 1 else self.slots,
            self.mtok,
            R, V, x.stride(0), tmap.stride(0), pos.stride(0), dt.stride(0),
            st["column"] * dt.stride(1), split, tiles, H, hid.stride(0), h_slice,
            HAS_HIDDEN=True, ONE_CHUNK=split == 1, COMBINE=cfg["COMBINE"],
            MAP_PRE=cfg["MAP_PRE"], BLOCK_V=cfg["BLOCK_V"],
            BLOCK_H=max(32 * cfg["num_warps"], C.next_pow2(h_slice)),
            UNROLL=cfg["UNROLL"], SP=SP, LEVELS=max(0, SP.bit_length() - 1),
            num_warps=cfg["num_warps"], num_stages=1)


def _states(key, dev, n):
    sts = []
    for i in range(n):
        st = make_inputs(key, dev, i)
        res = reference(st["logits"], st["rows"], st["hidden"], st["token_map"])
        st["out"] = DraftTail(*[t.clone() for t in res])
        sts.append(st)
    return sts


def _clone(st):
    return {k: (v.clone() if torch.is_tensor(v) else
                DraftTail(*[t.clone() for t in v]) if isinstance(v, DraftTail) else v)
            for k, v in st.items()}


def _check(fn, master):
    """Outputs of fn on a copy of `master` against the reference on another copy: None
    if equal, else the names that differ."""
    st, ref_in = _clone(master), _clone(master)
    for f in st["out"]:
        f.fill_(0)
    fn(st)
    if st["logits"].is_cuda:
        torch.cuda.synchronize()
    ref = reference(ref_in["logits"], ref_in["rows"], ref_in["hidden"], ref_in["token_map"],
                    ref_in["positions"], ref_in["draft_tokens"], ref_in["column"])
    bad = [n for n, a, b in (("tokens", st["out"].tokens, ref.tokens),
                             ("probs", st["out"].probs, ref.probs),
                             ("hidden", st["out"].hidden, ref.hidden),
                             ("positions", st["positions"], ref_in["positions"]),
                             ("draft_tokens", st["draft_tokens"], ref_in["draft_tokens"]))
           if not torch.equal(a, b)]
    return bad or None


def verified(say, tag, fn, master):
    """True when fn's outputs equal the reference's (`_check`); else says why (ERROR or
    WRONG, with `tag`) and returns False: such a variant is not timed."""
    try:
        bad = _check(fn, master)
    except Exception as e:  # noqa: BLE001
        say(f"{tag}: ERROR {type(e).__name__}: {str(e)[:160]}")
        return False
    if bad:
        say(f"{tag}: WRONG {bad}")
        return False
    return True


def sayer(path):
    """A print that also appends to `path` (emptied first), so a cut run keeps its lines."""
    open(path, "w").close()

    def say(s):
        with open(path, "a") as f:
            f.write(s + "\n")
        print(s, flush=True)
    return say


def rec(fn, sts, twice=False):
    """Graph-replay median of fn over the input sets (twice: a second, independent one)."""
    t = time_graph(fn, sts, reps=30).p50
    return (t, time_graph(fn, sts, reps=30, warm_gpu=False).p50) if twice else (t,)


def main(path):
    dev = torch.device("cuda")
    say = sayer(path)

    def fmt(ts):
        return " ".join(f"{t:7.2f}" for t in ts)

    say(f"# {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, "
        f"triton {triton.__version__}; graph-replay medians in us")
    shapes = [(1, 32000, 4096), (1, 151936, 4096), (256, 151936, 4096),
              (256, 151936, 7168)]
    for B, V, H in shapes:
        key = tune_key(torch.bfloat16, V, B, H)
        nb = _bytes(key)
        sts = _states(key, dev, rotation(nb))
        master = _clone(sts[0])
        say(f"## B={B} V={V} H={H} bf16: {nb / 1e6:.2f} MB, {len(sts)} input sets; "
            f"floor at 4.24 TB/s {nb / 4.24e6:.2f} us")
        # 1. the recipe over its configs (BLOCK_H 4096)
        grid = []
        for bv in SPACE["BLOCK_V"]:
            for sp in SPACE["SPLIT"]:
                for u in SPACE["UNROLL"]:
                    for w in SPACE["num_warps"]:
                        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w,
                               "num_stages": 1, "BLOCK_H": 4096, "FUSE_H": 0}
                        if constraint(cfg, key) and (B < 256 or sp <= 4):
                            grid.append(cfg)
        res = []
        for cfg in grid:
            fn = (lambda s, c=cfg: draft_tail(
                s["logits"], rows=s["rows"], hidden=s["hidden"], token_map=s["token_map"],
                positions=s["positions"], draft_tokens=s["draft_tokens"],
                column=s["column"], out=s["out"], config=c))
            res.append((rec(fn, sts)[0], cfg))
        res.sort(key=lambda t: t[0])
        for t, cfg in res[:6]:
            say(f"recipe {cfg['BLOCK_V']:>5} split {cfg['SPLIT']:>3} U{cfg['UNROLL']} "
                f"w{cfg['num_warps']:<2} {t:7.2f}")
        best = res[0][1]
        for what, kw in (("full", {}), ("no token_map", {"token_map": None}),
                         ("no hidden", {"hidden": None}),
                         ("no positions/draft_tokens", {"positions": None,
                                                        "draft_tokens": None}),
                         ("argmax only", {"token_map": None, "hidden": None,
                                          "positions": None, "draft_tokens": None})):
            def fn(s, kw=kw, best=best):
                a = {"hidden": s["hidden"], "token_map": s["token_map"],
                     "positions": s["positions"], "draft_tokens": s["draft_tokens"]}
                a.update(kw)
                o = s["out"] if a["hidden"] is not None else DraftTail(
                    s["out"].tokens, s["out"].probs, None)
                return draft_tail(s["logits"], rows=s["rows"], column=s["column"],
                                  out=o, config=best, **a)
            say(f"recipe at its best, {what:<26} {fmt(rec(fn, sts, twice=True))}")
        # 2. the candidate kernel
        v2 = V2(B, dev)
        cands = set()
        for _, cfg in res[:8]:
            cands.add((cfg["BLOCK_V"], cfg["SPLIT"], cfg["UNROLL"], cfg["num_warps"]))
        if B <= 8:
            for sp in (1, 2, 4, 8, 16, 32, 64):
                bv = max(1024, C.next_pow2(C.cdiv(V, sp)))
                if bv > 16384:
                    continue
                for w in (4, 8, 16):
                    if bv >= 4 * 32 * w and bv <= 64 * 32 * w:
                        cands.add((bv, sp, 1, w))
        v2res = []
        for bv, sp, u, w in sorted(cands):
            split, tiles = split_plan(V, bv, sp)
            combos = [(0, 0)] if split == 1 else [(0, 0), (1, 0), (2, 0)]
            if split > 1 and tiles == 1 and B <= 8:
                combos.append((1, 1))
            for comb, mp in combos:
                cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w,
                       "COMBINE": comb, "MAP_PRE": mp}
                tag = (f"v2 {bv:>5} split {split:>3} U{u} w{w:<2} combine {comb} "
                       f"map_pre {mp}")
                try:
                    bad = _check(lambda s, c=cfg, v2=v2: v2(s, c), master)
                except Exception as e:  # noqa: BLE001
                    say(f"{tag}: ERROR {type(e).__name__}: {str(e)[:120]}")
                    continue
                if bad:
                    say(f"{tag}: WRONG {bad}")
                    continue
                t = rec(lambda s, c=cfg, v2=v2: v2(s, c), sts)[0]
                v2res.append((t, tag, cfg))
        v2res.sort(key=lambda t: t[0])
        for t, tag, _ in v2res[:12]:
            say(f"{tag} {t:7.2f}")
        for comb in (0, 1, 2):
            sel = [r for r in v2res if r[2]["COMBINE"] == comb and r[2]["MAP_PRE"] == 0]
            if sel:
                say(f"best v2 with combine {comb}: {sel[0][1]} {sel[0][0]:7.2f}")
        if v2res:
            t, tag, cfg = v2res[0]
            again = rec(lambda s, v2=v2, cfg=cfg: v2(s, cfg), sts, twice=True)
            say(f"best v2 again: {tag} {fmt(again)}")
        del sts


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-tail.txt")
