"""Block attention over a static KV cache whose length lives in device memory.

The hot op of verify and draft steps: a short block of T queries (1-16 tokens, GQA) against
a long cache. The cache holds `length` valid positions, the block's own keys included (they
are written at [length - T, length) before attending); `length` is a 1-element int32 tensor,
so a captured CUDA graph can replay the op for any length without a host sync. Two masks:

    causal: query i (absolute position length - T + i) sees keys at positions <= its own
            (the target's decode and verify steps);
    block:  every query sees every valid key (a DFlash/DSpark drafter block: the context
            before the anchor plus its own block, bidirectionally).
A `window` (a sliding-window layer: a drafter's, or Gemma 4's) further limits each query
to the keys less than `window` positions away from it, on either side; with `causal` that
is q - window < k <= q, transformers' sliding window. Chunks wholly before every query's
window are skipped. `scale` multiplies the scores (default 1/sqrt(d); Gemma 4: 1).

Flash-decoding: the key range is split into chunks of `CHUNK` positions, one program per
(batch, kv head, chunk) handling all the query heads of that kv group and all T queries at
once (G*T rows), each keeping a running max, sum and weighted value sum; a second small
kernel merges the chunks. Chunks past `length` exit at once, so the grid is sized from the
cache capacity and never from a host-side length.
"""

from __future__ import annotations

import math
import os

import torch

from specgen.kernels import backend, triton_wanted
from specgen.kernels.attention import attention


