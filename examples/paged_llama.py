"""A compact Llama-architecture model (RMSNorm, RoPE, GQA, SwiGLU; Qwen2's q/k/v biases
too) whose attention runs over a paged KV cache, the way a serving engine's does.

It holds no weights of its own: `PagedLlama.from_hf` takes the tensors of a Hugging Face
`LlamaForCausalLM` / `Qwen2ForCausalLM` (the same storage, nothing copied), so the loop
that drives it can be tied to that model's own `generate`.

The cache: one K and one V tensor per layer, `[pages * page_size, kv_heads, head_dim]`;
a token lives at a *slot* (page * page_size + offset). A forward gets, for each of its
B x T input tokens, its position and slot (`verify_metadata`'s `positions` and
`out_cache_loc`), writes its K and V there, and attends through the request's page table
(`page_table`, -1 past its pages) to its first `seqlens_k` keys, causally by position:
what FA3's paged kernel reads. Here the pages are gathered into a dense `[B, keys]` view
and handed to torch's scaled_dot_product_attention with that mask (fixed shapes, so the
forward can be captured in a CUDA graph).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class PagedKV:
    """K and V of every layer over a pool of `pages` pages of `page_size` slots."""

    def __init__(self, layers, pages, page_size, kv_heads, head_dim, dtype, device):
        shape = (layers, pages * page_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size


def _rms_norm(x, w, eps):
    """Hugging Face's LlamaRMSNorm: in float32, the weight applied in the input dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PagedLlama:
    """The decoder stack over a `PagedKV`; `forward` returns the final-normed hidden
    states, `logits` applies lm_head."""

    def __init__(self, hf, layers=None):
        cfg = hf.config
        m = hf.model
        n = cfg.num_hidden_layers if layers is None else layers
        self.config = cfg
        self.n_layers = n
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.embed = m.embed_tokens.weight
        self.norm = m.norm.weight
        self.lm_head_w = hf.lm_head.weight
        self.inv_freq = m.rotary_emb.inv_freq
        self.rope_scale = float(getattr(m.rotary_emb, "attention_scaling", 1.0))
        self.scale = self.head_dim ** -0.5

        def lin(mod):
            return (mod.weight, mod.bias)

        self.layers = [dict(ln1=L.input_layernorm.weight, ln2=L.post_attention_layernorm.weight,
                            q=lin(L.self_attn.q_proj), k=lin(L.self_attn.k_proj),
                            v=lin(L.self_attn.v_proj), o=lin(L.self_attn.o_proj),
                            gate=lin(L.mlp.gate_proj), up=lin(L.mlp.up_proj),
                            down=lin(L.mlp.down_proj))
                       for L in m.layers[:n]]

    @classmethod
    def from_hf(cls, hf, layers=None) -> PagedLlama:
        """The model of `hf` (its first `layers` decoder layers, default all, with its
        embedding, final norm and lm_head)."""
        return cls(hf, layers)

    @property
    def dtype(self):
        return self.embed.dtype

    @property
    def device(self):
        return self.embed.device

    def new_cache(self, pages, page_size) -> PagedKV:
        return PagedKV(self.n_layers, pages, page_size, self.kv_heads, self.head_dim,
                       self.dtype, self.device)

    def _rope(self, positions):
        """cos, sin [B, T, 1, head_dim] as Hugging Face's rotary embedding makes them."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(self.dtype)
        sin = (emb.sin() * self.rope_scale).to(self.dtype)
        return cos[:, :, None], sin[:, :, None]

    def _attend(self, q, layer, kv, page_table, seqlens_k, positions):
        """q [B, T, heads, d] against the request's cached keys through its page table."""
        B, P = page_table.shape
        ps = kv.page_size
        pages = page_table.clamp(min=0).long()          # -1 (no page): masked below
        k = kv.k[layer].view(-1, ps, self.kv_heads, self.head_dim)[pages]
        v = kv.v[layer].view(-1, ps, self.kv_heads, self.head_dim)[pages]
        k = k.view(B, P * ps, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, P * ps, self.kv_heads, self.head_dim).transpose(1, 2)
        key = torch.arange(P * ps, device=q.device)
        mask = (key[None, None, :] < seqlens_k[:, None, None]) \
            & (key[None, None, :] <= positions[:, :, None])    # [B, T, keys]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None],
                                           scale=self.scale, enable_gqa=True)
        return o.transpose(1, 2).reshape(B, q.shape[1], self.heads * self.head_dim)

    def forward(self, ids, positions, slots, page_table, seqlens_k, kv: PagedKV):
        """ids, positions, slots: [B, T]; page_table [B, pages]; seqlens_k [B]. Writes
        the T tokens' K and V at their slots, returns hidden [B, T, H] (final-normed)."""
        B, T = ids.shape
        x = F.embedding(ids, self.embed)
        cos, sin = self._rope(positions)
        flat_slots = slots.reshape(-1)
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["ln1"], self.eps)
            q = F.linear(h, *w["q"]).view(B, T, self.heads, self.head_dim)
            k = F.linear(h, *w["k"]).view(B, T, self.kv_heads, self.head_dim)
            v = F.linear(h, *w["v"]).view(B, T, self.kv_heads, self.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kv.k[i].index_copy_(0, flat_slots, k.reshape(B * T, self.kv_heads, self.head_dim))
            kv.v[i].index_copy_(0, flat_slots, v.reshape(B * T, self.kv_heads, self.head_dim))
            a = self._attend(q, i, kv, page_table, seqlens_k, positions)
            x = x + F.linear(a, *w["o"])
            h = _rms_norm(x, w["ln2"], self.eps)
            x = x + F.linear(F.silu(F.linear(h, *w["gate"])) * F.linear(h, *w["up"]),
                             *w["down"])
        return _rms_norm(x, self.norm, self.eps)

    def logits(self, hidden, out=None):
        """lm_head: [R, H] -> [R, V] (into `out` when given)."""
        return torch.mm(hidden, self.lm_head_w.t(), out=out)
