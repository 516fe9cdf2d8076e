"""One rank of the recipes.tp multi-process tests (tests/recipes/test_tp.py starts them).

    python tests/recipes/tp_worker.py RANK WORLD STORE_PORT DEVICE SCENARIOS
    (DEVICE: cpu or cuda; SCENARIOS: comma-separated names of `SCENARIOS`)

Joins a process group (gloo on the CPU under the Triton interpreter, nccl on CUDA)
through the parent's TCPStore, runs every scenario of `SCENARIOS` on this rank's shard
of logits that every rank builds alike, checks each result bit for bit against the
single-device call on the full logits, and exits 0 (a failed check raises: exit 1, the
traceback on stderr).
"""
import datetime
import os
import sys
import time

DEVICE = sys.argv[4] if len(sys.argv) > 4 else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"     # before recipes is imported
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import recipes  # noqa: E402
import recipes.chain_verify as CV  # noqa: E402
from recipes import tp  # noqa: E402
from recipes.chain_verify import target_tokens  # noqa: E402
from tests.helpers import capture  # noqa: E402

NAN, INF = float("nan"), float("inf")
SMALL = {"BLOCK_V": 1024, "SPLIT": 2, "num_warps": 4, "UNROLL": 2}


def shards(V: int, world: int, uneven: bool):
    """[(vocab_start, width)]: even widths cdiv(V, world) (the last shard padded past V),
    or uneven cuts whose starts are not multiples of 4 (the sampled stream's groups)."""
    if not uneven:
        w = -(-V // world)
        return [(r * w, w) for r in range(world)]
    starts = [0] + [r * V // world + (r % 4 or 1) for r in range(1, world)]
    ends = starts[1:] + [V + 3]                      # 3 padding columns on the last rank
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def local_view(full: torch.Tensor, vs: int, width: int, V: int):
    """The rank's columns as a strided view: NaN just before them (a scan reading below
    its first column would take it) and +inf/NaN garbage in the padding past V."""
    lead = full.shape[:-1]
    buf = torch.full(lead + (width + 8,), NAN, dtype=full.dtype)
    live = min(width, V - vs)
    buf[..., 4:4 + live] = full[..., vs:vs + live].cpu()
    buf[..., 4 + live:4 + width:2] = INF
    return buf.to(full.device)[..., 4:4 + width]


def cut_rows(V: int, cuts, dtype, g):
    """Rows whose answer is decided at the shard boundaries: equal maxima on both sides
    of each cut, NaN on two ranks, NaN against +inf, -0.0 against +0.0 across a cut, all
    -inf, the maximum on the last live column, -inf everywhere but one column."""
    rows = []
    for c in cuts:
        r = torch.randn(V, generator=g)
        r[c - 1] = r[c] = 50.0
        rows.append(r)
        r = torch.randn(V, generator=g)
        r[c] = r[V - 1] = 50.0
        rows.append(r)
    r = torch.randn(V, generator=g)
    r[cuts[-1] + 1], r[cuts[0] - 2] = NAN, NAN
    rows.append(r)
    r = torch.randn(V, generator=g)
    r[0], r[V - 1] = INF, NAN
    rows.append(r)
    r = torch.full((V,), -1.0)
    r[cuts[0]], r[cuts[0] - 1] = 0.0, -0.0
    rows.append(r)
    rows.append(torch.full((V,), -INF))
    r = torch.full((V,), -INF)
    r[cuts[-1]] = -3e4
    rows.append(r)
    r = torch.randn(V, generator=g)
    r[V - 1] = 60.0
    rows.append(r)
    return torch.stack(rows).to(dtype)


def same(got, want, what):
    if isinstance(want, tuple):
        for name, a, b in zip(want._fields, got, want, strict=True):
            same(a, b, f"{what}.{name}")
        return
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    assert torch.equal(got.cpu(), want.cpu()), f"{what}: {got.cpu()} != {want.cpu()}"


class Collectives:
    """Counts the all-reduces (and the int64 elements they carry) of the calls."""

    def __init__(self):
        self.calls, self.elems, self._real = 0, 0, dist.all_reduce
        dist.all_reduce = self

    def __call__(self, t, *args, **kw):
        assert t.dtype == torch.int64, t.dtype
        self.calls += 1
        self.elems += t.numel()
        return self._real(t, *args, **kw)


def poisoned(want):
    if isinstance(want, tuple):
        return type(want)(*[torch.full_like(t, -77) for t in want])
    return torch.full_like(want, -77)


def run_argmax(ctx, V, layout, runs):
    """tp.argmax against torch.argmax of the full rows, for each (dtype, config) run."""
    rank, world, dev, coll = ctx["rank"], ctx["world"], ctx["dev"], ctx["coll"]
    g = torch.Generator().manual_seed(V)
    sh = shards(V, world, layout == "uneven")
    cuts = [s for s, _ in sh[1:]]
    vs, w = sh[rank]
    for dtype, cfg in runs:
        full = torch.cat([cut_rows(V, cuts, dtype, g),
                          torch.randn(3, V, generator=g).to(dtype)]).to(dev)
        want = torch.argmax(full, 1)
        out = poisoned(want)
        before = coll.calls
        got = tp.argmax(local_view(full, vs, w, V), vocab_start=vs, vocab_size=V, out=out,
                        config=cfg)
        assert got is out and coll.calls == before + 1
        same(got, want, f"argmax {layout} V={V} {dtype} cfg={cfg}")


def drafts(t, V, pad_id, g, wrap: bool):
    """int64 drafts [B, K] accepting a random prefix of t [B, K+1]; the first miss is a
    wrong id, -1, V, a padding id, or (wrap) 2^32 + t (same low word)."""
    B, K = t.shape[0], t.shape[1] - 1
    d = t[:, :K].clone()
    for b in range(B):
        cut = int(torch.randint(0, K + 1, (1,), generator=g))
        if cut < K:
            d[b, cut] = [(d[b, cut] + 1) % V, -1, V, pad_id,
                         d[b, cut] + 2**32 if wrap else -5][b % 5]
    return d


def run_verify(ctx, V, layout, sampled, runs, B=4, K=2):
    """tp.chain_verify against the one-device call on the full logits, for each
    (drafts dtype, 3-D logits, config) run; sampled: greedy and sampled requests in one
    batch, compared with recipes.chain_verify itself (the same arithmetic, bit for bit),
    greedy: with the torch reference."""
    rank, world, dev, coll = ctx["rank"], ctx["world"], ctx["dev"], ctx["coll"]
    g = torch.Generator().manual_seed(V + 7 * B + K)
    sh = shards(V, world, layout == "uneven")
    cuts = [s for s, _ in sh[1:]]
    rows = cut_rows(V, cuts, torch.bfloat16, g)
    assert rows.shape[0] <= B * (K + 1)
    filler = (torch.randn(B * (K + 1) - rows.shape[0], V, generator=g) * 3).to(rows.dtype)
    full = torch.cat([rows, filler])
    kw = {}
    if sampled:
        kw = {"temperature": torch.tensor([1.0, 0.0, 0.6, NAN, 2.0][:B]),  # 0, NaN: greedy
              "seeds": torch.randint(-2**62, 2**62, (B,), generator=g),
              "positions": torch.randint(0, 2**30, (B,), generator=g)}
    t = target_tokens(full, B, K, **kw)
    vs, w = sh[rank]
    pad_id = max(V, sum(sh[-1]) - 1)     # the last padding column's id (V without padding)
    d64 = drafts(t, V, pad_id, g, wrap=not sampled).to(dev)
    d32 = torch.where(d64 >= 2**31, -5, d64).to(torch.int32)
    full = full.to(dev)
    kw = {k: v.to(dev) for k, v in kw.items()}
    want_sampled = recipes.chain_verify(full, d64, **kw) if sampled else None
    for dtype, three_d, cfg in runs:
        d = d64 if dtype == torch.int64 else d32
        want = want_sampled if sampled else CV.reference(full, d)
        x = local_view(full.view(B, K + 1, V) if three_d else full, vs, w, V)
        out = poisoned(want)
        before = coll.calls
        got = tp.chain_verify(x, d, vocab_start=vs, vocab_size=V, out=out, config=cfg,
                              **kw)
        assert all(a is b for a, b in zip(got, out, strict=True))
        assert coll.calls == before + 1
        same(got, want, f"chain_verify {layout} V={V} sampled={sampled} drafts={dtype} "
                        f"3-D={three_d} cfg={cfg}")


def run_edges(ctx):
    """B = 0 (no collective), a group of one (the single-device call), and the pieces
    (local_keys + all_reduce + finish_*) equal to the calls."""
    rank, world, dev, coll = ctx["rank"], ctx["world"], ctx["dev"], ctx["coll"]
    V = 700
    vs, w = shards(V, world, False)[rank]
    before = coll.calls
    e = tp.chain_verify(torch.empty(0, 3, w, device=dev), torch.empty(0, 2, dtype=torch.int64,
                        device=dev), vocab_start=vs, vocab_size=V)
    assert e.tokens.shape == (0, 3) and tp.argmax(torch.empty(0, w, device=dev),
                                                 vocab_start=vs, vocab_size=V).shape == (0,)
    assert coll.calls == before
    full = torch.randn(5, V, generator=torch.Generator().manual_seed(3)).to(dev)
    mine = [dist.new_group([r]) for r in range(world)][rank]   # every rank makes each
    same(tp.argmax(full, vocab_start=0, vocab_size=V, group=mine), recipes.argmax(full),
         "group of one")
    assert coll.calls == before
    x = local_view(full, vs, w, V)
    keys = tp.local_keys(x, vocab_start=vs, vocab_size=V)
    dist.all_reduce(keys, op=dist.ReduceOp.MAX)
    same(tp.finish_argmax(keys), recipes.argmax(full), "pieces")
    d = torch.randint(-1, V, (1, 4), generator=torch.Generator().manual_seed(1)).to(dev)
    keys = tp.local_keys(x.view(1, 5, w), vocab_start=vs, vocab_size=V)
    dist.all_reduce(keys, op=dist.ReduceOp.MAX)
    same(tp.finish_verify(keys, d), recipes.chain_verify(full, d), "pieces verify")


def run_graph(ctx):
    """CUDA only: a captured call (NCCL inside the graph) replays to the same outputs and
    allocates nothing once warm."""
    rank, world, dev = ctx["rank"], ctx["world"], ctx["dev"]
    V, B, K = 151936, 8, 3
    g = torch.Generator().manual_seed(5)
    full = torch.randn(B * (K + 1), V, generator=g).to(torch.bfloat16).to(dev)
    d = torch.randint(0, V, (B, K), generator=g).to(dev)
    T = torch.tensor([1.0, 0.0] * (B // 2), device=dev)
    s = torch.arange(B, device=dev) * 7919
    p = torch.arange(B, device=dev) * 3
    vs, w = shards(V, world, False)[rank]
    x = local_view(full, vs, w, V)
    want = recipes.chain_verify(full, d, temperature=T, seeds=s, positions=p)
    out = poisoned(want)

    def call():
        tp.chain_verify(x, d, vocab_start=vs, vocab_size=V, temperature=T, seeds=s,
                        positions=p, out=out)

    call()                                                        # warm-up
    graph, used = capture(call)
    assert used <= 0, f"the captured call allocated {used} bytes"
    for t in out:
        t.fill_(-77)
    graph.replay()
    torch.cuda.synchronize()
    same(out, want, "graph replay")


# V = 301, 401, 2101: even shards start off multiples of 4 and the last one is padded;
# V = 480: even shards start on multiples of 4 (the sampled scan without its mask).
# SMALL at V = 2101 on 2 ranks: two chunks of a rank meet in the stage-2 workspace.
BF, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
EXACT = {"EXACT": 1}
SCENARIOS = {
    "argmax": lambda c: [run_argmax(c, 301, "even", [(BF, None)]),
                         run_argmax(c, 301, "uneven", [(F32, None)]),
                         run_argmax(c, 2101, "even", [(BF, SMALL), (F32, None)]),
                         run_argmax(c, 2101, "uneven", [(BF, None)])],
    "greedy": lambda c: [run_verify(c, 401, "even", False, [(I64, True, None)]),
                         run_verify(c, 401, "uneven", False, [(I32, False, None)]),
                         run_verify(c, 2101, "even", False, [(I64, False, SMALL)]),
                         run_verify(c, 2101, "uneven", False, [(I32, True, None)])],
    "sampled": lambda c: [run_verify(c, 480, "even", True,
                                     [(I64, True, None), (I32, False, EXACT)]),
                          run_verify(c, 480, "uneven", True,
                                     [(I32, True, None), (I64, False, EXACT)])],
    "edges": run_edges,
    "graph": run_graph,          # CUDA only
}


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", store=store, rank=rank,
                            world_size=world)
    dev = torch.device(DEVICE, rank) if DEVICE == "cuda" else torch.device("cpu")
    ctx = {"rank": rank, "world": world, "dev": dev, "coll": Collectives()}
    names = sys.argv[5].split(",")
    for name in names:
        t0 = time.time()
        SCENARIOS[name](ctx)
        print(f"rank {rank}: {name} {time.time() - t0:.1f} s")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world}: {', '.join(names)} ok")


if __name__ == "__main__":
    main()