def block_attention_torch(
    q: torch.Tensor,  # [B, nq, T, d]
    k: torch.Tensor,  # [B, nkv, capacity, d]
    v: torch.Tensor,  # [B, nkv, capacity, d]
    length: torch.Tensor,  # [1] int32: valid positions, the block's own keys included
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:  # [B, nq, T, d]
    n = int(length.item())
    t = q.shape[2]
    keys, values = k[:, :, :n], v[:, :, :n]
    mask = None
    if causal:
        mask = torch.ones(t, n, dtype=torch.bool, device=q.device).tril(n - t)
    if window is not None:
        near = _near(torch.arange(n - t, n, device=q.device), n, window)
        mask = near if mask is None else mask & near
    scores_q = q.float()
    groups = q.shape[1] // k.shape[1]
    keys = keys.float().repeat_interleave(groups, dim=1)
    values = values.float().repeat_interleave(groups, dim=1)
    scores = (
        scores_q @ keys.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ values).to(q.dtype)


def block_attention_masked(
    q: torch.Tensor,  # [B, nq, T, d]
    k: torch.Tensor,  # [B, nkv, capacity, d]
    v: torch.Tensor,  # [B, nkv, capacity, d]
    length: torch.Tensor,  # [1] int32
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:  # [B, nq, T, d]
    """The same op in torch with no host sync (unlike the reference): it attends over the
    whole capacity with a mask built on the device, so it can be captured in a CUDA graph.
    Positions past `length` get weight 0, so they must hold finite numbers (a zeroed or
    once-written cache), since 0 * NaN is NaN."""
    t, capacity = q.shape[2], k.shape[2]
    keys = torch.arange(capacity, device=q.device)
    last = length.long() - 1  # [1]: the last valid position
    if causal:  # query i sits at length - T + i
        last = last - (t - 1) + torch.arange(t, device=q.device)
    mask = keys[None, :] <= last.expand(t)[:, None]  # [T, capacity]
    if window is not None:
        queries = length.long() - t + torch.arange(t, device=q.device)
        mask = mask & _near(queries, capacity, window)
    return attention(q, k, v, mask, causal=False, scale=scale)


def _near(queries: torch.Tensor, keys: int, window: int) -> torch.Tensor:  # [T, keys]
    """Which of `keys` positions lie less than `window` from each query position."""
    offsets = queries[:, None] - torch.arange(keys, device=queries.device)[None, :]
    return offsets.abs() < window


def block_attention(
    q, k, v, length, causal, window: int | None = None, scale: float | None = None
) -> torch.Tensor:
    """Dispatch: the Triton kernel on CUDA with the Triton backend, else the masked torch
    form (both read `length` from device memory)."""
    d = q.shape[-1]
    if q.is_cuda and backend() == "triton" and d >= 16 and d & (d - 1) == 0:
        return block_attention_triton(q, k, v, length, causal, window, scale)
    return block_attention_masked(q, k, v, length, causal, window, scale)


if triton_wanted():
    import triton
    import triton.language as tl

    CHUNK = 256

    @triton.jit
    def _partial_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        len_ptr,
        m_ptr,
        l_ptr,
        acc_ptr,
        NQ,
        NKV,
        T,
        CAP,
        scale,
        WINDOW,
        CAUSAL: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
        G: tl.constexpr,
        BLOCK_R: tl.constexpr,
        D: tl.constexpr,
        CHUNK_: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        pid_bh = tl.program_id(0)  # b * NKV + kv head
        split = tl.program_id(1)
        nsplit = tl.num_programs(1)
        b = pid_bh // NKV
        kvh = pid_bh % NKV
        n = tl.load(len_ptr)
        rows = tl.arange(0, BLOCK_R)  # row = g * T + t over the G query heads of this group
        g = rows // T
        t = rows % T
        valid_row = rows < G * T
        dcol = tl.arange(0, D)
        qh = kvh * G + g
        q = tl.load(
            q_ptr + ((b * NQ + qh) * T + t)[:, None] * D + dcol[None, :],
            mask=valid_row[:, None],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        lsum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, D], tl.float32)
        start = split * CHUNK_
        qpos = n - T + t
        work = start < n
        if HAS_WINDOW:  # a chunk before the first query's window (it sits at n - T): none
            work = work & (start + CHUNK_ > n - T - WINDOW + 1)
        if work:
            for k0 in range(start, start + CHUNK_, BLOCK_N):
                cols = k0 + tl.arange(0, BLOCK_N)
                kmask = cols < n
                base = (b * NKV + kvh) * CAP
                kk = tl.load(
                    k_ptr + (base + cols)[:, None] * D + dcol[None, :],
                    mask=kmask[:, None],
                    other=0.0,
                )
                if UPCAST:
                    kk = kk.to(tl.float32)
                # fp32 inputs: exact products (no TF32); bf16/fp16: tensor cores, fp32 sums
                s = tl.dot(q, tl.trans(kk), input_precision=PRECISION) * scale
                see = kmask[None, :] & valid_row[:, None]
                if CAUSAL:
                    see = see & (cols[None, :] <= qpos[:, None])
                if HAS_WINDOW:
                    see = see & (qpos[:, None] - cols[None, :] < WINDOW)
                    see = see & (cols[None, :] - qpos[:, None] < WINDOW)
                s = tl.where(see, s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m - m_safe)
                p = tl.exp(s - m_safe[:, None])
                vv = tl.load(
                    v_ptr + (base + cols)[:, None] * D + dcol[None, :],
                    mask=kmask[:, None],
                    other=0.0,
                )
                if UPCAST:
                    vv = vv.to(tl.float32)
                pv = tl.dot(p.to(vv.dtype), vv, input_precision=PRECISION)
                acc = acc * alpha[:, None] + pv
                lsum = lsum * alpha + tl.sum(p, axis=1)
                m = m_new
        out = (pid_bh * nsplit + split) * BLOCK_R + rows
        tl.store(m_ptr + out, m)
        tl.store(l_ptr + out, lsum)
        tl.store(acc_ptr + out[:, None] * D + dcol[None, :], acc)

    @triton.jit
    def _merge_kernel(
        m_ptr,
        l_ptr,
        acc_ptr,
        o_ptr,
        NQ,
        NKV,
        T,
        NSPLIT,
        G: tl.constexpr,
        BLOCK_R: tl.constexpr,
        D: tl.constexpr,
    ):
        pid_bh = tl.program_id(0)
        b = pid_bh // NKV
        kvh = pid_bh % NKV
        rows = tl.arange(0, BLOCK_R)
        dcol = tl.arange(0, D)
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        for s in range(NSPLIT):
            m = tl.maximum(m, tl.load(m_ptr + (pid_bh * NSPLIT + s) * BLOCK_R + rows))
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lsum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, D], tl.float32)
        for s in range(NSPLIT):
            at = (pid_bh * NSPLIT + s) * BLOCK_R + rows
            w = tl.exp(tl.load(m_ptr + at) - m_safe)
            lsum += w * tl.load(l_ptr + at)
            acc += w[:, None] * tl.load(acc_ptr + at[:, None] * D + dcol[None, :])
        out = acc / tl.where(lsum == 0.0, 1.0, lsum)[:, None]
        g = rows // T
        t = rows % T
        valid = rows < G * T
        dest = ((b * NQ + kvh * G + g) * T + t)[:, None] * D + dcol[None, :]
        tl.store(o_ptr + dest, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])

    def block_attention_triton(q, k, v, length, causal, window=None, scale=None):
        bsz, nq, t, d = q.shape
        nkv, cap = k.shape[1], k.shape[2]
        g = nq // nkv
        block_r = max(16, triton.next_power_of_2(g * t))
        nsplit = triton.cdiv(cap, CHUNK)
        dev = q.device
        m = torch.empty(bsz * nkv * nsplit * block_r, dtype=torch.float32, device=dev)
        lsum = torch.empty_like(m)
        acc = torch.empty(bsz * nkv * nsplit * block_r, d, dtype=torch.float32, device=dev)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        # Triton's CPU interpreter has no working bf16/fp16 dot: there everything is fp32
        upcast = q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        _partial_kernel[(bsz * nkv, nsplit)](
            q, k, v, length, m, lsum, acc, nq, nkv, t, cap, scale,
            window or 0, CAUSAL=causal, HAS_WINDOW=window is not None, G=g, BLOCK_R=block_r,
            D=d, CHUNK_=CHUNK, BLOCK_N=64, PRECISION="ieee" if upcast else "tf32",
            UPCAST=upcast,
        )  # fmt: skip
        out = torch.empty_like(q)
        _merge_kernel[(bsz * nkv,)](
            m, lsum, acc, out, nq, nkv, t, nsplit, G=g, BLOCK_R=block_r, D=d
        )  # fmt: skip
        return out
