"""The target decoder: one lean implementation of the Llama, Qwen2, Qwen3, Qwen3.5 and Gemma 4
families.

The attention families differ only in which projections carry a bias and whether q/k get
a per-head RMSNorm (Qwen3), so one module covers them; Qwen3.5 adds an output gate and
partial RoPE to attention and puts Gated DeltaNet layers (models/gated_deltanet.py) between
its attention layers; Gemma 4's layers (models/gemma4.py) mix sliding-window and global
attention of different shapes, so RoPE tables and masks are per layer kind here. q/k/v and
gate/up are stored fused so a decode step issues two matmuls fewer per layer; the loader
stacks HF tensors into them.

`forward` takes any number of new tokens: a prompt (prefill), one token (decode) or a
verify block. Their K/V go into the static cache after its current length; attention is
causal with the mask offset by that length, and the new tokens are committed on return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specgen.config import ModelArgs
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.linear import linear
from specgen.kernels.qk_rope import apply_rope, qk_norm_rope
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.blocks import add_mlp, new_weight, norm_weight, residual_mlp
from specgen.models.gated_deltanet import GatedDeltaNetLayer
from specgen.models.gemma4 import Gemma4Layer, new_gemma4_cache
from specgen.models.hybrid_cache import HybridCache
from specgen.models.kv_cache import ContextLimitError, StaticKVCache
from specgen.models.rope import rope_tables


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [B, n, V] for the last n positions (n = num_logits or T)
    taps: dict[int, torch.Tensor]  # layer id -> hidden state after that layer, [B, T, H]


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.args = args
        h, d = args.hidden_size, args.head_dim
        # Qwen3.5's gated attention: q_proj yields each head's query and its output gate
        self.q_rows = args.num_heads * d * (2 if args.attn_output_gate else 1)
        n_qkv = self.q_rows + 2 * args.num_kv_heads * d
        w, nw = dict(dtype=dtype, device=device), norm_weight(args, dtype, device)
        self.attn_norm = nw(h)
        self.wqkv = new_weight(n_qkv, h, **w)
        self.bqkv = new_weight(n_qkv, **w) if args.qkv_bias else None
        self.q_norm = nw(d) if args.qk_norm else None
        self.k_norm = nw(d) if args.qk_norm else None
        self.wo = new_weight(h, args.num_heads * d, **w)
        self.bo = new_weight(h, **w) if args.o_bias else None
        add_mlp(self, args, dtype, device)

    def project_kv(
        self,
        h: torch.Tensor,  # [B, T, H], used as-is (no input norm): e.g. DFlash context features
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # k, v: [B, n_kv, T, d]
        """Keys and values of inputs that serve only as keys (no query, no residual)."""
        a = self.args
        bsz, t, _ = h.shape
        q_rows, kv = self.q_rows, a.num_kv_heads * a.head_dim
        bias = None if self.bqkv is None else self.bqkv[q_rows:]
        k, v = linear(h, self.wqkv[q_rows:], bias).split([kv, kv], dim=-1)
        k = k.view(bsz, t, a.num_kv_heads, a.head_dim)
        if self.k_norm is not None:
            k = rms_norm(k, self.k_norm, a.rms_norm_eps)
        k = apply_rope(k, cos, sin).transpose(1, 2)
        return k, v.view(bsz, t, a.num_kv_heads, a.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        mask: torch.Tensor | None,  # [T, L+T] bool, None when every key is visible
        causal: bool,
    ) -> torch.Tensor:  # [B, T, H]
        q, k, v, gate = self._qkv(x, cos, sin)
        keys, values = cache.write(layer_id, k, v)
        return self._output(x, attention(q, keys, values, mask, causal), gate)

    def forward_static(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        positions: torch.Tensor,  # [T] int64, on the device
        length: torch.Tensor,  # [1] int32: positions[-1] + 1
        causal: bool = True,  # False: every query sees every key (a drafter's block)
        window: int | None = None,  # a sliding-window layer's reach (drafters)
    ) -> torch.Tensor:  # [B, T, H]
        """`forward` with the positions in device memory: no host value, no shape that
        depends on the cache length, so a CUDA graph of it replays at any length."""
        q, k, v, gate = self._qkv(x, cos, sin)
        cache.write_at(layer_id, positions, k, v)
        slot = cache.slot(layer_id)
        out = block_attention(q, cache.k[slot], cache.v[slot], length, causal, window)
        return self._output(x, out, gate)

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q, k (roped) and v, [B, n, T, d] each, and the output gate [B, T, nq*d] if any."""
        a = self.args
        bsz, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, a.rms_norm_eps)
        qkv = linear(h, self.wqkv, self.bqkv)
        nq, nkv, d, rows = a.num_heads, a.num_kv_heads, a.head_dim, self.q_rows
        v = qkv[..., rows + nkv * d :].view(bsz, t, nkv, d).transpose(1, 2)
        gate = None
        if a.attn_output_gate:  # per head: d query channels, then d gate channels
            q_gate = qkv[..., :rows].view(bsz, t, nq, 2 * d)
            gate = q_gate[..., d:].reshape(bsz, t, nq * d)
            k = qkv[..., rows : rows + nkv * d].view(bsz, t, nkv, d)
            qk = torch.cat((q_gate[..., :d], k), dim=2)
        else:
            qk = qkv[..., : (nq + nkv) * d].view(bsz, t, nq + nkv, d)
        if a.rope_dim < d:  # partial rotary (Qwen3.5): norms, then RoPE on the first channels
            q = rms_norm(qk[:, :, :nq], self.q_norm, a.rms_norm_eps)
            k = rms_norm(qk[:, :, nq:], self.k_norm, a.rms_norm_eps)
            qk = apply_partial_rope(torch.cat((q, k), dim=2), cos, sin)
        elif self.q_norm is not None:  # q and k heads together: one set of ops (or one kernel)
            qk = qk_norm_rope(qk, nq, self.q_norm, self.k_norm, cos, sin, a.rms_norm_eps)
        else:
            qk = apply_rope(qk, cos, sin)
        return qk[:, :, :nq].transpose(1, 2), qk[:, :, nq:].transpose(1, 2), v, gate

    def _output(
        self, x: torch.Tensor, out: torch.Tensor, gate: torch.Tensor | None = None
    ) -> torch.Tensor:  # [B, T, H]
        """Output gate, projection, residual, MLP: what follows attention (`out`:
        [B, nq, T, d])."""
        bsz, t, _ = x.shape
        out = out.transpose(1, 2).reshape(bsz, t, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return residual_mlp(self, x, linear(out, self.wo, self.bo))


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] channels of each head; the rest pass through."""
    r = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)


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
        self.embed = new_weight(args.vocab_size, args.hidden_size, dtype=dtype, device=dev)
        self.layers = nn.ModuleList(_layer(args, i, dtype, dev) for i in range(args.num_layers))
        self.norm = norm_weight(args, dtype, dev)(args.hidden_size)
        self.lm_head = (
            self.embed  # tied: the same storage
            if args.tie_word_embeddings
            else new_weight(args.vocab_size, args.hidden_size, dtype=dtype, device=dev)
        )
        # RoPE tables [capacity, d], one per distinct (RoPE, width) among the layers (Gemma
        # 4's sliding and global layers differ); layer i reads table `_rope_of[i]`
        g = args.gemma
        specs = [(args.rope, args.rope_dim) if g is None else (g.rope(i), g.head_dims[i])
                 for i in range(args.num_layers)]  # fmt: skip
        self._ropes = list(dict.fromkeys(specs)) or [(args.rope, args.rope_dim)]
        self._rope_of = [self._ropes.index(spec) for spec in specs]
        self._tables = [(torch.empty(0, d, dtype=dtype, device=dev),) * 2 for _, d in self._ropes]
        self.windows = tuple(None if g is None else g.window(i) for i in range(args.num_layers))
        # Gemma: the sqrt(hidden) scale rounded to the model dtype first, as transformers does
        self._embed_scale = (
            None if args.embed_scale is None else torch.tensor(args.embed_scale).to(dev, dtype)
        )

    @property
    def device(self) -> torch.device:
        return self.embed.device

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
        if a.gemma is not None:
            return new_gemma4_cache(a, batch, capacity, dtype=self.dtype, device=self.device)
        if a.hybrid is not None:
            return HybridCache(
                a, batch=batch, capacity=capacity, steps=steps, dtype=self.dtype,
                device=self.device,
            )  # fmt: skip
        return StaticKVCache(
            num_layers=a.num_layers,
            batch=batch,
            num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            capacity=capacity,
            dtype=self.dtype,
            device=self.device,
        )

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, H]
        """Token embeddings as the first layer sees them (Gemma: scaled by sqrt(hidden))."""
        x = F.embedding(tokens, self.embed)
        return x if self._embed_scale is None else x * self._embed_scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """Final norm + LM head."""
        return self.head(rms_norm(hidden, self.norm, self.args.rms_norm_eps))

    def head(self, normed: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """The LM head alone (drafters apply their own final norm, then this), with the
        target's final logit softcapping (Gemma: tanh(x / c) * c), so drafters drafting
        through it see the target's capped logits (greedy argmax is the same either way;
        sampling is not)."""
        return self.softcap(linear(normed, self.lm_head, None))

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
        tables = [(cos[start : start + t], sin[start : start + t]) for cos, sin in self._tables]
        if start + t > cache.capacity:
            raise ContextLimitError(
                f"context limit reached: {start + t} tokens do not fit in {cache.capacity}"
            )
        masks = {w: attention_mask(start, t, w, pad, tokens.device) for w in set(self.windows)}
        if isinstance(cache, HybridCache):
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
        positions, length, cos, sin = device_positions(start, tokens.shape[1], *self._tables[0])
        tables = [(cos, sin)] + [
            (c.index_select(0, positions), s.index_select(0, positions))
            for c, s in self._tables[1:]
        ]
        if isinstance(cache, HybridCache):
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


def _layer(args: ModelArgs, i: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """Layer i: attention, a Gated DeltaNet layer where a hybrid target has one, or a
    Gemma 4 layer (sliding-window or global attention, with its own shape)."""
    if args.gemma is not None:
        return Gemma4Layer(args, i, dtype, device)
    if args.hybrid is not None and args.hybrid.linear(i):
        return GatedDeltaNetLayer(args, dtype, device)
    return DecoderLayer(args, dtype, device)


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
