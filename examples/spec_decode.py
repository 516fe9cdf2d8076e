#!/usr/bin/env python
"""Speculative decoding with the recipes, in the shape of a serving engine: a top-1 chain
draft (EAGLE/MTP-style) whose whole decode step is ONE CUDA graph per batch size.

    python examples/spec_decode.py --check    # lossless: fp32 tokens == HF generate
    python examples/spec_decode.py --bench    # vs plain torch: results/<gpu>/spec-decode.md

The models (`paged_llama.py`): a compact Llama (RMSNorm, RoPE, GQA, SwiGLU) over a paged
KV cache, loading the weights of a randomly initialised Hugging Face LlamaForCausalLM (no
download); the draft is the target's first layer(s) with its embedding, norm and lm_head.

The state, as an engine keeps it
--------------------------------
A request lives in a pool slot r: `seq_len[r]` = L, the tokens of it the target cache
holds, which is also the position of x0, its last committed token (not yet cached);
`last[r]` = (x0's predecessor, x0); its seed, temperature (and top-k / top-p where
`chain_verify` has them); its token ids; and `req_to_token[r, p]`, the cache slot of its
token at position p (static pages, interleaved across requests so that nothing works by
accident of layout). Both models' caches use the same slots, each its own K/V tensors.

The step (B requests, K drafts each), all of it one CUDA graph
--------------------------------------------------------------
    copy_inputs      the host-staged batch (the requests' pool slots) into the graph's input
    relay_gather     each request's state out of the pool, into the step's batch buffers
    verify_metadata  (side stream, beside the draft) positions, out_cache_loc, page table
                     and seqlens_k of the verify's K+1 tokens at L .. L+K; and on the
                     main stream the same for the draft's inputs at L-1 .. L+K-1
    draft            K forwards: [x0's predecessor, x0], then d1 .. d_{K-1}, one token
                     each; after each, lm_head and `draft_tail` (argmax, written into the
                     verify inputs [x0, d1 .. dK])
    verify           the target forward over [x0, d1 .. dK], lm_head
    chain_verify     the target token of every row (argmax, or the Gumbel-max sample of a
                     request with T > 0) and the accepted prefix m
    commit           new L = L + m + 1, new (predecessor, x0) = (input m, bonus), the
                     emitted tokens into the pool, acceptance counters (plain torch in
                     both loops); a request that has all its tokens stays put (its step
                     recomputes the same thing: a static batch's padding row)
    relay_scatter    the new state back into the pool

Every forward writes its tokens' K/V at `out_cache_loc` and attends through `page_table`
/ `seqlens_k`, causally by position, as FA3 or FlashInfer would: requests of different
lengths and acceptance share the batch with no cropping and no sync. The draft re-feeds
x0's predecessor every step (its K/V is missing after a step that accepted every draft).
The host replays the graph and reads the pool only every few steps, to see who finished.
`--ops torch` builds the same graph with plain torch in place of every recipe
(torch.argmax, the accept logic, index_select / index_copy_, copy_, the metadata in
torch): the benchmark's baseline. On CPU the step runs eagerly (the recipes under the
Triton interpreter); CUDA graphs need a GPU.

Lossless
--------
The draft proposes greedily (draft_tail's argmax). A greedy request then emits exactly
the target's greedy tokens: in float32 exactly `generate`'s (tested; the K+1-row forwards
round differently only in low bits). A sampled request (T > 0) emits chain_verify's
sample at each position, Gumbel-max on Philox(seed, position): a top-1 draft puts
probability 1 on its token, so accepting it iff it equals the target's sample is exact
speculative sampling, and the output is a function of (seed, prompt) alone, the same in
any batch, for any K. The torch loop samples the way engines' torch paths do
(softmax(logits / T) and the exponential race, torch's RNG): the same distribution, not
the same stream.

Not covered: stop tokens (every request runs to max_new_tokens), requests joining or
leaving a running batch (the staged slots and the pool are where an engine would do it),
EAGLE's feature-level draft (`draft_tail`'s hidden=) and draft vocabularies (token_map=).
"""
from __future__ import annotations

import argparse
import inspect
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # the recipes run under the interpreter
sys.path[:0] = [str(ROOT), str(HERE)]                # this checkout's recipes; paged_llama

from paged_llama import PagedLlama  # noqa: E402

import recipes  # noqa: E402
from recipes.chain_verify import accept  # noqa: E402
from recipes.verify_metadata import engine_torch  # noqa: E402

