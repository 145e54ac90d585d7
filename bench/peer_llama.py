"""peer_llama.py — the PyTorch peer kiln is measured against: a static-KV-cache Llama in the
gpt-fast design (github.com/pytorch-labs/gpt-fast, model.py and generate.py), written here from
that description, not copied:

- fused matmuls: one Q|K|V weight [(H + 2 KV) * hd, D] and one gate|up weight [2 F, D] per layer;
- prefill: the prompt's K and V written into a static cache, attention by SDPA (causal, GQA
  through enable_gqa), logits for every position (as gpt-fast's prefill and kiln compute them);
- decode: one token against the cache's first `decode_len` positions with a position mask (a
  static shape, so torch.compile(mode="reduce-overhead") replays it from a CUDA graph);
- Hugging Face's numerics: RMSNorm in float32 then cast, RoPE on halves (rotate_half) with
  float32 angles cast to the model's dtype, SiLU(gate) * up.

bench/prefill_bench.py builds it from a Hugging Face LlamaForCausalLM's weights, checks it
against Hugging Face in float32, compiles it and times it.
"""
import torch
import torch.nn.functional as F
from torch import nn


def _sdpa_has_gqa():
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


SDPA_GQA = _sdpa_has_gqa()  # F.scaled_dot_product_attention(enable_gqa=...) exists (torch 2.5+)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps):
    """Hugging Face's LlamaRMSNorm: statistics in float32, the product in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


class Layer(nn.Module):
    def __init__(self, c, dtype, device, max_len, batch=1):
        super().__init__()
        D, H, KV, hd, Fi = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], \
            c["intermediate_size"]
        e = dict(dtype=dtype, device=device)
        p = lambda *shape: nn.Parameter(torch.empty(*shape, **e), requires_grad=False)  # noqa: E731
        self.wqkv, self.wo = p((H + 2 * KV) * hd, D), p(D, H * hd)
        self.w13, self.w2 = p(2 * Fi, D), p(D, Fi)
        self.attn_norm, self.ffn_norm = p(D), p(D)
        self.register_buffer("k_cache", torch.zeros(batch, KV, max_len, hd, **e))
        self.register_buffer("v_cache", torch.zeros(batch, KV, max_len, hd, **e))
        self.H, self.KV, self.hd, self.Fi, self.eps = H, KV, hd, Fi, c["rms_norm_eps"]

    def caches(self, B):
        """The K and V caches of sequences 0..B-1 (a slice even when B is all of them: no guard on B's
        value, so one compile with B dynamic serves every batch size)."""
        return self.k_cache[:B], self.v_cache[:B]

    def qkv(self, x, cos, sin):
        """x [B, T, D] (normed) -> q [B, H, T, hd], k and v [B, KV, T, hd], RoPE applied."""
        B, T = x.shape[0], x.shape[1]
        q, k, v = F.linear(x, self.wqkv).split([self.H * self.hd, self.KV * self.hd, self.KV * self.hd], dim=-1)
        q = q.view(B, T, self.H, self.hd).transpose(1, 2)
        k = k.view(B, T, self.KV, self.hd).transpose(1, 2)
        v = v.view(B, T, self.KV, self.hd).transpose(1, 2)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def mlp(self, x):
        g, u = F.linear(rms_norm(x, self.ffn_norm, self.eps), self.w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, self.w2)

    def prefill(self, x, cos, sin):
        """Positions 0..T-1 of B empty sequences (cache rows 0..B-1)."""
        B, T = x.shape[0], x.shape[1]
        q, k, v = self.qkv(rms_norm(x, self.attn_norm, self.eps), cos, sin)
        pos = torch.arange(T, device=x.device)  # index_copy_, not a slice assignment: no guards on T's value
        kc, vc = self.caches(B)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        if SDPA_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            g = self.H // self.KV
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, self.H * self.hd), self.wo)
        return self.mlp(x)

    def decode(self, x, pos, cos, sin, mask, L):
        """One token of each of B sequences (cache rows 0..B-1), all at position pos ([1] int64),
        attending to cache positions < L where mask."""
        B = x.shape[0]
        q, k, v = self.qkv(rms_norm(x, self.attn_norm, self.eps), cos, sin)
        kc, vc = self.caches(B)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        g = self.H // self.KV
        qg = q.view(B, self.KV, g, self.hd)  # query head h reads KV head h // g, as HF's repeat_kv
        s = torch.matmul(qg, kc[:, :, :L].transpose(-1, -2)).float() * self.hd ** -0.5
        w = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).to(x.dtype)
        y = torch.matmul(w, vc[:, :, :L])  # [B, KV, g, hd]
        x = x + F.linear(y.reshape(B, 1, self.H * self.hd), self.wo)
        return self.mlp(x)


class PeerLlama(nn.Module):
    """The model; max_len positions of cache for each of `batch` sequences, decode over the first
    decode_len of them (a batch decodes sequences of one length: bench/prefill_bench.py's batched
    decode times steps of B sequences at one context, as kiln bench --batch does)."""

    def __init__(self, cfg, dtype, device, max_len, decode_len, batch=1):
        super().__init__()
        c = dict(cfg)
        c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
        if c.get("rope_scaling") or c.get("rope_parameters", {}).get("rope_type", "default") != "default":
            raise ValueError("peer_llama: RoPE scaling is not implemented (the bench's configs have none)")
        e = dict(dtype=dtype, device=device)
        self.embed = nn.Parameter(torch.empty(c["vocab_size"], c["hidden_size"], **e), requires_grad=False)
        self.layers = nn.ModuleList(Layer(c, dtype, device, max_len, batch) for _ in range(c["num_hidden_layers"]))
        self.norm = nn.Parameter(torch.empty(c["hidden_size"], **e), requires_grad=False)
        self.lm_head = nn.Parameter(torch.empty(c["vocab_size"], c["hidden_size"], **e), requires_grad=False)
        hd = c["head_dim"]
        theta = c.get("rope_theta", c.get("rope_parameters", {}).get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
        ang = torch.outer(torch.arange(max_len, device=device).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos())  # float32 [max_len, hd]; cast to x's dtype where used
        self.register_buffer("sin", ang.sin())
        self.eps, self.max_len, self.decode_len = c["rms_norm_eps"], max_len, decode_len
        self.cfg = c

    @torch.no_grad()
    def load_hf(self, hf_model):
        """Copy (and fuse) the weights of a Hugging Face LlamaForCausalLM."""
        sd = hf_model.state_dict()
        cp = lambda dst, src: dst.copy_(src.to(dst.dtype))  # noqa: E731
        cp(self.embed, sd["model.embed_tokens.weight"])
        cp(self.norm, sd["model.norm.weight"])
        cp(self.lm_head, sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
        for i, l in enumerate(self.layers):
            pre = f"model.layers.{i}."
            cp(l.wqkv, torch.cat([sd[pre + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
            cp(l.wo, sd[pre + "self_attn.o_proj.weight"])
            cp(l.w13, torch.cat([sd[pre + "mlp.gate_proj.weight"], sd[pre + "mlp.up_proj.weight"]]))
            cp(l.w2, sd[pre + "mlp.down_proj.weight"])
            cp(l.attn_norm, sd[pre + "input_layernorm.weight"])
            cp(l.ffn_norm, sd[pre + "post_attention_layernorm.weight"])
            for n in "qkvo":
                if pre + f"self_attn.{n}_proj.bias" in sd:
                    raise ValueError("peer_llama: attention biases are not implemented")

    @torch.no_grad()
    def share_weights(self, other):
        """Take other's weights (the same tensors, no copy): a second cache shape over one model."""
        for name in ("embed", "norm", "lm_head"):
            setattr(self, name, getattr(other, name))
        for mine, theirs in zip(self.layers, other.layers):
            for name in ("wqkv", "wo", "w13", "w2", "attn_norm", "ffn_norm"):
                setattr(mine, name, getattr(theirs, name))

    def prefill(self, ids):
        """ids [B, T] of empty sequences -> the last position's logits [B, 1, vocab] in the model's
        dtype: what the first generated token needs (as Hugging Face's generate, logits_to_keep=1, and
        vLLM compute; kiln's engine too when only draws are wanted)."""
        T = ids.shape[1]
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for l in self.layers:
            x = l.prefill(x, cos, sin)
        return F.linear(rms_norm(x[:, -1:], self.norm, self.eps), self.lm_head)

    def decode(self, ids, pos):
        """ids [B, 1] at position pos ([1] int64, below decode_len) -> logits [B, 1, vocab]."""
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos].to(x.dtype), self.sin[pos].to(x.dtype)
        mask = torch.arange(self.decode_len, device=ids.device) <= pos
        for l in self.layers:
            x = l.decode(x, pos, cos, sin, mask, self.decode_len)
        return F.linear(rms_norm(x, self.norm, self.eps), self.lm_head)
