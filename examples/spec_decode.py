#!/usr/bin/env python
"""Speculative decoding with the recipes: a top-1 chain draft (EAGLE/MTP-style) over two
Hugging Face causal LMs, a target and a smaller draft (Llama configs, random weights).

    python examples/spec_decode.py --check    # lossless checks (fp32 exact, bf16 reported)
    python examples/spec_decode.py --bench    # vs plain torch: results/<gpu>/spec-decode.md

One step, for a batch of B requests drafting K tokens each:

    draft    K forwards of the draft model. After each, `recipes.draft_tail` takes the argmax
             of the logits (sampled requests: of logits/T + Gumbel noise), writes it into the
             verify inputs and advances the draft position. Beside them, on a side stream,
             `recipes.verify_metadata` builds the verify's positions and page table.
    verify   one target forward over [x0, d1 .. dK], K+1 positions a request.
    tail     one CUDA graph: `recipes.copy_inputs` has put the verify's hidden states into its
             static input; lm_head, `recipes.chain_verify` (the target token of every row,
             argmax or Gumbel-max sample, and the accepted prefix), the commit,
             `recipes.relay_scatter` of every request's new state into the request pool and
             `recipes.relay_gather` of the next step's inputs out of it.
    crop     both KV caches drop the columns past the longest accepted prefix (the step's
             one host sync reads the accepted lengths).

On CPU the same code runs without the side stream and the graph (the recipes under the
Triton interpreter). `--ops torch` runs the loop with plain torch in place of every
recipe (torch.argmax, the accept logic in torch, index gathers): the benchmark's baseline.

KV caches with per-row lengths
------------------------------
A Hugging Face `DynamicCache` holds one range of columns for the whole batch, but rows
accept different numbers of drafts. So every request keeps, in the pool, `seq_len` (the
number of its tokens the target cache holds, which is also the position of `x0`, its
last committed token, not yet in the cache) and a table per model, `req_to_token[r, p]`
= the cache column holding its token at position p (after the prefill, right-padded to
the longest prompt, column = position). A step appends K+1 columns for every row; row b
commits the first m_b + 1 of them (x0 and its m_b accepted drafts) and the other K - m_b
columns become holes that no position points at any more. The caches are then cropped
by K - max_b m_b columns (the holes that every row has); the holes of rows that accepted
fewer stay. Each forward gets

    position_ids   = the true positions (verify_metadata's positions, L_b + j)
    attention_mask = 1 on exactly the columns that the page table lists (req_to_token of
                     positions 0 .. L_b + K), so holes and padding are masked

and Hugging Face adds causality by column (a verify token sees the columns before its
own). Every query thus attends to exactly the keys of its own prefix, at their true
positions: the same function as decoding one token at a time. Only float rounding differs
(K+1-row GEMMs, masked columns in the softmax sums): in float32 the output equals the
target's own greedy `generate`, token for token (tested); in bfloat16 `--check` reports
how often the two round to different tokens and at what logit margin. The price of the
holes: at most K columns a row a step of memory and attention work, never a wrong key.
The draft cache works the same way, with its own table (the draft recomputes x0's
predecessor each round, so its K+1 columns are [x0's predecessor, x0, d1 .. d_{K-1}]).

Sampling, and why it stays lossless
-----------------------------------
A request samples when its temperature T > 0 (others stay greedy in the same batch). The
target token of each verified row is the Gumbel-max sample argmax(logits/T + g), with g
from Philox(seed, position) (`chain_verify`'s stream). The draft samples too, with the same
noise: it proposes argmax(draft_logits/T + g) for the same seed and position, a top-1
draft that puts probability 1 on its token. Whatever the draft proposes, the token
emitted at position p is the target's sample with the noise of p (an accepted draft equals
it; otherwise the bonus is it), so the output is exactly autoregressive Gumbel-max
sampling of the target: each token ~ softmax(logits/T) given its prefix, the noise of
different positions independent. It is a function of (seed, prompt) alone: reproducible,
the same alone or in any batch, for any K and any draft. Sharing the noise only raises
acceptance (a draft equal to the target accepts every draft); a greedy draft would be
just as exact, and accepted less often.

Not covered: stop tokens (every request runs to max_new_tokens), requests joining or
leaving a running batch (the pool and relay are where an engine would do that), EAGLE's
feature-level draft (`draft_tail`'s hidden= gather) and draft vocabularies (`token_map=`).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import inspect
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # the recipes run under the interpreter
sys.path.insert(0, str(ROOT))                        # this checkout's recipes

import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import recipes  # noqa: E402
from recipes.chain_verify import accept, row_scores, target_tokens  # noqa: E402
from recipes.verify_metadata import engine_torch  # noqa: E402


# --- models ------------------------------------------------------------------------------
def llama_config(vocab, hidden, layers, heads, kv_heads, intermediate, init=0.02):
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, initializer_range=init,
                       max_position_embeddings=8192, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_target(config, dtype=torch.float32, device="cpu", seed=0):
    """A randomly initialised LlamaForCausalLM (nothing is downloaded)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def soften_deep_layers(target, n_layers, scale):
    """Scale the output projections of the target's layers past the first n_layers. With
    random weights every layer adds about as much to the residual stream as the first,
    and a draft made of the first layer alone would almost never be accepted: a small
    scale makes acceptance partial, as with a trained draft."""
    for layer in target.model.layers[n_layers:]:
        layer.self_attn.o_proj.weight.data.mul_(scale)
        layer.mlp.down_proj.weight.data.mul_(scale)