CONTROLS = "top_k" in inspect.signature(recipes.chain_verify).parameters


# --- models ------------------------------------------------------------------------------
# (vocab, hidden, layers, heads, kv heads, intermediate, init), draft layers, deep_scale
SIZES = {
    "tiny": ((256, 64, 2, 4, 2, 128, 0.05), 1, 0.3),          # CPU: the interpreter
    "check": ((32000, 1024, 4, 8, 2, 3584, 0.02), 1, 0.2),
    "bench": ((151936, 4096, 4, 32, 8, 14336, 0.02), 1, 0.15),
}


def hf_model(size, dtype=torch.float32, device="cpu", seed=0, layers=None, arch="llama"):
    """A randomly initialised Hugging Face causal LM of one of SIZES (nothing is
    downloaded): LlamaForCausalLM, or Qwen2ForCausalLM (q/k/v biases) with arch="qwen2".
    The output projections of its layers past the draft's are scaled by deep_scale: with
    random weights every layer adds about as much to the residual stream as the first,
    and a draft made of the first layer alone would almost never be accepted."""
    try:
        import transformers  # the examples extra; imported here so that --help needs none
    except ModuleNotFoundError:
        raise SystemExit("examples/spec_decode.py: the models come from transformers, "
                         "which is not installed: pip install 'spec-cookbook[examples]'"
                         ) from None

    (vocab, hidden, n, heads, kv, inter, init), n_draft, scale = SIZES[size]
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    cfg = cls[0](vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers or n,
                 num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                 initializer_range=init, max_position_embeddings=8192,
                 tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls[1](cfg)
    finally:
        torch.set_default_dtype(default)
    if arch == "qwen2":   # random biases (HF initialises them to zero)
        for layer in model.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.data.normal_(0, init)
    for layer in model.model.layers[n_draft:]:
        layer.self_attn.o_proj.weight.data.mul_(scale)
        layer.mlp.down_proj.weight.data.mul_(scale)
    return model.eval()


def build(size, dtype, device, seed=0, layers=None, arch="llama"):
    """(hf target, target, draft): the HF model and the paged models over its weights."""
    hf = hf_model(size, dtype, device, seed, layers, arch)
    return hf, PagedLlama.from_hf(hf), PagedLlama.from_hf(hf, layers=SIZES[size][1])


# --- the hot paths: recipes, or the same in plain torch -----------------------------------
class TorchOps:
    """What each recipe replaces, in plain torch, with the recipes' signatures."""

    @staticmethod
    def copy_inputs(*, src, dst):
        for s, d in zip(src, dst, strict=True):
            d.copy_(s.view_as(d))

    @staticmethod
    def relay_gather(index, fields):
        for src, dst in fields:
            dst.copy_(src.index_select(0, index))

    @staticmethod
    def relay_scatter(index, fields):
        for src, dst in fields:
            dst.index_copy_(0, index, src.to(dst.dtype))

    @staticmethod
    def verify_metadata(req_pool_indices, seq_lens, req_to_token, num_tokens, *, page_size,
                        out=None):
        md = engine_torch(req_pool_indices, seq_lens, req_to_token, num_tokens,
                          page_size=page_size)
        if out is None:
            return md
        for o, r in zip(out, md, strict=True):
            if o is not None:
                o.copy_(r)
        return out

    @staticmethod
    def draft_tail(logits, *, draft_tokens, column, out):
        draft_tokens[:, column] = torch.argmax(logits, dim=-1)
        return out

    @staticmethod
    def chain_verify(logits, draft_tokens, *, out, temperature=None, seeds=None,
                     positions=None, top_k=None, top_p=None):
        """torch.argmax; sampled rows as engines' torch paths sample (softmax(z / T),
        top-k / top-p by sorting, the exponential race); the accept logic in torch."""
        B, K = draft_tokens.shape
        t = torch.argmax(logits, dim=-1)
        if temperature is not None:
            T = temperature.repeat_interleave(K + 1)
            z = logits.float() / torch.where(T > 0, T, 1.0)[:, None]
            if top_k is not None:
                z = _torch_top_k_top_p(z, top_k.repeat_interleave(K + 1),
                                       top_p.repeat_interleave(K + 1))
            probs = torch.softmax(z, dim=-1)
            s = torch.argmax(probs / torch.empty_like(probs).exponential_(), dim=-1)
            t = torch.where(T > 0, s, t)
        for o, r in zip(out, accept(t.view(B, K + 1), draft_tokens), strict=True):
            o.copy_(r)
        return out


def _torch_top_k_top_p(z, top_k, top_p):
    """-inf outside each row's top-k then top-p set (off: top_k <= 0, top_p >= 1)."""
    V = z.shape[-1]
    zs, order = z.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=z.device)
    k = torch.where((top_k > 0) & (top_k < V), top_k, V)
    zs = zs.masked_fill(rank >= k[:, None], float("-inf"))
    p = torch.softmax(zs, dim=-1)
    before = p.cumsum(dim=-1) - p           # mass of the ids ranked above
    zs = zs.masked_fill((before >= top_p[:, None]) & (rank > 0), float("-inf"))
    return torch.full_like(z, float("-inf")).scatter(1, order, zs)


