"""The target decoder: embedding, the family's layers (models/families/), final norm, LM head.

Which layers a target has, their RoPE and sliding windows, and its cache are its family's
to say (`family_of(args)`); this module never names a family. RoPE tables and masks are
kept per distinct (RoPE, width) and window among the layers, since some families mix
layer kinds of different shapes.

`forward` takes any number of new tokens: a prompt (prefill), one token (decode) or a
verify block. Their K/V go into the static cache after its current length; attention is
causal with the mask offset by that length, and the new tokens are committed on return.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.decoder_cpu import decoder_forward_many
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.kv import ContextLimitError, StaticKVCache
from specgen.models.families import model_args  # noqa: F401  (registers the families)
from specgen.models.family import family_of
from specgen.models.formats.weights import (
    DenseWeight,
    held_tensors,
    resident_bytes,
    weights_identity,
)
from specgen.models.fused.cpu_pass import (
    FusedPass,
    cache_fits,
    kv_dtype,
    runnable,
    shared_wanted,
)
from specgen.models.layers.blocks import norm_weight
from specgen.models.layers.rope import rope_tables
from specgen.models.plans import Plan, Row


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [B, n, V] for the last n positions (n = num_logits or T)
    taps: dict[int, torch.Tensor]  # layer id -> hidden state after that layer, [B, T, H]


class Transformer(nn.Module):
    """Decoder-only LM with a static KV cache and hidden-state taps."""

    def __init__(
        self,
        args: ModelArgs,
        *,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        super().__init__()
        dev = torch.device(device)
        self.args = args
        self.dtype = dtype
        self.family = family = family_of(args)
        w = dict(dtype=dtype, device=dev)
        self.embed = DenseWeight(args.vocab_size, args.hidden_size, **w)
        self.layers = nn.ModuleList(
            family.layer(args, i, dtype, dev) for i in range(args.num_layers)
        )
        self.norm = norm_weight(args, dtype, dev)(args.hidden_size)
        self.lm_head = (
            self.embed  # tied: the same weight
            if args.tie_word_embeddings
            else DenseWeight(args.vocab_size, args.hidden_size, **w)
        )
        # RoPE tables [capacity, d], one per distinct (RoPE, width) among the layers (kinds
        # of layer may differ); layer i reads table `_rope_of[i]`
        specs = [family.rope(args, i) for i in range(args.num_layers)]
        self._ropes = list(dict.fromkeys(specs)) or [(args.rope, args.rope_dim)]
        self._rope_of = [self._ropes.index(spec) for spec in specs]
        self._tables = [(torch.empty(0, d, dtype=dtype, device=dev),) * 2 for _, d in self._ropes]
        self.windows = tuple(family.window(args, i) for i in range(args.num_layers))
        # where the weights were read (set by the loader): heads a checkpoint keeps beside
        # the decoder (Qwen3.5's MTP layers) are read from there
        self.source: Path | None = None
        # Gemma: the sqrt(hidden) scale rounded to the model dtype first, as transformers does
        self._embed_scale = (
            None if args.embed_scale is None else torch.tensor(args.embed_scale).to(dev, dtype)
        )

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _apply(self, fn, recurse=True):  # moved or cast: the fused pass's pointers are stale
        self.__dict__.pop("_fused", None)
        return super()._apply(fn, recurse)

    def _fused_pass(self, cache, batch: int, pad) -> FusedPass | None:
        """The fused CPU pass when it can run this step (models/fused/cpu_pass.py), else None."""
        if self.embed.device.type != "cpu":
            return None
        fused = FusedPass.of(self)
        return fused if fused is not None and cache_fits(self, cache, batch, pad) else None

    def new_cache(self, capacity: int, batch: int = 1, steps: int = 1) -> StaticKVCache:
        """Allocate a KV cache for `capacity` positions (the context limit). A hybrid
        target's cache also keeps recurrent state to roll back into any of the last
        forward's tokens when it has at most `steps` (1 + the most drafts a step verifies)."""
        a = self.args
        if self._tables[0][0].shape[0] < capacity:
            self._tables = [
                rope_tables(rope, d, capacity, dtype=self.dtype, device=self.device)
                for rope, d in self._ropes
            ]
        # a target the fused CPU pass computes keeps its keys and values as that pass does
        # (fp32, or fp16 on request: cpu_pass.kv_dtype), whichever pass then runs a step
        kv = kv_dtype() if runnable(self) else self.dtype
        return self.family.new_cache(
            a, batch=batch, capacity=capacity, steps=steps, dtype=kv, device=self.device
        )

    def plan(self, prefix: str) -> Plan:
        """The checkpoint's tensors of this model, the backbone's under `prefix`."""
        a = self.args
        yield Row(prefix + "embed_tokens.weight", self.embed, (a.vocab_size, a.hidden_size))
        yield Row(prefix + "norm.weight", self.norm, (a.hidden_size,))
        if not a.tie_word_embeddings:
            head = self.family.head_key(prefix)
            yield Row(head, self.lm_head, (a.vocab_size, a.hidden_size))
        for i, layer in enumerate(self.layers):
            yield from layer.plan(f"{prefix}layers.{i}.")

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the weights hold, each storage once (memory figures)."""
        return held_tensors(self)

    @property
    def resident_bytes(self) -> int:
        """Bytes the weights hold in memory (a tied head once)."""
        return resident_bytes(self)

    @property
    def weights_identity(self) -> str:
        """How the weights are stored, e.g. "dense-bfloat16" (cost tables depend on it)."""
        return weights_identity(self)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, H]
        """Token embeddings as the first layer sees them (Gemma: scaled by sqrt(hidden))."""
        x = self.embed.lookup(tokens)
        return x if self._embed_scale is None else x * self._embed_scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """Final norm + LM head."""
        return self.head(rms_norm(hidden, self.norm, self.args.rms_norm_eps))

    def head(self, normed: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """The LM head alone (drafters apply their own final norm, then this), with the
        target's final logit softcapping (Gemma: tanh(x / c) * c), so drafters drafting
        through it see the target's capped logits (greedy argmax is the same either way;
        sampling is not)."""
        return self.softcap(self.lm_head(normed))

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """The final logit softcapping alone (for logits of a trimmed head's rows)."""
        cap = self.args.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: StaticKVCache,
        *,
        taps: tuple[int, ...] = (),
        num_logits: int | None = None,
        pad: torch.Tensor | None = None,
    ) -> ForwardOutput:
        """Run T new tokens at positions [cache.length, cache.length + T) and commit them.

        Args:
            tokens: the new token ids.
            cache: the KV cache; its length is the position of the first new token.
            taps: layer ids whose output hidden states to return (HF `hidden_states[id+1]`).
            num_logits: compute logits only for the last n positions (1 for a prefill).
            pad: [B] left-padding length of each row of a batch (batched generation):
                no token attends to a row's padding. RoPE is relative, so a row shifted
                right by its padding scores the same as the row alone.
        """
        start, t = cache.length, tokens.shape[1]
        if start + t > cache.capacity:
            raise ContextLimitError(
                f"context limit reached: {start + t} tokens do not fit in {cache.capacity}"
            )
        fused = self._fused_pass(cache, tokens.shape[0], pad)
        if fused is not None:
            cache.reserve(t)
            logits, tapped = fused.run(self, tokens, cache, start, taps, num_logits or t)
            cache.commit(start + t)
            return ForwardOutput(logits=logits, taps=tapped)
        tables = [(cos[start : start + t], sin[start : start + t]) for cos, sin in self._tables]
        masks = {w: attention_mask(start, t, w, pad, tokens.device) for w in set(self.windows)}
        cache.begin(t, prefill=num_logits is not None, pad=pad)
        x = self.embed_tokens(tokens)
        tapped: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, *tables[self._rope_of[i]], cache, i, *masks[self.windows[i]])
            if i in taps:
                tapped[i] = x
        cache.commit(start + t)
        if num_logits is not None:
            x = x[:, -num_logits:]
        return ForwardOutput(logits=self.logits(x), taps=tapped)

    @property
    def shared_passes(self) -> bool:
        """Whether answers on this target can share one fused CPU pass (`forward_shared`):
        then a step of several answers costs about one forward of all their rows."""
        return (
            self.embed.device.type == "cpu"
            and shared_wanted()
            and FusedPass.of(self) is not None
            and decoder_forward_many() is not None
        )

    def shares_pass(self, cache, rows: int) -> bool:
        """Whether `rows` new tokens after what `cache` holds can join other answers' rows
        in one fused CPU pass (`forward_shared`)."""
        return (
            self.shared_passes
            and cache_fits(self, cache, 1, None)
            and cache.length + rows <= cache.capacity
        )

    def forward_shared(
        self,
        parts: list[tuple[list[int], StaticKVCache, int | None]],  # (tokens, cache, num_logits)
        taps: tuple[int, ...] = (),
    ) -> list[ForwardOutput]:
        """`forward` of several answers at once, each in its own cache (each part as
        `shares_pass` allows): one fused pass that reads the weights once for every row,
        with each answer's bits what its own `forward` gives. Each cache is committed."""
        fused = FusedPass.of(self)
        assert fused is not None
        asked = [(tokens, cache, num or len(tokens)) for tokens, cache, num in parts]
        for tokens, cache, _ in asked:
            cache.reserve(len(tokens))
        outs = fused.run_many(self, asked, taps)
        for tokens, cache, _ in asked:
            cache.commit(cache.length + len(tokens))
        return [ForwardOutput(logits=logits, taps=tapped) for logits, tapped in outs]

    @torch.inference_mode()
    def forward_static(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: StaticKVCache,
        start: torch.Tensor,  # [1] int64 on the device: the position of the first token
        *,
        taps: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """`forward` for decode and verify steps, reading the position from device memory.
        The caller checks the capacity and commits: it knows the length on the host."""
        out = self.step_static(tokens, cache, start, taps=taps)
        cache.stepped()
        return out

    @torch.inference_mode()
    def step_static(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: StaticKVCache,
        start: torch.Tensor,  # [1] int64 on the device
        *,
        taps: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """`forward_static` without its host-side bookkeeping (`cache.stepped`): what
        models/graphs.py captures once per T and replays at every length. Running it
        again at the same position gives the same result (warm-up, capture)."""
        fused = self._fused_pass(cache, tokens.shape[0], None)
        if fused is not None:  # the CPU: reading the position costs nothing here
            t, at = tokens.shape[1], int(start.item())
            logits, tapped = fused.run(self, tokens, cache, at, taps, t)
            return ForwardOutput(logits=logits, taps=tapped)
        positions, length, cos, sin = device_positions(start, tokens.shape[1], *self._tables[0])
        tables = [(cos, sin)] + [
            (c.index_select(0, positions), s.index_select(0, positions))
            for c, s in self._tables[1:]
        ]
        cache.begin_static(positions)
        x = self.embed_tokens(tokens)
        tapped: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self._rope_of[i]]
            x = layer.forward_static(
                x, cos, sin, cache, i, positions, length, window=self.windows[i]
            )
            if i in taps:
                tapped[i] = x
        return ForwardOutput(logits=self.logits(x), taps=tapped)


def attention_mask(
    start: int, t: int, window: int | None, pad: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor | None, bool]:
    """What T new queries at [start, start + T) see: (mask, causal) for `attention`. The
    mask covers the last mask.shape[-1] keys: a sliding window's covers only the keys from
    the first query's window on (q - window < k <= q), and the layer drops the older ones.
    A decode step sees every cached key; a prefill on an empty cache is plain causal;
    anything else (a verify block after a prefix) needs the offset causal mask."""
    mask, causal = None, False
    if window is not None and start + t > window:  # some query's window excludes key 0
        lo = 0 if pad is not None else max(0, start + 1 - window)
        q = torch.arange(start, start + t, device=device)[:, None]
        k = torch.arange(lo, start + t, device=device)[None, :]
        mask = (k <= q) & (q - k < window)
    elif t > 1 and start == 0:
        causal = True
    elif t > 1:
        mask = torch.ones(t, start + t, dtype=torch.bool, device=device).tril(start)
    if pad is not None:
        mask, causal = _padding_mask(pad, start, t, mask), False
    return mask, causal


def device_positions(
    start: torch.Tensor,  # [1] int64 on the device
    t: int,
    cos: torch.Tensor,  # [capacity, d] RoPE tables
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a graph-capturable step of t tokens from `start` needs, all computed on the
    device: positions [t] int64, the length after them [1] int32, their cos/sin rows."""
    positions = start + torch.arange(t, device=start.device)
    length = (positions[-1:] + 1).to(torch.int32)
    return positions, length, cos.index_select(0, positions), sin.index_select(0, positions)


def _padding_mask(
    pad: torch.Tensor, start: int, t: int, mask: torch.Tensor | None
) -> torch.Tensor:  # [B, 1, T, start + T]
    keys = torch.arange(start + t, device=pad.device)
    queries = torch.arange(start, start + t, device=pad.device)
    allowed = keys[None, None, :] <= queries[None, :, None]  # causal
    if mask is not None:
        allowed = allowed & mask
    # padding keys are hidden; a padding query still sees itself, so its (unused) state
    # stays finite instead of becoming NaN and leaking through 0 * NaN in attention
    real = keys[None, None, :] >= pad[:, None, None]
    itself = keys[None, None, :] == queries[None, :, None]
    return (allowed & (real | itself))[:, None]