def draft_from(target, n_layers):
    """The draft: the target's first n_layers with its embedding, final norm and lm_head
    (the same modules, nothing copied), as a LlamaForCausalLM of its own."""
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = n_layers
    with torch.device("meta"):
        draft = LlamaForCausalLM(cfg)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:n_layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    return draft.eval()


def _cache_kwarg(model) -> str:
    """transformers 5.x renames past_key_values to cache (the old name still works for a
    while, with a warning); 4.x knows only past_key_values."""
    params = inspect.signature(model.model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# --- the hot paths: recipes, or the same in plain torch -----------------------------------
class TorchOps:
    """What each recipe replaces, in plain torch, with the recipes' signatures."""

    @staticmethod
    def draft_tail(logits, *, positions, draft_tokens, column, out=None):
        tok = torch.argmax(logits, dim=-1)
        draft_tokens[:, column] = tok
        positions += 1
        return recipes.DraftTail(tok, None, None)

    @staticmethod
    def chain_verify(logits, draft_tokens, *, out, temperature=None, seeds=None,
                     positions=None):
        B, K = draft_tokens.shape
        if temperature is None:
            t = torch.argmax(logits, dim=-1).view(B, K + 1)
        else:   # the same Gumbel-max stream, Philox in torch integer ops
            t = target_tokens(logits, B, K, temperature, seeds, positions)
        for o, r in zip(out, accept(t, draft_tokens), strict=True):   # cumprod, gathers
            o.copy_(r)
        return out

    @staticmethod
    def relay_scatter(index, fields):
        for src, dst in fields:
            dst.index_copy_(0, index, src.to(dst.dtype))

    @staticmethod
    def relay_gather(index, fields):
        for src, dst in fields:
            dst.copy_(src.index_select(0, index))

    @staticmethod
    def copy_inputs(pairs):
        for dst, src in pairs:
            dst.copy_(src.view_as(dst))

    @staticmethod
    def verify_metadata(req_pool_indices, seq_lens, req_to_token, num_tokens, *, out):
        md = engine_torch(req_pool_indices, seq_lens, req_to_token, num_tokens)
        for o, r in zip(out, md, strict=True):
            if o is not None:
                o.copy_(r)
        return out


OPS = {"recipes": recipes, "torch": TorchOps}


# --- state -------------------------------------------------------------------------------
def _zeros(device):
    return lambda *shape, dt=torch.int64: torch.zeros(shape, dtype=dt, device=device)


class Pool:
    """Per-request state, indexed by pool slot (what an engine keeps between steps)."""

    def __init__(self, P, cap, device):
        z = _zeros(device)
        self.seq_len = z(P)           # tokens in the target cache = position of x0
        self.last = z(P, 2)           # (x0's predecessor, x0): the draft's first inputs
        self.seed = z(P)
        self.temperature = z(P, dt=torch.float32)
        self.ids = z(P, cap)          # token id at each position (prompt and output)
        self.r2t = z(P, cap, dt=torch.int32)   # target cache column of each position
        self.r2d = z(P, cap, dt=torch.int32)   # draft cache column of each position


class Batch:
    """The static buffers of one batch: the step's inputs, the tail graph's input and
    outputs, both models' attention metadata and masks."""

    def __init__(self, B, K, cap, hidden, dtype, device, sampled):
        z = _zeros(device)
        self.B, self.K, self.cap, self.sampled = B, K, cap, sampled
        self.idx = z(B)               # pool slots (req_pool_indices)
        self.seq_lens = z(B)          # L: target tokens cached; x0 sits at position L
        self.lens_d = z(B)            # L - 1: draft tokens cached
        self.pos_d = z(B)             # position of the draft's current input
        self.pair = z(B, 2)           # the draft's first inputs (x0's predecessor, x0)
        self.vids = z(B, K + 1)       # verify inputs [x0, d1 .. dK]; draft_tail fills 1..K
        self.seeds = z(B)
        self.temp = z(B, dt=torch.float32)
        self.j = torch.arange(K + 1, device=device)
        self.h = z(B * (K + 1), hidden, dt=dtype)   # the tail graph's input
        self.res = recipes.VerifyResult(z(B, K + 1, dt=torch.int32), z(B, dt=torch.int32),
                                        z(B, dt=torch.int32), z(B))
        self.report = z(2, B)         # accepted drafts, new seq_len: read by the host
        self.tok = z(B)
        self.probs = z(B, dt=torch.float32)
        md = lambda: recipes.VerifyMetadata(  # noqa: E731  (all of "fa3": no allocation)
            positions=z(B * (K + 1)), out_cache_loc=z(B * (K + 1)),
            seqlens_k=z(B, dt=torch.int32), cu_seqlens_q=z(B + 1, dt=torch.int32),
            cu_seqlens_k=z(B + 1, dt=torch.int32), max_seqlen_k=z(1, dt=torch.int32),
            page_table=z(B, cap, dt=torch.int32))
        self.md_t, self.md_d = md(), md()
        self.mask_t = z(B, cap + 1)   # last column: where page-table padding (-1) lands
        self.mask_d = z(B, cap + 1)
        self.graph = None


@dataclass
class Generation:
    tokens: list            # per request: max_new_tokens ids
    accepted: list          # per step: accepted drafts of each request still generating
    steps: int
    seconds: float          # the decode loop (after prefill), wall time
    phase_ms: dict | None = None   # CUDA: GPU time a step of draft / verify / tail

    def mean_accepted(self) -> float:
        flat = [m for step in self.accepted for m in step]
        return sum(flat) / max(1, len(flat))


# --- the loop ----------------------------------------------------------------------------
class SpecDecoder:
    """Top-1 chain speculative decoding: K drafts a step, verified by the target (two
    Hugging Face Llama-style causal LMs of one vocabulary). ops: "recipes", or "torch"
    for the same loop in plain torch. side_stream, cuda_graph: on CUDA. timing: CUDA
    events around each step's phases."""

    def __init__(self, target, draft, K, *, ops="recipes", side_stream=True, cuda_graph=True,
                 timing=False):
        if K < 1:
            raise ValueError(f"K: expected at least 1 draft token, got {K}")
        self.target, self.draft, self.K = target, draft, K
        self.ops = OPS[ops]
        self.device = target.lm_head.weight.device
        cuda = self.device.type == "cuda"
        self.side = torch.cuda.Stream(self.device) if cuda and side_stream else None
        self.cuda_graph = cuda and cuda_graph
        self.timing = cuda and timing
        self.kw_t, self.kw_d = _cache_kwarg(target), _cache_kwarg(draft)

    # -- one forward: the caches grow by the input's columns
    def _forward(self, model, kw, ids, mask, pos, cache):
        out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                          use_cache=True, **{kw: cache})
        return out.last_hidden_state

    def _side(self):
        if self.side is None:
            return contextlib.nullcontext()
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.side)

    # -- attention metadata of the K+1 tokens a model is about to append at columns
    #    S .. S+K: positions from verify_metadata, the mask from its page table
    def _metadata(self, st, md, r2c, lens, S, mask):
        r2c[st.idx[:, None], lens[:, None] + st.j] = (S + st.j).to(torch.int32)
        self.ops.verify_metadata(st.idx, lens, r2c, self.K + 1, out=md)
        pt = md.page_table
        mask.zero_()
        mask.scatter_(1, torch.where(pt >= 0, pt, st.cap).long(), 1)

    # -- the draft proposes d1 .. dK into vids[:, 1:]
    def _draft(self, st, Sd, cache):
        B, K = st.B, self.K
        x, pos, width = st.pair, st.md_d.positions.view(B, K + 1)[:, :2], Sd + 2
        for k in range(K):
            h = self._forward(self.draft, self.kw_d, x, st.mask_d[:, :width], pos, cache)
            logits = self.draft.lm_head(h[:, -1])
            if st.sampled:   # Gumbel-max with the target's noise (seed, input position)
                s = row_scores(logits, B, 0, st.temp, st.seeds, st.pos_d)
                logits = torch.where(st.temp[:, None] > 0, s, logits.float())
            self.ops.draft_tail(logits, positions=st.pos_d, draft_tokens=st.vids[:, 1:],
                                column=k, out=recipes.DraftTail(st.tok, st.probs, None))
            x, pos, width = st.vids[:, k + 1:k + 2], st.pos_d[:, None], width + 1

    # -- the tail (one CUDA graph): verify, commit, relay
    def _tail(self, st, pool):
        ops = self.ops
        logits = self.target.lm_head(st.h)                   # [B*(K+1), V]
        kw = dict(temperature=st.temp, seeds=st.seeds, positions=st.seq_lens) \
            if st.sampled else {}
        res = ops.chain_verify(logits, st.vids[:, 1:], out=st.res, **kw)
        m = res.accept_len.long()
        new_len = st.seq_lens + m + 1   # x0 and the m accepted drafts are now cached
        # the next x0 is the bonus; its predecessor is input m of this verify
        pair = torch.stack([st.vids.gather(1, m[:, None])[:, 0], res.bonus.long()], dim=1)
        # the emitted tokens, at positions L+1 .. L+m+1 (the -1s after are overwritten
        # by later steps before they count)
        pool.ids[st.idx[:, None], st.seq_lens[:, None] + 1 + st.j] = res.tokens.long()
        ops.relay_scatter(st.idx, [(new_len, pool.seq_len), (pair, pool.last)])
        self._lay_out(st, pool)
        ops.copy_inputs([(st.report[0], m), (st.report[1], new_len)])   # for the host

    def _lay_out(self, st, pool):
        """The next step's inputs, in batch order, out of the pool."""
        self.ops.relay_gather(st.idx, [
            (pool.seq_len, st.seq_lens), (pool.seq_len, st.pos_d), (pool.last, st.pair),
            (pool.last[:, 1:], st.vids[:, :1]), (pool.seed, st.seeds),
            (pool.temperature, st.temp)])
        torch.sub(st.seq_lens, 1, out=st.lens_d)

    def _capture(self, st, pool):
        """The tail as a CUDA graph. The warm-up compiles the kernels and sizes the
        recipes' shared stage-2 workspace at the tail's B*(K+1) rows, more than any
        later eager call needs (draft_tail: B, or at most one slot a multiprocessor),
        so it never moves under the graph. It runs before the pool is filled: what it
        writes there is overwritten."""
        main = torch.cuda.current_stream(self.device)
        warm = torch.cuda.Stream(self.device)
        warm.wait_stream(main)
        with torch.cuda.stream(warm):
            self._tail(st, pool)
        main.wait_stream(warm)
        st.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(st.graph):
            self._tail(st, pool)

    def _prefill(self, st, pool, prompts, temperature, seeds):
        """The pool takes the prompts; the caches take them right-padded to the longest,
        column = position: the target all but x0 (the last prompt token), the draft all
        but x0 and its predecessor (its first step feeds both). Returns the caches."""
        dev, B = self.device, st.B
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        n_max = max(len(p) for p in prompts)
        ids = torch.zeros(B, n_max, dtype=torch.int64, device=dev)
        for b, p in enumerate(prompts):
            ids[b, :len(p)] = torch.tensor(p)
        pool.ids[st.idx, :n_max] = ids
        pool.r2t[st.idx] = torch.arange(st.cap, dtype=torch.int32, device=dev)
        pool.r2d[st.idx] = pool.r2t[st.idx]
        pool.seq_len[st.idx] = lens - 1
        pool.last[st.idx] = torch.tensor([p[-2:] for p in prompts], device=dev)
        if temperature is not None:
            pool.temperature[st.idx] = torch.tensor(temperature, dtype=torch.float32,
                                                    device=dev)
            pool.seed[st.idx] = torch.tensor(seeds, dtype=torch.int64, device=dev)
        cache_t, cache_d = transformers.DynamicCache(), transformers.DynamicCache()
        cols = torch.arange(n_max, device=dev)
        for model, kw, cache, n in ((self.target, self.kw_t, cache_t, 1),
                                    (self.draft, self.kw_d, cache_d, 2)):
            if n_max > n:
                # the padding is masked, except column 0: no query row may be wholly
                # masked (the draft row of a 2-token prompt); no later mask lists it
                c = cols[:n_max - n]
                mask = (c < lens[:, None] - n) | (c == 0)
                self._forward(model, kw, ids[:, :n_max - n], mask.long(), c.expand(B, -1),
                              cache)
        self._lay_out(st, pool)
        return cache_t, cache_d

    def _step(self, st, pool, cache_t, cache_d, S, Sd, e):
        """One step; S, Sd: the caches' lengths. Returns (accepted drafts, new seq_len),
        one of each a request: the host's copy of the tail's report."""
        B, K = st.B, self.K
        with self._side():   # the verify's metadata, beside the draft
            self._metadata(st, st.md_t, pool.r2t, st.seq_lens, S, st.mask_t)
        if self.side is not None:
            ready = torch.cuda.Event()
            ready.record(self.side)
        self._metadata(st, st.md_d, pool.r2d, st.lens_d, Sd, st.mask_d)
        self._draft(st, Sd, cache_d)
        self._mark(e, 1)
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_event(ready)
        h = self._forward(self.target, self.kw_t, st.vids, st.mask_t[:, :S + K + 1],
                          st.md_t.positions.view(B, K + 1), cache_t)
        self._mark(e, 2)
        self.ops.copy_inputs([(st.h, h)])
        if st.graph is not None:
            st.graph.replay()
        else:
            self._tail(st, pool)
        self._mark(e, 3)
        return st.report.tolist()   # the step's host sync

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, *, temperature=None, seeds=None,
                 slots=None) -> Generation:
        """prompts: lists of >= 2 token ids. temperature, seeds: one per request (None:
        all greedy; T <= 0 is greedy too). slots: the requests' pool slots (0 .. B-1)."""
        B, K, N, dev = len(prompts), self.K, max_new_tokens, self.device
        lens = [len(p) for p in prompts]
        if min(lens) < 2:
            raise ValueError(f"prompts: expected at least 2 tokens each (the draft's first "
                             f"step reads x0's predecessor), got lengths {lens}")
        slots = list(range(B)) if slots is None else list(slots)
        cap = max(lens) + (N + 1) * (K + 1)   # positions and columns: <= N steps
        pool = Pool(max(slots) + 1, cap, dev)
        st = Batch(B, K, cap, self.target.config.hidden_size,
                   self.target.lm_head.weight.dtype, dev, sampled=temperature is not None)
        st.idx.copy_(torch.tensor(slots))
        # (torch's Philox, in the plain-torch sampled verify, makes host tensors: no graph)
        if self.cuda_graph and not (st.sampled and self.ops is TorchOps):
            self._capture(st, pool)
        cache_t, cache_d = self._prefill(st, pool, prompts, temperature, seeds)
        S, Sd = max(lens) - 1, max(lens) - 2

        emitted, accepted, ev = [0] * B, [], [] if self.timing else None
        t0 = time.perf_counter()
        while min(emitted) < N:
            live = [n < N for n in emitted]
            m, new_len = self._step(st, pool, cache_t, cache_d, S, Sd, self._events(ev))
            cut = K - max(m)           # the columns past every row's accepted prefix
            if cut:
                cache_t.crop(-cut)
                cache_d.crop(-cut)
            S, Sd = S + K + 1 - cut, Sd + K + 1 - cut
            assert cache_t.get_seq_length() == S and cache_d.get_seq_length() == Sd
            emitted = [n_new - n + 1 for n_new, n in zip(new_len, lens, strict=True)]
            accepted.append([mb for mb, lv in zip(m, live, strict=True) if lv])
        seconds = time.perf_counter() - t0
        out = pool.ids[st.idx].tolist()
        tokens = [row[n:n + N] for row, n in zip(out, lens, strict=True)]
        return Generation(tokens, accepted, len(accepted), seconds, self._phases(ev))

    # -- CUDA events around the phases of each step (timing=True)
    @staticmethod
    def _events(ev):
        if ev is None:
            return None
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        e[0].record()
        ev.append(e)
        return e

    @staticmethod
    def _mark(e, i):
        if e is not None:
            e[i].record()

    @staticmethod
    def _phases(ev):
        if not ev:
            return None
        names = ("draft", "verify", "tail")
        n = len(ev)
        return {name: sum(e[i].elapsed_time(e[i + 1]) for e in ev) / n
                for i, name in enumerate(names)}