OPS = {"recipes": recipes, "torch": TorchOps}


# --- state -------------------------------------------------------------------------------
def _zeros(device):
    return lambda *shape, dt=torch.int64: torch.zeros(shape, dtype=dt, device=device)


class Pool:
    """Per-request state, indexed by pool slot (what an engine keeps between steps), and
    the static page layout: request r's page p is page p * P + r."""

    def __init__(self, P, cap, page_size, device):
        z = _zeros(device)
        self.P, self.cap, self.page_size = P, cap, page_size
        self.seq_len = z(P)           # L: target tokens cached = position of x0
        self.seq_len_d = z(P)         # L - 1: the draft's (it re-feeds x0's predecessor)
        self.last = z(P, 2)           # (x0's predecessor, x0)
        self.seed = z(P)
        self.temperature = z(P, dt=torch.float32)
        self.top_k = z(P, dt=torch.int32)
        self.top_p = torch.ones(P, dtype=torch.float32, device=device)
        self.limit = z(P)             # L once max_new_tokens are emitted
        self.accepted = z(P)          # accepted drafts, summed over the live steps
        self.live_steps = z(P)
        self.ids = z(P, cap)          # token id at each position (prompt and output)
        pos = torch.arange(cap, device=device)
        r = torch.arange(P, device=device)[:, None]
        self.r2t = ((pos // page_size * P + r) * page_size + pos % page_size).to(torch.int32)
        self.pages = P * (cap // page_size)


class Batch:
    """The static buffers of one batch size: the step graph's inputs and outputs."""

    def __init__(self, B, K, cap, page_size, vocab, dtype, device, sampled):
        z = _zeros(device)
        self.B, self.K, self.sampled = B, K, sampled
        self.slots_in = z(B)          # staged by the host (copy_inputs -> idx)
        self.idx = z(B)               # pool slots (req_pool_indices)
        self.L = z(B)
        self.Ld = z(B)
        self.pair = z(B, 2)           # the draft's first inputs
        self.vids = z(B, K + 1)       # verify inputs [x0, d1 .. dK]; draft_tail fills 1..K
        self.seeds = z(B)
        self.temp = z(B, dt=torch.float32)
        self.top_k = z(B, dt=torch.int32)
        self.top_p = z(B, dt=torch.float32)
        self.j = torch.arange(K + 1, device=device)
        self.dlogits = z(B, vocab, dt=dtype)
        self.logits = z(B * (K + 1), vocab, dt=dtype)
        self.tail = recipes.DraftTail(z(B), z(B, dt=torch.float32), None)
        self.res = recipes.VerifyResult(z(B, K + 1, dt=torch.int32), z(B, dt=torch.int32),
                                        z(B, dt=torch.int32), z(B))
        self.new_len, self.new_len_d, self.new_pair = z(B), z(B), z(B, 2)
        pages = cap // page_size
        md = lambda: recipes.VerifyMetadata(  # noqa: E731  (all of "fa3": no allocation)
            positions=z(B * (K + 1)), out_cache_loc=z(B * (K + 1)),
            seqlens_k=z(B, dt=torch.int32), cu_seqlens_q=z(B + 1, dt=torch.int32),
            cu_seqlens_k=z(B + 1, dt=torch.int32), max_seqlen_k=z(1, dt=torch.int32),
            page_table=z(B, pages, dt=torch.int32))
        self.md_t, self.md_d = md(), md()
        self.graph = None


@dataclass
class Generation:
    tokens: list            # per request: max_new_tokens ids
    mean_accepted: float    # accepted drafts a request a step (live steps only)
    steps: int              # step replays, the few past the last finish included
    seconds: float          # the decode loop (after prefill), wall time


@dataclass
class Piece:
    name: str               # what the profile groups by
    kind: str               # "model", "recipe" (or its torch counterpart), "commit"
    run: object             # the piece, over the batch's static buffers
    side: bool = False      # on the side stream (joined before the verify forward)


# --- the loop ----------------------------------------------------------------------------
class SpecDecoder:
    """Top-1 chain speculative decoding, K drafts a step, over paged target and draft
    models of one vocabulary. ops: "recipes", or "torch" for the same graph in plain
    torch. max_requests, max_len: the pool's slots and positions a slot (static: the
    graphs hold their addresses). check_every: steps between the host's reads."""

    def __init__(self, target, draft, K, *, ops="recipes", max_requests=8, max_len=256,
                 page_size=16, side_stream=True, cuda_graph=True, check_every=4):
        if K < 1:
            raise ValueError(f"K: expected at least 1 draft token, got {K}")
        if ops not in OPS:
            raise ValueError(f"ops: expected one of {sorted(OPS)}, got {ops!r}")
        self.target, self.draft, self.K, self.ops = target, draft, K, OPS[ops]
        self.device = target.device
        cuda = self.device.type == "cuda"
        self.side = torch.cuda.Stream(self.device) if cuda and side_stream else None
        self.cuda_graph = cuda and cuda_graph
        self.check_every = check_every
        cap = -(-max_len // page_size) * page_size
        self.pool = Pool(max_requests, cap, page_size, self.device)
        self.kv_t = target.new_cache(self.pool.pages, page_size)
        self.kv_d = draft.new_cache(self.pool.pages, page_size)
        self.batches = {}

    # -- the step, piece by piece (every piece reads and writes static buffers only)
    def pieces(self, st) -> list[Piece]:
        ops, pool, K, B, ps = self.ops, self.pool, self.K, st.B, self.pool.page_size
        md_t, md_d = st.md_t, st.md_d
        fields = [(pool.seq_len, st.L), (pool.seq_len_d, st.Ld), (pool.last, st.pair),
                  (pool.last[:, 1:], st.vids[:, :1]), (pool.seed, st.seeds),
                  (pool.temperature, st.temp)]
        sampling = {}
        if st.sampled:
            sampling = dict(temperature=st.temp, seeds=st.seeds, positions=st.L)
            if CONTROLS:
                fields += [(pool.top_k, st.top_k), (pool.top_p, st.top_p)]
                sampling.update(top_k=st.top_k, top_p=st.top_p)

        def draft_forward(k):
            pos, loc = md_d.positions.view(B, K + 1), md_d.out_cache_loc.view(B, K + 1)
            ids, cols = (st.pair, slice(0, 2)) if k == 0 else \
                (st.vids[:, k:k + 1], slice(k + 1, k + 2))
            h = self.draft.forward(ids, pos[:, cols], loc[:, cols], md_d.page_table,
                                   md_d.seqlens_k, self.kv_d)
            self.draft.logits(h[:, -1], out=st.dlogits)

        def verify_forward():
            h = self.target.forward(st.vids, md_t.positions.view(B, K + 1),
                                    md_t.out_cache_loc.view(B, K + 1), md_t.page_table,
                                    md_t.seqlens_k, self.kv_t)
            self.target.logits(h.view(B * (K + 1), -1), out=st.logits)

        def commit():
            res = st.res
            m = res.accept_len.long()
            live = st.L < pool.limit[st.idx]
            torch.where(live, st.L + m + 1, st.L, out=st.new_len)
            torch.sub(st.new_len, 1, out=st.new_len_d)
            pair = torch.stack([st.vids.gather(1, m[:, None])[:, 0], res.bonus.long()], 1)
            torch.where(live[:, None], pair, st.pair, out=st.new_pair)
            # positions L+1 .. L+m+1 (the -1s after: overwritten before they count)
            pool.ids[st.idx[:, None], st.L[:, None] + 1 + st.j] = res.tokens.long()
            pool.accepted.index_add_(0, st.idx, m * live)
            pool.live_steps.index_add_(0, st.idx, live.long())

        out = [
            Piece("copy_inputs", "recipe",
                  lambda: ops.copy_inputs(src=[st.slots_in], dst=[st.idx])),
            Piece("relay_gather", "recipe", lambda: ops.relay_gather(st.idx, fields)),
            Piece("verify_metadata", "recipe", lambda: ops.verify_metadata(
                st.idx, st.L, pool.r2t, K + 1, page_size=ps, out=md_t), side=True),
            Piece("verify_metadata", "recipe", lambda: ops.verify_metadata(
                st.idx, st.Ld, pool.r2t, K + 1, page_size=ps, out=md_d)),
        ]
        for k in range(K):
            out += [Piece("draft forward + lm_head", "model", lambda k=k: draft_forward(k)),
                    Piece("draft_tail", "recipe", lambda k=k: ops.draft_tail(
                        st.dlogits, draft_tokens=st.vids[:, 1:], column=k, out=st.tail))]
        out += [Piece("verify forward + lm_head", "model", verify_forward),
                Piece("chain_verify", "recipe", lambda: ops.chain_verify(
                    st.logits, st.vids[:, 1:], out=st.res, **sampling)),
                Piece("commit", "commit", commit),
                Piece("relay_scatter", "recipe", lambda: ops.relay_scatter(st.idx, [
                    (st.new_len, pool.seq_len), (st.new_len_d, pool.seq_len_d),
                    (st.new_pair, pool.last)]))]
        return out

    def _run_step(self, pieces):
        """One step: the side pieces on the side stream (forked here, joined before the
        first model piece that follows them)."""
        main = torch.cuda.current_stream(self.device) if self.side is not None else None
        ready = None
        for p in pieces:
            if p.side and self.side is not None:
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    p.run()
                ready = torch.cuda.Event()
                ready.record(self.side)
                continue
            if ready is not None and p.name.startswith("verify forward"):
                main.wait_event(ready)
                ready = None
            p.run()

    def batch(self, B, sampled) -> Batch:
        """The static buffers (and, on CUDA, the step graph) of one batch size. The
        graph is captured on first use, after a warm-up that compiles every kernel; the
        warm-up and the capture run on made-up state (pool slots 0..B-1), which the
        prefill then overwrites."""
        key = (B, sampled)
        if key not in self.batches:
            if B > self.pool.P:
                raise ValueError(f"B: expected at most max_requests={self.pool.P}, got {B}")
            st = Batch(B, self.K, self.pool.cap, self.pool.page_size,
                       self.target.config.vocab_size, self.target.dtype, self.device,
                       sampled)
            st.pieces = self.pieces(st)
            if self.cuda_graph:
                st.slots_in.copy_(torch.arange(B))
                st.graph = capture(lambda: self._run_step(st.pieces), self.device)
            self.batches[key] = st
        return self.batches[key]

    @torch.no_grad()
    def prefill(self, st, prompts, slots, max_new_tokens, temperature, seeds, top_k, top_p):
        """The pool takes the requests; each prompt but x0 goes into the target cache,
        each but x0 and its predecessor into the draft's (its first step feeds both),
        one request at a time (not timed)."""
        pool, dev, ps = self.pool, self.device, self.pool.page_size
        for b, (p, r) in enumerate(zip(prompts, slots, strict=True)):
            n = len(p)
            pool.ids[r, :n] = torch.tensor(p, device=dev)
            pool.seq_len[r], pool.seq_len_d[r] = n - 1, n - 2
            pool.limit[r] = n - 1 + max_new_tokens
            pool.last[r] = torch.tensor(p[-2:], device=dev)
            pool.temperature[r] = 0.0 if temperature is None else temperature[b]
            pool.seed[r] = 0 if seeds is None else seeds[b]
            pool.top_k[r] = 0 if top_k is None else top_k[b]
            pool.top_p[r] = 1.0 if top_p is None else top_p[b]
            pool.accepted[r], pool.live_steps[r] = 0, 0
            idx = torch.tensor([r], device=dev)
            for model, kv, m in ((self.target, self.kv_t, n - 1), (self.draft, self.kv_d, n - 2)):
                if m > 0:
                    md = self.ops.verify_metadata(idx, torch.zeros(1, dtype=torch.int64,
                                                                   device=dev),
                                                  pool.r2t, m, page_size=ps)
                    model.forward(pool.ids[r:r + 1, :m], md.positions[None],
                                  md.out_cache_loc[None], md.page_table, md.seqlens_k, kv)
        st.slots_in.copy_(torch.tensor(slots, device=dev))

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, *, temperature=None, seeds=None, top_k=None,
                 top_p=None, slots=None) -> Generation:
        """prompts: lists of >= 2 token ids. temperature, seeds (top_k, top_p): one per
        request (None: all greedy; T <= 0 is greedy too). slots: the pool slots."""
        B, K, N = len(prompts), self.K, max_new_tokens
        lens = [len(p) for p in prompts]
        if B == 0 or min(lens) < 2:
            raise ValueError(f"prompts: expected at least one, of at least 2 tokens each "
                             f"(the draft's first step reads x0's predecessor), got lengths "
                             f"{lens}")
        need = max(lens) + N + 2 * K + 2
        if need > self.pool.cap:
            raise ValueError(f"prompts, max_new_tokens: a request needs {need} positions "
                             f"(prompt + new tokens + 2K + 2), the pool has max_len="
                             f"{self.pool.cap}")
        slots = list(range(B)) if slots is None else list(slots)
        if len(set(slots)) != B or not all(0 <= s < self.pool.P for s in slots):
            raise ValueError(f"slots: expected {B} distinct slots in [0, {self.pool.P}), "
                             f"got {slots}")
        if (top_k is not None or top_p is not None) and temperature is None:
            raise ValueError("top_k, top_p: given without temperature")
        if (top_k is not None or top_p is not None) and not CONTROLS:
            raise NotImplementedError("top_k, top_p: this recipes.chain_verify has no "
                                      "sampling controls")
        st = self.batch(B, temperature is not None)
        self.prefill(st, prompts, slots, N, temperature, seeds, top_k, top_p)
        idx = torch.tensor(slots, device=self.device)
        step = st.graph.replay if st.graph is not None else \
            (lambda: self._run_step(st.pieces))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        steps, t0 = 0, time.perf_counter()
        while True:
            for _ in range(self.check_every):
                step()
            steps += self.check_every
            if bool((self.pool.seq_len[idx] >= self.pool.limit[idx]).all()):  # host read
                break
            if steps > N + self.check_every:
                raise RuntimeError(f"no progress after {steps} steps")
        seconds = time.perf_counter() - t0
        out = self.pool.ids[idx].tolist()
        tokens = [row[n:n + N] for row, n in zip(out, lens, strict=True)]
        acc = self.pool.accepted[idx].sum().item() / max(1, self.pool.live_steps[idx].sum()
                                                         .item())
        return Generation(tokens, acc, steps, seconds)


def capture(fn, device) -> torch.cuda.CUDAGraph:
    """fn as a CUDA graph, after one warm-up run on a side stream (as torch's docs do)."""
    main = torch.cuda.current_stream(device)
    warm = torch.cuda.Stream(device)
    warm.wait_stream(main)
    with torch.cuda.stream(warm):
        fn()
    main.wait_stream(warm)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize(device)
    return g


# --- checks ------------------------------------------------------------------------------
def random_prompts(vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def target_generate(hf, prompts, N):
    """The Hugging Face target's own greedy decoding, one prompt at a time."""
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=hf.device)
        seq = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N,
                          min_new_tokens=N, do_sample=False, pad_token_id=0)
        out.append(seq[0, len(p):].tolist())
    return out


@torch.no_grad()
def first_divergence(hf, prompt, got, want):
    """None if got == want, else (i, margin, top): the first index where they differ, the
    target's logit of want[i] minus that of got[i] after the common prefix, and the
    largest logit there, for scale."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            logits = hf(torch.tensor([prompt + want[:i]], device=hf.device)).logits[0, -1]
            logits = logits.float()
            return i, (logits[b] - logits[a]).item(), logits.max().item()
    return None


def run_check(args, device) -> int:
    size = "tiny" if device.type != "cuda" or args.tiny else "check"
    hf, target, draft = build(size, torch.float32, device, args.seed, arch=args.arch)
    prompts = random_prompts(hf.config.vocab_size, (5, 9, 2, 7) if size == "tiny"
                             else (17, 40, 2, 64), args.seed)
    N = args.new_tokens or (8 if size == "tiny" else 48)
    want = target_generate(hf, prompts, N)
    failed = []
    print(f"{size} {args.arch} model on {device}, {N} new tokens, ops={args.ops}, "
          f"graph={device.type == 'cuda'}")
    for K in args.K or [1, 3]:
        dec = SpecDecoder(target, draft, K, ops=args.ops, max_requests=8,
                          max_len=max(map(len, prompts)) + N + 2 * K + 2, page_size=4)
        for group in ([0], list(range(len(prompts)))):
            gen = dec.generate([prompts[i] for i in group], N, slots=group[::-1])
            bad = [(i, first_divergence(hf, prompts[i], t, want[i]))
                   for i, t in zip(group, gen.tokens, strict=True) if t != want[i]]
            failed += [f"K={K} B={len(group)}"] if bad else []
            print(f"  fp32 greedy K={K} B={len(group)}: "
                  + ("equal to generate" if not bad else f"DIFFERS {bad}")
                  + f" ({gen.mean_accepted:.2f} accepted a step)")
    temps, seeds = [(0.7, 0.0, 1.0, 0.7)[i % 4] for i in range(len(prompts))], \
        [100 + i for i in range(len(prompts))]
    dec = SpecDecoder(target, draft, 3, ops=args.ops, max_requests=8,
                      max_len=max(map(len, prompts)) + N + 8, page_size=4)
    a, b = (dec.generate(prompts, N, temperature=temps, seeds=seeds) for _ in range(2))
    alone = SpecDecoder(target, draft, 1, ops=args.ops, max_requests=8,
                        max_len=max(map(len, prompts)) + N + 8, page_size=4).generate(
        prompts[:1], N, temperature=temps[:1], seeds=seeds[:1], slots=[5])
    ok = a.tokens == b.tokens and a.tokens[1] == want[1]
    failed += [] if ok else ["sampled run to run / greedy row"]
    print(f"  sampled T=0.7/1.0 with greedy rows, run to run: {'the same' if ok else 'DIFFER'}")
    ok = alone.tokens[0] == a.tokens[0] or args.ops == "torch"
    failed += [] if ok else ["sampled alone vs batch"]
    print(f"  sampled, alone (K=1, another slot) vs in the batch: "
          f"{'the same' if ok else 'DIFFER'}" + (" (torch RNG: not checked)"
                                                  if args.ops == "torch" else ""))
    print("FAILED: " + ", ".join(failed) if failed else "all exact checks passed")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Top-1 chain speculative decoding, the whole step one CUDA graph, over "
                    "a paged Llama with a random-weight Hugging Face model's weights; the "
                    "spec-cookbook recipes vs plain torch.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="lossless: fp32 greedy tokens == the HF model's generate, K in "
                           "{1,3}, batches 1 and 4")
    mode.add_argument("--bench", action="store_true",
                      help="tokens/s, ms/step, acceptance, GPU busy and per-piece kernel "
                           "time, recipes vs plain torch -> results/<gpu>/spec-decode.md "
                           "and .json (CPU: a tiny smoke run)")
    p.add_argument("--ops", choices=sorted(OPS), default="recipes")
    p.add_argument("--arch", choices=("llama", "qwen2"), default="llama")
    p.add_argument("--K", type=int, nargs="+", help="draft lengths")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (--bench)")
    p.add_argument("--new-tokens", type=int, help="new tokens a request")
    p.add_argument("--layers", type=int, help="target layers (--bench; default 4)")
    p.add_argument("--runs", type=int, default=2, help="timed runs a loop (--bench)")
    p.add_argument("--tiny", action="store_true", help="the tiny model, even on a GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="report path (--bench; the .json goes beside it)")
    p.add_argument("--mix", choices=("mixed", "greedy"), default="mixed",
                   help="requests of the bench: mixed (every other one samples at T=0.7 "
                        "with top_k=20, top_p=0.95) or all greedy (--bench)")
    args = p.parse_args(argv)
    args.command = shlex.join(["python", "examples/spec_decode.py",
                               *(sys.argv[1:] if argv is None else argv)])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.check:
        return run_check(args, device)
    if args.bench:
        from spec_bench import run_bench
        return run_bench(args, device)
    hf, target, draft = build("tiny" if device.type != "cuda" or args.tiny else "check",
                              torch.float32, device, args.seed, arch=args.arch)
    prompts = random_prompts(hf.config.vocab_size, (6, 3), args.seed)
    for K in args.K or [3]:
        gen = SpecDecoder(target, draft, K, ops=args.ops).generate(prompts, args.new_tokens or 8)
        print(f"K={K}: {gen.steps} steps, {gen.mean_accepted:.2f} drafts accepted a step")
        for p_, t in zip(prompts, gen.tokens, strict=True):
            print(f"  {p_} -> {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
