"""The EAGLE-3 drafter network, in the three published layouts (config: methods/eagle3/config.py).

One (or a few) Llama- or Qwen3-shaped layers run autoregressively beside the target. Entry
i of the drafter's sequence pairs the target's fused features at position i (its taps,
concatenated, through `fc`) with the token at position i + 1, at RoPE position i; the
first layer's q/k/v read cat(input_layernorm(embedding), hidden_norm(hidden)), 2H wide, and
its residual is the hidden input (or, under `norm_before_residual`, its normed form). The
last layer's output (pre-norm) is the entry's hidden: `norm` + `lm_head` give the logits of
the token after it, and a chain step feeds that hidden back in with the token just drafted.
The drafter's K/V of committed entries stay in its own static cache across steps.

The embedding is the target's (EAGLE's `load_emb`), unless the drafter's width differs.
The head is the checkpoint's [draft_vocab, H] rows with `d2t` mapping a draft index j to
target id j + d2t[j]; DeepSpec's full-vocabulary copy of the target's head is skipped for
the target's own after a shape check, as DSpark's copies are.

DeepSpec's Gemma 4 drafter (`Gemma4Eagle3Model`) has the same entries and chain with Gemma
4's layer (models/layers/gemma4.py: global-layer heads, q/k/v norms, unscaled scores,
proportional RoPE, four norms, GELU MLP, layer scalar) reading 2H in every layer; its
embedding is the target's scaled one (sqrt(H), as Gemma's) and its logits are soft-capped.

Entries run two ways: `forward` at the cache's host-side length (the sync loop), and
`forward_static` at a position held in device memory, writing K/V with `index_copy_` and
attending under a mask built on the device, so a CUDA graph of it replays at any length
(the device-resident loop, methods/eagle3/chain.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.linear import linear
from specgen.kernels.rmsnorm import rms_norm
from specgen.methods.eagle3.config import Eagle3Args, check_pair
from specgen.models.cache.kv import StaticKVCache
from specgen.models.drafters.gemma4 import draft_layer_shape
from specgen.models.formats.weights import DenseWeight, LinearWeight, new_weight
from specgen.models.layers.blocks import norm_weight
from specgen.models.layers.decoder import DecoderLayer
from specgen.models.layers.gemma4 import GemmaLayer
from specgen.models.layers.rope import rope_tables
from specgen.models.loading import SafetensorsIndex, fill, read_config
from specgen.models.plans import Plan, Row
from specgen.models.transformer import Transformer, attention_mask, device_positions

# (layer, q, k, v, score scale) -> the attention output [1, nq, T, d], keys written first
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor]


class Eagle3Net(nn.Module):
    def __init__(self, args: Eagle3Args, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        la, w = args.layers, dict(dtype=dtype, device=device)
        h, taps, th = la.hidden_size, len(args.taps), args.target_hidden
        self.args, self.dtype = args, dtype
        self.fc = new_weight(h, taps * th, **w)
        # registered (ParameterList), so they move, train and save with the rest
        fc_norms = [new_weight(th, **w) for _ in range(taps)] if args.fc_norm else []
        self.fc_norms = nn.ParameterList(fc_norms)
        self.input_norm = new_weight(taps * th, **w) if args.norm_before_fc else None
        self.layers = nn.ModuleList(self._layer(i, dtype, device) for i in range(la.num_layers))
        nw = norm_weight(la, dtype, device)  # Gemma's in fp32, as its layers' own
        self.hidden_norms = nn.ParameterList(nw(h) for i in range(la.num_layers) if self.fused(i))
        self.norm = nw(h)
        # the head: the checkpoint's draft rows, or (DeepSpec) the target's own
        own_head = not args.target_head
        self.lm_head: LinearWeight = DenseWeight(args.draft_vocab, h, **w) if own_head else None
        self.embed = DenseWeight(la.vocab_size, h, **w) if args.own_embed else None
        # draft index -> target id (identity for a full-vocabulary drafter)
        self.to_target = torch.arange(args.draft_vocab, device=device)
        self._cos = self._sin = torch.empty(0, la.head_dim, dtype=dtype, device=device)

    def fused(self, layer: int) -> bool:
        """Whether this layer reads cat(embedding, hidden) (2H) rather than the hidden."""
        return layer == 0 or self.args.every_layer_fused

    def _layer(self, i: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
        la, wide = self.args.layers, 2 * self.args.layers.hidden_size if self.fused(i) else None
        if self.args.gemma is None:
            return DecoderLayer(la, dtype, device, in_features=wide)
        shape = draft_layer_shape(la, self.args.gemma, i)
        return GemmaLayer(shape, dtype, device, in_features=wide)

    @property
    def device(self) -> torch.device:
        return self.fc.device

    def plan(self) -> Plan:
        a, la = self.args, self.args.layers
        h, th, taps = la.hidden_size, a.target_hidden, len(a.taps)
        yield Row("fc.weight", self.fc, (h, taps * th))
        for i, weight in enumerate(self.fc_norms):
            yield Row(f"fc_norm.{i}.weight", weight, (th,))
        if self.input_norm is not None:
            yield Row("input_norm.weight", self.input_norm, (taps * th,))
        yield Row("norm.weight", self.norm, (h,))
        if self.lm_head is not None:
            yield Row("lm_head.weight", self.lm_head, (a.draft_vocab, h))
        if a.own_embed:
            yield Row("embed_tokens.weight", self.embed, (la.vocab_size, h))
        for i, layer in enumerate(self.layers):
            prefix = a.layer_prefix(i)
            yield from layer.plan(prefix)
            if self.fused(i):
                yield Row(prefix + "hidden_norm.weight", self.hidden_norms[i], (h,))

    def new_cache(self, capacity: int) -> StaticKVCache:
        la = self.args.layers
        if self._cos.shape[0] < capacity:
            self._cos, self._sin = rope_tables(
                la.rope, la.head_dim, capacity, dtype=self.dtype, device=self.device
            )
        return StaticKVCache(
            num_layers=la.num_layers,
            batch=1,
            num_kv_heads=la.num_kv_heads,
            head_dim=la.head_dim,
            capacity=capacity,
            dtype=self.dtype,
            device=self.device,
        )

    def project(self, features: torch.Tensor) -> torch.Tensor:  # [.., K*Ht] -> [.., H]
        """The target's concatenated taps through the optional norms and `fc`."""
        eps = self.args.layers.rms_norm_eps
        if self.input_norm is not None:  # speculators' norm_before_fc
            features = rms_norm(features, self.input_norm, eps)
        if len(self.fc_norms):  # one norm per tap
            chunks = features.chunk(len(self.fc_norms), dim=-1)
            features = torch.cat(
                [rms_norm(c, w, eps) for c, w in zip(chunks, self.fc_norms, strict=True)], -1
            )
        return linear(features, self.fc, None)

    @torch.inference_mode()
    def forward(
        self,
        target: Transformer,
        ids: torch.Tensor,  # [1, T] the entries' tokens (target ids)
        hidden: torch.Tensor,  # [1, T, H] the entries' hidden inputs
        cache: StaticKVCache,
    ) -> torch.Tensor:  # [1, T, H] the entries' hidden outputs, fed back by a chain step
        """Run T entries at positions [cache.length, +T), causally, and commit them."""
        start, t = cache.length, ids.shape[1]
        cos, sin = self._cos[start : start + t], self._sin[start : start + t]
        mask, causal = attention_mask(start, t, None, None, ids.device)

        def attend(i, q, k, v, scale):
            keys, values = cache.write(i, k, v)
            return attention(q, keys, values, mask, causal, scale=scale)

        def plain(i, layer, x):
            return layer(x, cos, sin, cache, i, mask, causal)

        x = self._entries(target, ids, hidden, cos, sin, attend, plain)
        cache.commit(start + t)
        return x

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
        nothing (the caller knows the length): no host value, no shape that depends on it."""
        positions, length, cos, sin = device_positions(start, ids.shape[1], self._cos, self._sin)

        def attend(i, q, k, v, scale):
            cache.write_at(i, positions, k, v)
            slot = cache.slot(i)
            return block_attention(q, cache.k[slot], cache.v[slot], length, True, None, scale)

        def plain(i, layer, x):
            return layer.forward_static(x, cos, sin, cache, i, positions, length)

        return self._entries(target, ids, hidden, cos, sin, attend, plain)

    def _entries(self, target, ids, hidden, cos, sin, attend: Attend, plain) -> torch.Tensor:
        """The layers over T entries; `attend` writes each layer's K/V and attends, `plain`
        runs a layer that reads the hidden alone (speculators' later layers)."""
        a = self.args
        eps = a.layers.rms_norm_eps
        # the target's embedding as its first layer sees it (Gemma's scaled by sqrt(H))
        emb = target.embed_tokens(ids) if self.embed is None else self.embed.lookup(ids)
        x = hidden
        for i, layer in enumerate(self.layers):
            if not self.fused(i):
                x = plain(i, layer, x)
                continue
            e = rms_norm(emb, layer.attn_norm, eps)
            normed = rms_norm(x, self.hidden_norms[i], eps)
            residual = normed if a.norm_before_residual and i == 0 else x
            both = torch.cat([e, normed], dim=-1)
            if a.gemma is not None:  # Gemma's layer: scores unscaled, no output gate
                q, (k, v) = layer.qkv_of(both, cos, sin)
                x = layer._output(residual, attend(i, q, k, v, 1.0))
            else:
                q, k, v, gate = layer.qkv_of(both, cos, sin)
                x = layer._output(residual, attend(i, q, k, v, None), gate)
        return rms_norm(x, self.norm, eps) if a.feed_normed else x

    def logits(self, target: Transformer, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] hidden outputs -> [.., draft_vocab] logits (draft indices)."""
        a = self.args
        normed = hidden if a.feed_normed or not a.logits_normed else None
        if normed is None:
            normed = rms_norm(hidden, self.norm, a.layers.rms_norm_eps)
        logits = (target.lm_head if self.lm_head is None else self.lm_head)(normed)
        if a.softcap is None:
            return logits
        return torch.tanh(logits / a.softcap) * a.softcap  # DeepSpec Gemma's final cap


def load_eagle3(path: Path, *, target: Transformer, target_name: str, name: str) -> Eagle3Net:
    """Load an EAGLE-3 drafter in any published layout for `target`, checked as a pair."""
    cfg = read_config(path, name)
    args = Eagle3Args.from_hf(cfg, num_target_layers=target.args.num_layers, name=name)
    index = SafetensorsIndex(path, name)
    d2t = index.get("d2t", target.device) if "d2t" in index.where else None
    t2d = index.get("t2d", target.device) if "t2d" in index.where else None
    fc = index.shape("fc.weight") if "fc.weight" in index.where else None
    head = index.shape("lm_head.weight") if "lm_head.weight" in index.where else None
    to_target = check_pair(args, target.args, name, target_name, d2t=d2t, t2d=t2d, fc=fc, head=head)
    net = Eagle3Net(args, dtype=target.dtype, device=target.device)
    fill(net.plan(), index, net.device)
    net.to_target = to_target.to(net.device)
    return net.eval()