# --- checks ------------------------------------------------------------------------------
def random_prompts(vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def target_generate(target, prompts, N):
    """The target's own greedy decoding, one prompt at a time (no padding)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=target.device)
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N,
                              min_new_tokens=N, do_sample=False, pad_token_id=0)
        out.append(seq[0, len(p):].tolist())
    return out


@torch.no_grad()
def first_divergence(target, prompt, got, want):
    """None if got == want, else (i, margin, top): the first index where they differ, the
    target's logit of want[i] minus that of got[i] after the common prefix (one fresh
    forward) and the largest logit there, for scale."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            ids = torch.tensor([prompt + want[:i]], device=target.device)
            logits = target(ids).logits[0, -1].float()
            return i, (logits[b] - logits[a]).item(), logits.max().item()
    return None


def check_greedy(target, draft, prompts, N, Ks, groups, ops="recipes"):
    """The loop against target_generate for every K and group of prompts (a group is one
    batch). One record per (K, group)."""
    want = target_generate(target, prompts, N)
    records = []
    for K in Ks:
        dec = SpecDecoder(target, draft, K, ops=ops)
        for group in groups:
            gen = dec.generate([prompts[i] for i in group], N)
            div = [(i, first_divergence(target, prompts[i], t, want[i]))
                   for i, t in zip(group, gen.tokens, strict=True)]
            records.append(dict(K=K, B=len(group), gen=gen,
                                diverged=[(i, d) for i, d in div if d is not None]))
    return records


