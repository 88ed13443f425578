"""The DFlash drafter network, in z-lab's published format (`DFlashDraftModel`).

A few Qwen3-style layers (q/k RMSNorm) whose keys and values come from two places:
- context: the target's hidden states after `target_layer_ids` for every committed token,
  concatenated, fused by `fc` + `hidden_norm`, then projected by each layer's k/v weights
  (k_norm and RoPE at the token's absolute position). These are computed once per
  committed token and kept in a static cache (`extend`), rolled back with the target.
- the block: [anchor, MASK x (B-1)] embedded with the target's embedding, at positions
  anchor_pos .. anchor_pos+B-1. Queries come from the block only; each attends to every
  context key strictly before the block and, non-causally, to the whole block. Block K/V
  are written after the context but never committed, so they vanish after the pass.
The final `norm` output goes through the target's LM head (the checkpoint has neither an
embedding nor a head). Slot k of the block predicts the token at anchor_pos + k.
As z-lab's reference does, the block embeds with the target's raw embedding table times the
config's `input_embedding_scale`, and the drafter's logits are the raw head's times
`output_multiplier`, then soft-capped by its `final_logit_softcapping` (its Gemma 4
drafters; all three read from `dflash_config` first, then the top level). DeepSpec's Gemma 4
drafters (models/drafters/gemma4.py) put Gemma layers in the same frame, with Gemma's sqrt(H)
embedding scale and their config's final soft-cap.
Layers marked `sliding_attention` see only the block slots up to their own (unless the
config's `is_causal` says otherwise) and, under `use_sliding_window`, only keys within
`sliding_window` positions: z-lab's reference (PyPI `dflash`) reads its configs so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specgen.core.config import ModelArgs
from specgen.core.errors import CheckpointError
from specgen.kernels.linear import linear
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.kv import StaticKVCache
from specgen.models.drafters.gemma4 import (
    GemmaDraftArgs,
    draft_layer_shape,
    gemma_layers_from_hf,
    is_gemma_draft,
)
from specgen.models.families import model_args
from specgen.models.formats.weights import new_weight
from specgen.models.layers.decoder import DecoderLayer
from specgen.models.layers.gemma4 import GemmaLayer
from specgen.models.layers.rope import rope_tables
from specgen.models.loading import SafetensorsIndex, fill, read_config
from specgen.models.plans import Plan, Row
from specgen.models.transformer import Transformer, device_positions


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default when a config names no layers: spread from layer 1 to N-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [
        int(round(start + i * (end - start) / (num_draft_layers - 1)))
        for i in range(num_draft_layers)
    ]


@dataclass(frozen=True)
class DFlashArgs:
    layers: ModelArgs  # the drafter's own decoder layers
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    windows: tuple[int | None, ...]  # per layer: sliding window, or None for full attention
    # per layer: whether block slot i sees only slots <= i of its own block. z-lab's rule:
    # sliding-window layers are causal, full ones not, unless the config's `is_causal` says
    causal: tuple[bool, ...] = ()
    is_causal: bool | None = None  # the config's field, as given (written back by training)
    gemma: GemmaDraftArgs | None = None  # Gemma draft layers (DeepSpec's Gemma 4 drafters)
    embed_scale: float = 1.0  # the block's embedding: the target's raw table times this,
    embed_scale_rounded: bool = False  # the factor rounded to the model dtype first (Gemma)
    logit_scale: float = 1.0  # the drafter's logits: raw head logits times this,
    softcap: float | None = None  # then c * tanh(logits / c)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, name: str) -> DFlashArgs:
        nested = cfg.get("dflash_config") or {}
        gemma = None
        if is_gemma_draft(cfg):
            layers, gemma = gemma_layers_from_hf(cfg, name)
        else:
            # the drafter's windows are per layer (layer_types), not the target-style flag
            layers = model_args({**cfg, "use_sliding_window": False}, name=name)
            layers = replace(layers, family="qwen3", qk_norm=True)  # DFlash layers have them
        mask = nested.get("mask_token_id", cfg.get("mask_token_id"))
        if mask is None:
            raise CheckpointError(f"{name}: config.json has no dflash_config.mask_token_id")
        num_target = cfg.get("num_target_layers")
        ids = nested.get("target_layer_ids", cfg.get("target_layer_ids"))
        if ids is None:
            if num_target is None:
                raise CheckpointError(
                    f"{name}: config.json names neither target layers nor their count"
                )
            ids = build_target_layer_ids(int(num_target), layers.num_layers)
        types = cfg.get("layer_types") or ["full_attention"] * layers.num_layers
        # as z-lab's reference reads it (through transformers' Qwen3Config): the window of
        # the sliding layers applies only under `use_sliding_window`
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        if len(types) != layers.num_layers:
            raise CheckpointError(
                f"{name}: layer_types has {len(types)} entries for {layers.num_layers} layers"
            )
        if cfg.get("use_sliding_window") and "sliding_attention" in types and not window:
            raise CheckpointError(f"{name}: sliding_attention layers but no sliding_window")
        windows = tuple(int(window) if t == "sliding_attention" and window else None for t in types)
        explicit = cfg.get("is_causal")
        causal = tuple(
            (t == "sliding_attention") if explicit is None else bool(explicit) for t in types
        )
        return cls(
            layers=layers,
            block_size=int(nested.get("block_size", cfg.get("block_size", 16))),
            mask_token_id=int(mask),
            target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=None if num_target is None else int(num_target),
            windows=windows,
            causal=causal,
            is_causal=None if explicit is None else bool(explicit),
            gemma=gemma,
            **_scales(cfg, nested, gemma is not None, layers.hidden_size, name),
        )


def _scales(
    cfg: dict[str, Any], nested: dict[str, Any], gemma: bool, hidden: int, name: str
) -> dict[str, Any]:
    """The embedding scale and logit transform: z-lab's config scalars (`dflash_config`
    first, then the top level, as its `_draft_value`), or DeepSpec Gemma's own: the
    embedding scaled by sqrt(H) (its `Gemma4TextScaledWordEmbedding`, the factor in the
    weights' dtype) and its config's final soft-cap."""

    def value(key: str, default: Any) -> Any:
        return nested.get(key, cfg.get(key, default))

    try:
        softcap = value("final_logit_softcapping", None)
        softcap = float(softcap) if softcap is not None and float(softcap) > 0 else None
        if gemma:
            return dict(embed_scale=math.sqrt(hidden), embed_scale_rounded=True, softcap=softcap)
        scale, multiplier = (
            float(value("input_embedding_scale", 1.0)),
            float(value("output_multiplier", 1.0)),
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed scale ({e})") from None
    for key, x in (("input_embedding_scale", scale), ("output_multiplier", multiplier)):
        if not (math.isfinite(x) and x > 0):
            raise CheckpointError(f"{name}: {key} must be a positive number (got {x})")
    return dict(embed_scale=scale, logit_scale=multiplier, softcap=softcap)


def check_pair(
    args: DFlashArgs,
    target: ModelArgs,
    drafter: str,
    target_name: str,
    extra: list[str] | None = None,
    min_block: int = 2,
) -> None:
    """Refuse a drafter that was not built for this target, naming both (and `extra`
    problems the caller found)."""
    problems = list(extra or [])
    if args.gemma is not None and target.family != "gemma4":
        problems.append(f"its Gemma 4 layers were built for a Gemma 4 target, not {target.family}")
    if args.layers.hidden_size != target.hidden_size:
        problems.append(f"hidden size {args.layers.hidden_size} vs {target.hidden_size}")
    if args.layers.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {args.layers.vocab_size} vs {target.vocab_size}")
    if args.num_target_layers not in (None, target.num_layers):
        problems.append(
            f"built for {args.num_target_layers} target layers, target has {target.num_layers}"
        )
    bad = [i for i in args.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        problems.append(f"target layer ids {bad} outside 0..{target.num_layers - 1}")
    if not 0 <= args.mask_token_id < target.vocab_size:
        problems.append(
            f"mask token {args.mask_token_id} outside the vocabulary ({target.vocab_size})"
        )
    if args.block_size < min_block:
        problems.append(f"block size {args.block_size}")
    if problems:
        raise CheckpointError(
            f"drafter {drafter} does not fit target {target_name}: {'; '.join(problems)}"
        )


class DFlashNet(nn.Module):
    def __init__(self, args: DFlashArgs, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        la = args.layers
        self.args = args
        self.dtype = dtype
        w = dict(dtype=dtype, device=device)
        # Gemma's norms scale in fp32 and round once: their weights stay fp32
        nw = dict(w, dtype=torch.float32) if la.fp32_norms else w
        self.fc = new_weight(la.hidden_size, len(args.target_layer_ids) * la.hidden_size, **w)
        self.hidden_norm = new_weight(la.hidden_size, **nw)
        self.norm = new_weight(la.hidden_size, **nw)
        self.layers = nn.ModuleList(self.new_layer(i, dtype, device) for i in range(la.num_layers))
        self._cos = self._sin = torch.empty(0, la.head_dim, dtype=dtype, device=device)

    def new_layer(self, i: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
        """Draft layer i: Qwen3-style, or Gemma's (DFlash 2 wraps its sublayers)."""
        la, gemma = self.args.layers, self.args.gemma
        if gemma is None:
            return DecoderLayer(la, dtype, device)
        return GemmaLayer(draft_layer_shape(la, gemma, i), dtype, device)

    @property
    def device(self) -> torch.device:
        return self.fc.device

    def plan(self) -> Plan:
        """The checkpoint tensors of the block backbone (z-lab's and DeepSpec's names
        agree, Qwen-style and Gemma layers alike)."""
        h = self.args.layers.hidden_size
        yield Row("fc.weight", self.fc, (h, len(self.args.target_layer_ids) * h))
        yield Row("hidden_norm.weight", self.hidden_norm, (h,))
        yield Row("norm.weight", self.norm, (h,))
        for i, layer in enumerate(self.layers):
            yield from layer.plan(f"layers.{i}.")

    def new_cache(self, capacity: int) -> StaticKVCache:
        """Context K/V for `capacity` committed tokens, plus room for one block."""
        la, total = self.args.layers, capacity + self.args.block_size
        if self._cos.shape[0] < total:
            self._cos, self._sin = rope_tables(
                la.rope, la.head_dim, total, dtype=self.dtype, device=self.device
            )
        return StaticKVCache(
            num_layers=la.num_layers,
            batch=1,
            num_kv_heads=la.num_kv_heads,
            head_dim=la.head_dim,
            capacity=total,
            dtype=self.dtype,
            device=self.device,
        )

    def embed_block(self, target: Transformer, ids: torch.Tensor) -> torch.Tensor:
        """[B, T] ids -> [B, T, H]: the target's raw embedding rows times the drafter's
        scale (z-lab's `input_embedding_scale`; Gemma's sqrt(H), rounded to the dtype)."""
        x = target.embed.lookup(ids)
        a = self.args
        if a.embed_scale == 1.0:
            return x
        if a.embed_scale_rounded:  # as transformers' Gemma: an fp32 buffer cast to the dtype
            return x * torch.tensor(a.embed_scale).to(x.device, x.dtype)
        return x * a.embed_scale

    def logits(self, raw: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V], same dtype
        """The drafter's logits from the raw head's: times `output_multiplier`, then
        soft-capped (z-lab's `compute_logits`; DeepSpec Gemma's, which caps alone)."""
        a = self.args
        if a.logit_scale == 1.0 and a.softcap is None:
            return raw
        z = raw.float() * a.logit_scale
        if a.softcap is not None:
            z = torch.tanh(z / a.softcap) * a.softcap
        return z.to(raw.dtype)

    def head(self, target: Transformer, hidden: torch.Tensor) -> torch.Tensor:  # [.., V]
        """The drafter's logits through the target's LM head (hidden: after `norm`)."""
        return self.logits(target.lm_head(hidden))

    @torch.inference_mode()
    def extend(self, cache: StaticKVCache, features: torch.Tensor) -> None:
        """Append the context K/V of T committed tokens. features: [1, T, K*H]."""
        start, t = cache.length, features.shape[1]
        ctx = self._context(features)
        cos, sin = self._cos[start : start + t], self._sin[start : start + t]
        for i, layer in enumerate(self.layers):
            cache.write(i, *layer.project_kv(ctx, cos, sin))
        cache.commit(start + t)

    @torch.inference_mode()
    def extend_at(self, cache: StaticKVCache, features: torch.Tensor, start: torch.Tensor) -> None:
        """`extend` at a position held in device memory ([1] int64), committing nothing:
        the device-resident loop writes every verified position's features and keeps the
        context length on the device (engine/resident.py)."""
        positions, _, cos, sin = device_positions(start, features.shape[1], self._cos, self._sin)
        ctx = self._context(features)
        for i, layer in enumerate(self.layers):
            cache.write_at(i, positions, *layer.project_kv(ctx, cos, sin))

    def _context(self, features: torch.Tensor) -> torch.Tensor:  # [1, T, K*H] -> [1, T, H]
        return rms_norm(
            linear(features, self.fc, None), self.hidden_norm, self.args.layers.rms_norm_eps
        )

    @torch.inference_mode()
    def block_hidden(self, cache: StaticKVCache, x: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states of a block [1, B, H] placed right after the context."""
        start, t = cache.length, x.shape[1]
        cos, sin = self._cos[start : start + t], self._sin[start : start + t]
        for i, layer in enumerate(self.layers):
            mask = _window_mask(self.args.windows[i], start, t, x.device, self.args.causal[i])
            x = layer(x, cos, sin, cache, i, mask, False)  # written, never committed
        return rms_norm(x, self.norm, self.args.layers.rms_norm_eps)

    @torch.inference_mode()
    def block_hidden_static(
        self,
        cache: StaticKVCache,
        x: torch.Tensor,  # [1, B, H]
        start: torch.Tensor,  # [1] int64 on the device: the context length
    ) -> torch.Tensor:
        """`block_hidden` with the context length read from device memory, for a CUDA
        graph of the draft step (models/graphs.py)."""
        positions, length, cos, sin = device_positions(start, x.shape[1], self._cos, self._sin)
        for i, layer in enumerate(self.layers):
            window, causal = self.args.windows[i], self.args.causal[i]
            x = layer.forward_static(
                x, cos, sin, cache, i, positions, length, causal=causal, window=window
            )
        return rms_norm(x, self.norm, self.args.layers.rms_norm_eps)


def _window_mask(
    window: int | None, start: int, t: int, device: torch.device, causal: bool = False
) -> torch.Tensor | None:  # [T, start + T] bool, None: every key visible
    """Which keys a block's queries see: in a sliding layer those less than `window` away
    (behind the query when `causal`, on either side otherwise); in a causal layer none
    after the query."""
    if window is None and not causal:
        return None
    q = torch.arange(start, start + t, device=device)[:, None]
    k = torch.arange(start + t, device=device)[None, :]
    offset = q - k
    visible = offset >= 0 if causal else torch.ones_like(offset, dtype=torch.bool)
    if window is not None:
        visible = visible & (offset.abs() < window)
    return visible


def load_dflash(path: Path, *, target: Transformer, target_name: str, name: str) -> DFlashNet:
    """Load a z-lab-format DFlash drafter for `target` (validated as a pair first)."""
    args = DFlashArgs.from_hf(read_config(path, name), name=name)
    check_pair(args, target.args, name, target_name)
    index = SafetensorsIndex(path, name)
    net = DFlashNet(args, dtype=target.dtype, device=target.device)
    fill(net.plan(), index, net.device)
    return net.eval()
