"""The target decoder: one lean implementation of the Llama, Qwen2 and Qwen3 families.

The three families differ only in which projections carry a bias and whether q/k get a
per-head RMSNorm (Qwen3), so one module covers them. q/k/v and gate/up are stored fused so
a decode step issues two matmuls fewer per layer; the loader stacks HF tensors into them.

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
from specgen.kernels.rmsnorm import add_rms_norm, rms_norm
from specgen.models.kv_cache import ContextLimitError, StaticKVCache
from specgen.models.rope import rope_tables


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [B, n, V] for the last n positions (n = num_logits or T)
    taps: dict[int, torch.Tensor]  # layer id -> hidden state after that layer, [B, T, H]


def new_weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.args = args
        h, d, inter = args.hidden_size, args.head_dim, args.intermediate_size
        n_qkv = (args.num_heads + 2 * args.num_kv_heads) * d
        w = dict(dtype=dtype, device=device)
        self.attn_norm = new_weight(h, **w)
        self.wqkv = new_weight(n_qkv, h, **w)
        self.bqkv = new_weight(n_qkv, **w) if args.qkv_bias else None
        self.q_norm = new_weight(d, **w) if args.qk_norm else None
        self.k_norm = new_weight(d, **w) if args.qk_norm else None
        self.wo = new_weight(h, args.num_heads * d, **w)
        self.bo = new_weight(h, **w) if args.o_bias else None
        self.ffn_norm = new_weight(h, **w)
        self.w_gate_up = new_weight(2 * inter, h, **w)
        self.b_gate_up = new_weight(2 * inter, **w) if args.mlp_bias else None
        self.w_down = new_weight(h, inter, **w)
        self.b_down = new_weight(h, **w) if args.mlp_bias else None

    def project_kv(
        self,
        h: torch.Tensor,  # [B, T, H], used as-is (no input norm): e.g. DFlash context features
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # k, v: [B, n_kv, T, d]
        """Keys and values of inputs that serve only as keys (no query, no residual)."""
        a = self.args
        bsz, t, _ = h.shape
        q_rows, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
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
        q, k, v = self._qkv(x, cos, sin)
        keys, values = cache.write(layer_id, k, v)
        return self._output(x, attention(q, keys, values, mask, causal))

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
        q, k, v = self._qkv(x, cos, sin)
        cache.write_at(layer_id, positions, k, v)
        out = block_attention(q, cache.k[layer_id], cache.v[layer_id], length, causal, window)
        return self._output(x, out)

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [B, n, T, d] each, q and k roped
        a = self.args
        bsz, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, a.rms_norm_eps)
        qkv = linear(h, self.wqkv, self.bqkv)
        nq, nkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        v = qkv[..., (nq + nkv) * d :].view(bsz, t, nkv, d).transpose(1, 2)
        qk = qkv[..., : (nq + nkv) * d].view(bsz, t, nq + nkv, d)
        if self.q_norm is not None:  # q and k heads together: one set of ops (or one kernel)
            qk = qk_norm_rope(qk, nq, self.q_norm, self.k_norm, cos, sin, a.rms_norm_eps)
        else:
            qk = apply_rope(qk, cos, sin)
        return qk[:, :, :nq].transpose(1, 2), qk[:, :, nq:].transpose(1, 2), v

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        """Output projection, residual, MLP: what follows attention (`out`: [B, nq, T, d])."""
        bsz, t, _ = x.shape
        attn = linear(out.transpose(1, 2).reshape(bsz, t, -1), self.wo, self.bo)
        h, x = add_rms_norm(attn, self.ffn_norm, self.args.rms_norm_eps, residual=x)
        gate, up = linear(h, self.w_gate_up, self.b_gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.w_down, self.b_down)


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
        self.layers = nn.ModuleList(DecoderLayer(args, dtype, dev) for _ in range(args.num_layers))
        self.norm = new_weight(args.hidden_size, dtype=dtype, device=dev)
        self.lm_head = (
            self.embed  # tied: the same storage
            if args.tie_word_embeddings
            else new_weight(args.vocab_size, args.hidden_size, dtype=dtype, device=dev)
        )
        self._cos = self._sin = torch.empty(0, args.head_dim, dtype=dtype, device=dev)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, capacity: int, batch: int = 1) -> StaticKVCache:
        """Allocate a KV cache for `capacity` positions (the context limit)."""
        a = self.args
        if self._cos.shape[0] < capacity:
            self._cos, self._sin = rope_tables(
                a.rope, a.head_dim, capacity, dtype=self.dtype, device=self.device
            )
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
        return F.embedding(tokens, self.embed)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """Final norm + LM head."""
        return self.head(rms_norm(hidden, self.norm, self.args.rms_norm_eps))

    def head(self, normed: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, V]
        """The LM head alone (drafters apply their own final norm, then this)."""
        return linear(normed, self.lm_head, None)

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
        cos, sin = self._cos[start : start + t], self._sin[start : start + t]
        if start + t > cache.capacity:
            raise ContextLimitError(
                f"context limit reached: {start + t} tokens do not fit in {cache.capacity}"
            )
        # A decode step sees every cached key; a prefill on an empty cache is plain causal;
        # anything else (a verify block after a prefix) needs the offset causal mask.
        mask, causal = None, False
        if t > 1 and start == 0:
            causal = True
        elif t > 1:
            mask = torch.ones(t, start + t, dtype=torch.bool, device=tokens.device).tril(start)
        if pad is not None:
            mask, causal = _padding_mask(pad, start, t, mask), False
        x = self.embed_tokens(tokens)
        tapped: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, mask, causal)
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
        """`forward` for decode and verify steps, reading the position from device memory
        (models/graphs.py captures it once per T and replays it at every length).
        The caller checks the capacity and commits: it knows the length on the host."""
        positions, length, cos, sin = device_positions(start, tokens.shape[1], self._cos, self._sin)
        x = self.embed_tokens(tokens)
        tapped: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer.forward_static(x, cos, sin, cache, i, positions, length)
            if i in taps:
                tapped[i] = x
        return ForwardOutput(logits=self.logits(x), taps=tapped)


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