def check_sampled(target, draft, prompts, N, K, ops="recipes"):
    """Sampled requests (one greedy among them): run twice, then the first request alone
    at another pool slot with K=1. Returns (batch run, repeat, alone)."""
    B = len(prompts)
    temps = [(0.7, 1.0, 0.0, 1.5)[b % 4] for b in range(B)]
    seeds = [1000 + 7 * b for b in range(B)]
    dec = SpecDecoder(target, draft, K, ops=ops)
    slots = list(range(B))[::-1]
    a = dec.generate(prompts, N, temperature=temps, seeds=seeds, slots=slots)
    b = dec.generate(prompts, N, temperature=temps, seeds=seeds, slots=slots)
    alone = SpecDecoder(target, draft, 1, ops=ops).generate(
        prompts[:1], N, temperature=temps[:1], seeds=seeds[:1], slots=[B + 2])
    return a, b, alone


def check_self_draft(target, prompts, N, K, ops="recipes"):
    """The target as its own draft: every live request accepts all K drafts each step,
    greedy and sampled (same noise). Returns the two Generations."""
    dec = SpecDecoder(target, target, K, ops=ops)
    g = dec.generate(prompts, N)
    s = dec.generate(prompts, N, temperature=[0.9] * len(prompts),
                     seeds=list(range(len(prompts))))
    return g, s


