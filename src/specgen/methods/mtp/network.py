"""A model's own multi-token-prediction layer (Qwen3.5's `mtp.*`), as vLLM's
`Qwen3_5MultiTokenPredictor` and SGLang's NEXTN run it.

Entry i pairs the target's last hidden state at position i (after its final norm: what
its head reads) with the token at i + 1, at RoPE position i:

    x = fc(cat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(hidden)))
    x = layers[0](x)            # a full-attention decoder layer, with its own KV cache
    out = norm(x)               # the entry's hidden: the target's head gives its logits

`out` predicts the token after the entry's token, and a chain step feeds it back as the
next entry's hidden with the token it drafted. The embedding and head are the target's
(none are stored with the head). Norms are zero-centred (1 + w) like the target's.

Entries run two ways, as EAGLE-3's: `forward` at the cache's host-side length (the sync
loop), and `forward_static` at a position held in device memory (the device-resident loop,
CUDA graphs).
"""

from __future__ import annotations

import torch
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.kv import StaticKVCache
from specgen.models.formats.weights import DenseWeight
from specgen.models.layers.blocks import norm_weight
from specgen.models.layers.decoder import DecoderLayer
from specgen.models.layers.rope import rope_tables
from specgen.models.plans import Plan, Row
from specgen.models.transformer import Transformer, attention_mask, device_positions

PREFIX = "mtp."  # where published checkpoints keep the head (beside `model.*`)


class MtpNet(nn.Module):
    def __init__(self, args: ModelArgs, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        h, nw = args.hidden_size, norm_weight(args, dtype, device)
        self.args, self.dtype = args, dtype
        self.fc = DenseWeight(h, 2 * h, dtype=dtype, device=device)
        self.norm_embedding, self.norm_hidden, self.norm = nw(h), nw(h), nw(h)
        # the target's full-attention layer shape: gated q_proj, q/k norms, partial RoPE
        self.layer = DecoderLayer(args, dtype, device)
        self._cos = self._sin = torch.empty(0, args.rope_dim, dtype=dtype, device=device)

    @property
    def device(self) -> torch.device:
        return self.fc.device

    def plan(self) -> Plan:
        h = self.args.hidden_size
        yield Row(PREFIX + "fc.weight", self.fc, (h, 2 * h))
        yield Row(PREFIX + "pre_fc_norm_embedding.weight", self.norm_embedding, (h,))
        yield Row(PREFIX + "pre_fc_norm_hidden.weight", self.norm_hidden, (h,))
        yield Row(PREFIX + "norm.weight", self.norm, (h,))
        yield from self.layer.plan(PREFIX + "layers.0.")

    def finish_load(self) -> None:
        """Zero-centred norms (the target's `norm_offset`): scale = 1 + w, added once."""
        if not self.args.norm_offset:
            return
        layer = self.layer
        for w in (self.norm_embedding, self.norm_hidden, self.norm, layer.attn_norm,
                  layer.ffn_norm, layer.q_norm, layer.k_norm):  # fmt: skip
            if w is not None:
                w.data.add_(1.0)

    def new_cache(self, capacity: int) -> StaticKVCache:
        a = self.args
        if self._cos.shape[0] < capacity:
            self._cos, self._sin = rope_tables(
                a.rope, a.rope_dim, capacity, dtype=self.dtype, device=self.device
            )
        return StaticKVCache(
            num_layers=1, batch=1, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim,
            capacity=capacity, dtype=self.dtype, device=self.device,
        )  # fmt: skip

    def _input(self, target: Transformer, ids: torch.Tensor, hidden: torch.Tensor):
        eps = self.args.rms_norm_eps
        emb = rms_norm(target.embed_tokens(ids), self.norm_embedding, eps)
        both = torch.cat([emb, rms_norm(hidden, self.norm_hidden, eps)], dim=-1)
        return self.fc(both.to(self.dtype), None)

    @torch.inference_mode()
    def forward(
        self,
        target: Transformer,
        ids: torch.Tensor,  # [1, T] the entries' tokens
        hidden: torch.Tensor,  # [1, T, H] the entries' hidden inputs
        cache: StaticKVCache,
    ) -> torch.Tensor:  # [1, T, H] the entries' (normed) hidden outputs
        """Run T entries at positions [cache.length, +T), causally, and commit them."""
        start, t = cache.length, ids.shape[1]
        cos, sin = self._cos[start : start + t], self._sin[start : start + t]
        mask, causal = attention_mask(start, t, None, None, ids.device)
        x = self.layer(self._input(target, ids, hidden), cos, sin, cache, 0, mask, causal)
        cache.commit(start + t)
        return rms_norm(x, self.norm, self.args.rms_norm_eps)

    @torch.inference_mode()
    def forward_static(
        self,
        target: Transformer,
        ids: torch.Tensor,  # [1, T]
        hidden: torch.Tensor,  # [1, T, H]
        cache: StaticKVCache,
        start: torch.Tensor,  # [1] int64 on the device: the first entry's position
    ) -> torch.Tensor:  # [1, T, H]
        """`forward` at a position in device memory, causal over [0, start + T), committing
        nothing (the caller knows the length)."""
        positions, length, cos, sin = device_positions(start, ids.shape[1], self._cos, self._sin)
        x = self._input(target, ids, hidden)
        x = self.layer.forward_static(x, cos, sin, cache, 0, positions, length)
        return rms_norm(x, self.norm, self.args.rms_norm_eps)

    def logits(self, target: Transformer, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] normed hidden outputs -> [.., V] through the target's own head."""
        return target.head(hidden)