def all_accepted(gen, K) -> bool:
    return all(m == K for step in gen.accepted for m in step)


# --- command line: --check, --bench ------------------------------------------------------
# (vocab, hidden, layers, heads, kv heads, intermediate, init), draft layers, deep_scale
SIZES = {
    "tiny": ((256, 64, 2, 4, 2, 128, 0.05), 1, 0.3),          # CPU: the interpreter
    "check": ((32000, 1024, 4, 8, 2, 3584, 0.02), 1, 0.2),
    "bench": ((151936, 4096, 4, 32, 8, 14336, 0.02), 1, 0.15),
}


def build(size, dtype, device, seed=0, layers=None, deep_scale=None):
    """(target, draft) of one of SIZES."""
    shape, n_draft, scale = SIZES[size]
    shape = list(shape)
    if layers:
        shape[2] = layers
    target = make_target(llama_config(*shape), dtype, device, seed)
    soften_deep_layers(target, n_draft, scale if deep_scale is None else deep_scale)
    return target, draft_from(target, n_draft)


def say_divergence(rec):
    n = rec["B"]
    if not rec["diverged"]:
        return f"all {n} equal"
    parts = [f"prompt {i}: token {d[0]} (logit margin {d[1]:.3g}, top logit {d[2]:.3g})"
             for i, d in rec["diverged"]]
    return f"{n - len(parts)}/{n} equal; first divergence " + "; ".join(parts)


def run_check(args, device) -> int:
    size = "tiny" if device.type != "cuda" or args.tiny else "check"
    target, draft = build(size, torch.float32, device, args.seed, deep_scale=args.deep_scale)
    V = target.config.vocab_size
    prompts = random_prompts(V, (5, 9, 2, 7) if size == "tiny" else (17, 40, 2, 64), args.seed)
    N = args.new_tokens or (8 if size == "tiny" else 48)
    groups = [[0], [0, 1, 2, 3]] if size == "tiny" else [[0], [1], [2], [3], [0, 1, 2, 3]]
    Ks = args.K or [1, 3, 5]
    failed = []

    def verdict(what, ok, say):
        failed.extend([] if ok else [what])
        print(f"  {what}: {say}")

    print(f"{size} model on {device}, {N} new tokens, ops={args.ops}")
    for rec in check_greedy(target, draft, prompts, N, Ks, groups, args.ops):
        verdict(f"fp32 greedy K={rec['K']} B={rec['B']}", not rec["diverged"],
                f"{say_divergence(rec)} ({rec['gen'].mean_accepted():.2f} accepted a step)")
    a, b, alone = check_sampled(target, draft, prompts, N, max(Ks), args.ops)
    verdict("sampled, run to run", a.tokens == b.tokens, "the same tokens"
            if a.tokens == b.tokens else "DIFFERENT tokens")
    ok = alone.tokens[0] == a.tokens[0]
    verdict("sampled, alone (K=1) vs in the batch", ok,
            "the same tokens" if ok else "DIFFERENT tokens")
    for what, gen in zip(("greedy", "sampled"), check_self_draft(target, prompts, N, max(Ks),
                                                                 args.ops), strict=True):
        ok = all_accepted(gen, max(Ks))
        verdict(f"target as its own draft, {what}", ok,
                "every draft accepted" if ok else f"NOT all accepted: {gen.accepted}")

    print("bfloat16, reported (a forward over K+1 positions rounds differently from one "
          "position at a time)")
    t16 = copy.deepcopy(target).to(torch.bfloat16)
    d16 = draft_from(t16, SIZES[size][1])
    for rec in check_greedy(t16, d16, prompts, N, Ks, groups, args.ops):
        print(f"  bf16 greedy K={rec['K']} B={rec['B']}: {say_divergence(rec)}")
    print("FAILED: " + ", ".join(failed) if failed else "all exact checks passed")
    return 1 if failed else 0


def _versions(device) -> str:
    import triton
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        "CPU (Triton interpreter, tiny smoke model: not a measurement)"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{what}, torch {torch.__version__}, triton {triton.__version__}, "
            f"transformers {transformers.__version__}, {when}")


def _lm_head_ms(target, rows, repeat=20):
    """GPU time of the tail's lm_head GEMM alone (the same in both loops)."""
    h = torch.zeros(rows, target.config.hidden_size, dtype=target.lm_head.weight.dtype,
                    device=target.lm_head.weight.device)
    target.lm_head(h)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(repeat):
        target.lm_head(h)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / repeat


def _timed(target, draft, K, prompts, N, repeat, **kw):
    """The median (by wall time) of `repeat` runs after one more (the same sizes: it
    compiles every kernel the runs use)."""
    dec = SpecDecoder(target, draft, K, timing=True, **kw)
    dec.generate(prompts, N)
    runs = sorted((dec.generate(prompts, N) for _ in range(repeat)), key=lambda g: g.seconds)
    return runs[len(runs) // 2]


def run_bench(args, device) -> int:
    cuda = device.type == "cuda"
    size = "bench" if cuda and not args.tiny else "tiny"
    dtype = torch.bfloat16 if cuda else torch.float32
    target, draft = build(size, dtype, device, args.seed, args.layers, args.deep_scale)
    V, H = target.config.vocab_size, target.config.hidden_size
    N = args.new_tokens or (128 if cuda else 4)
    if args.batch or args.K:
        pairs = [(B, K) for B in args.batch or [4] for K in args.K or [3]]
    else:   # a batch sweep at K=3 and a K sweep at B=4
        pairs = [(1, 3), (4, 1), (4, 3), (4, 5), (16, 3)] if cuda else [(2, 2)]
    repeat = args.repeat or (3 if cuda else 1)
    B_max = max(B for B, _ in pairs)
    lengths = [32 + 24 * (i % 5) if cuda else 3 + i % 4 for i in range(B_max)]
    prompts = random_prompts(V, lengths, args.seed)
    loops = [("recipes", {}), ("torch", {"ops": "torch"})]
    if cuda:
        loops.append(("recipes, no side stream", {"side_stream": False}))
    rows, lossless, side, last = [], [], [], None
    t0 = time.perf_counter()
    for B, K in pairs:
        got = {name: _timed(target, draft, K, prompts[:B], N, repeat, **kw)
               for name, kw in loops}
        lm_head = f"{_lm_head_ms(target, B * (K + 1)):.3f}" if cuda else "-"
        for name, gen in got.items():
            ph = gen.phase_ms or {}
            rows.append([B, K, name, f"{B * N / gen.seconds:.0f}",
                         f"{1e3 * gen.seconds / gen.steps:.3f}",
                         f"{gen.mean_accepted() + 1:.2f}",
                         *(f"{ph[p]:.3f}" if p in ph else "-"
                           for p in ("draft", "verify", "tail")), lm_head])
        same = (got["recipes"].tokens, got["recipes"].accepted) == \
            (got["torch"].tokens, got["torch"].accepted)
        lossless.append(f"B={B} K={K}: the recipes and torch loops emit "
                        + ("the same tokens" if same else "DIFFERENT tokens"))
        if "recipes, no side stream" in got:
            on, off = got["recipes"], got["recipes, no side stream"]
            saved = 1e3 * (off.seconds / off.steps - on.seconds / on.steps)
            side.append(f"B={B} K={K}: {saved:+.3f} ms a step (the draft phase, which "
                        f"holds the metadata when inline: {off.phase_ms['draft']:.3f} ms "
                        f"GPU without the side stream, {on.phase_ms['draft']:.3f} with it)")
        if B == B_max:
            last = (B, K, got["recipes"])
    # against the target's own generate: the first few prompts of the largest batch
    B, K, gen = last
    n_ref = min(4, B)
    want = target_generate(target, prompts[:n_ref], N)
    div = [first_divergence(target, prompts[i], gen.tokens[i], want[i]) for i in range(n_ref)]
    seconds = time.perf_counter() - t0

    head = ["B", "K", "loop", "tokens/s", "ms/step", "tokens/step", "draft ms", "verify ms",
            "tail ms", "of which lm_head"]
    md = ["# Speculative decoding loop: recipes vs plain torch", "", _versions(device), "",
          f"Made by `{args.command}`.", "",
          f"Target: Llama, hidden {H}, {target.config.num_hidden_layers} layers, V={V}, "
          f"{str(dtype).replace('torch.', '')}, random weights; draft: its first "
          f"{draft.config.num_hidden_layers} layer(s), norm and lm_head (the deeper layers' "
          f"output projections scaled to make acceptance partial). {B_max} prompts of "
          f"{min(lengths)}-{max(lengths)} tokens, {N} new tokens a request, greedy; the median "
          f"of {repeat} runs after a warm-up; {seconds:.0f} s in all. tokens/s: B x new "
          "tokens over the decode loop (prefill excluded). tokens/step: the mean acceptance "
          "length (accepted drafts + the bonus) a request a step. draft/verify/tail ms: GPU "
          "time a step (CUDA events); of which lm_head: the tail's lm_head GEMM timed alone. "
          "The loops differ in the tail (one CUDA graph: lm_head, chain_verify, relay, "
          "copies), in draft_tail after each draft forward and in verify_metadata; the "
          "model forwards are the same Hugging Face eager code.", "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    md += ["", "## Lossless", ""] + [f"- {x}" for x in lossless]
    md.append(f"- against the target's own `generate` ({str(dtype).replace('torch.', '')}, "
              f"one prompt at a time), the recipes loop at B={B}, K={K}: " + "; ".join(
                  f"prompt {i}: equal" if d is None else
                  f"prompt {i}: first differs at token {d[0]} (logit margin {d[1]:.3g}, "
                  f"top logit {d[2]:.3g})" for i, d in enumerate(div)))
    if side:
        md += ["", "## Side stream (verify_metadata beside the draft forwards)", ""]
        md += [f"- {x}" for x in side]
    text = "\n".join(md) + "\n"
    out = Path(args.out) if args.out else _results_dir(device) / "spec-decode.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0 if all("same tokens" in x for x in lossless) else 1


def _results_dir(device) -> Path:
    """results/<gpu>/ where this user's results go (recipes.tables.results_root)."""
    from recipes.tables import gpu_slug, results_root
    return results_root() / gpu_slug(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Top-1 chain speculative decoding over Hugging Face causal LMs with the "
                    "spec-cookbook recipes (random-weight Llama target and draft).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="lossless checks: fp32 greedy == target.generate for K in {1,3,5} "
                           "and batches 1 and 4, sampled reproducibility and batch "
                           "independence, self-draft acceptance; bf16 divergence report")
    mode.add_argument("--bench", action="store_true",
                      help="tokens/s, ms/step and acceptance, recipes vs plain torch, "
                           "-> results/<gpu>/spec-decode.md (CPU: a tiny smoke run)")
    p.add_argument("--ops", choices=sorted(OPS), default="recipes")
    p.add_argument("--K", type=int, nargs="+", help="draft lengths")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (--bench)")
    p.add_argument("--new-tokens", type=int, help="new tokens a request")
    p.add_argument("--layers", type=int, help="target layers (--bench; default 4)")
    p.add_argument("--deep-scale", type=float,
                   help="scale of the target's deeper layers' output projections")
    p.add_argument("--repeat", type=int, help="timed runs a configuration (--bench)")
    p.add_argument("--tiny", action="store_true", help="the tiny model, even on a GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="report path (--bench)")
    args = p.parse_args(argv)
    args.command = shlex.join(["python", "examples/spec_decode.py",
                               *(sys.argv[1:] if argv is None else argv)])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.check:
        return run_check(args, device)
    if args.bench:
        return run_bench(args, device)
    # default: a short demo
    target, draft = build("tiny" if device.type != "cuda" or args.tiny else "check",
                          torch.float32, device, args.seed)
    prompts = random_prompts(target.config.vocab_size, (6, 3), args.seed)
    for K in args.K or [3]:
        gen = SpecDecoder(target, draft, K, ops=args.ops).generate(prompts, args.new_tokens or 8)
        print(f"K={K}: {gen.steps} steps, {gen.mean_accepted():.2f} drafts accepted a step")
        for p_, t in zip(prompts, gen.tokens, strict=True):
            print(f"  {p_} -> {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
