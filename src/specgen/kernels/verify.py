"""Verification of a draft block: target logits -> accepted count + the next token.

Inputs, for each of B rows: target logits for [anchor, d1..dk] (already top-k/top-p
filtered to -inf by the caller), the k draft tokens, optionally the drafter's proposal
distribution q (None: a point-mass drafter), and the random numbers of the step:
`uniform` [B, k] for the acceptance tests and `noise` [B, V] ~ Exp(1) for the one token
sampled at the end. Because the random numbers are inputs, the kernel and the torch
reference give identical results for identical inputs, and a seeded run is reproducible.

Rules (temperature T > 0; p_i = softmax(logits_i / T)):
  accept d_i while u_i * q_i(d_i) < p_i(d_i)          (i.e. u_i < p/q; point mass: q = 1)
  at the first rejection j: next ~ max(p_j - q_j, 0)   (normalisation is implicit)
  after k acceptances:      next ~ p_k                 (the bonus)
A categorical sample is argmax(w / E) with E ~ Exp(1) (the exponential race), so no
distribution is ever normalised or materialised: the kernel reads each logits row once for
its log-sum-exp and once more only for the row it samples from. At T = 0 everything is
argmax: accept while d_i == argmax(logits_i), next = argmax of the first unmatched row.
"""

from __future__ import annotations

import numpy as np
import torch

from specgen.kernels import backend, triton_wanted


def greedy(logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...] int64
    """The first index of each row's largest logit, a NaN counting as the largest (torch's
    rule, and numpy's). On the CPU numpy's argmax is taken: torch's took 63 us over the
    default's 49,152 logits against numpy's 3, 2% of a decode step on two cores."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() > 0:
        return torch.from_numpy(np.asarray(logits.detach().numpy().argmax(axis=-1)))
    return logits.argmax(dim=-1)


def verify_torch(
    logits: torch.Tensor,  # [B, k+1, V]
    draft_tokens: torch.Tensor,  # [B, k] int64
    draft_probs: torch.Tensor | None,  # [B, k, V] or None (point mass)
    uniform: torch.Tensor,  # [B, k]
    noise: torch.Tensor,  # [B, V], Exp(1)
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [B], next_token [B]
    """Vectorised reference."""
    bsz, k = draft_tokens.shape
    rows = torch.arange(bsz, device=logits.device)
    if temperature == 0:
        best = greedy(logits)  # [B, k+1]
        ok = draft_tokens == best[:, :k]
        accepted = ok.long().cumprod(dim=-1).sum(dim=-1)
        return accepted, best[rows, accepted]
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, k+1, V]
    p_draft = probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, k]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.float().gather(-1, draft_tokens[..., None]).squeeze(-1)
    ok = uniform * q_draft < p_draft
    accepted = ok.long().cumprod(dim=-1).sum(dim=-1)  # [B]
    p_next = probs[rows, accepted]  # [B, V]
    weights = p_next.clone()
    rejected = accepted < k
    if rejected.any():
        j = accepted.clamp(max=k - 1)
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows, draft_tokens[rows, j]] = 1.0
        else:
            q_next = draft_probs.float()[rows, j]
        residual = (p_next - q_next).clamp(min=0)
        usable = rejected & (residual.sum(-1) > 0)  # an all-zero residual has probability 0
        weights[usable] = residual[usable]
    return accepted, (weights / noise).argmax(dim=-1)


def verify(
    logits: torch.Tensor,  # [B, k+1, V]
    draft_tokens: torch.Tensor,  # [B, k]
    draft_probs: torch.Tensor | None,  # [B, k, V] or None
    uniform: torch.Tensor,  # [B, k]
    noise: torch.Tensor,  # [B, V]
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to the Triton kernel or the torch reference (see `specgen.kernels`). The
    kernel only for CUDA tensors: a pipeline on `--device cpu` on a machine with a GPU
    still verifies in torch (Triton cannot launch on host memory)."""
    if logits.is_cuda and backend() == "triton" and draft_tokens.shape[1] > 0:
        return verify_triton(logits, draft_tokens, draft_probs, uniform, noise, temperature)
    return verify_torch(logits, draft_tokens, draft_probs, uniform, noise, temperature)


if triton_wanted():
    import triton
    import triton.language as tl

    @triton.jit
    def _row_max_lse(row_ptr, V, inv_temp, BLOCK_V: tl.constexpr):
        """Online log-sum-exp of logits * inv_temp over one row of V."""
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.full((), 0.0, tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            x = x * inv_temp
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        return m + tl.log(s)

    @triton.jit
    def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
        best = tl.full((), float("-inf"), tl.float32)
        idx = tl.full((), 0, tl.int64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            m = tl.max(x, 0)
            a = (tl.argmax(x, 0) + start).to(tl.int64)
            better = m > best  # strict: ties keep the earliest index, as torch.argmax does
            idx = tl.where(better, a, idx)
            best = tl.where(better, m, best)
        return idx

    @triton.jit
    def _verify_kernel(
        logits_ptr,  # [B, k+1, V]
        draft_ptr,  # [B, k]
        q_ptr,  # [B, k, V] (unused without HAS_Q)
        u_ptr,  # [B, k]
        noise_ptr,  # [B, V]
        accepted_ptr,  # [B] out
        next_ptr,  # [B] out
        K,
        V,
        stride_lb,
        stride_lk,
        stride_qb,
        stride_qk,
        inv_temp,
        GREEDY: tl.constexpr,
        HAS_Q: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        logits_b = logits_ptr + b * stride_lb
        accepted = tl.full((), 0, tl.int64)
        still = tl.full((), 1, tl.int64)
        for i in range(0, K):
            if still != 0:
                d = tl.load(draft_ptr + b * K + i)
                row = logits_b + i * stride_lk
                if GREEDY:
                    ok = _row_argmax(row, V, BLOCK_V) == d
                else:
                    lse = _row_max_lse(row, V, inv_temp, BLOCK_V)
                    p_d = tl.exp(tl.load(row + d).to(tl.float32) * inv_temp - lse)
                    q_d = 1.0
                    if HAS_Q:
                        q_d = tl.load(q_ptr + b * stride_qb + i * stride_qk + d).to(tl.float32)
                    ok = tl.load(u_ptr + b * K + i) * q_d < p_d
                still = ok.to(tl.int64)
                accepted += still
        row = logits_b + accepted * stride_lk
        if GREEDY:
            token = _row_argmax(row, V, BLOCK_V)
        else:
            # Exponential race over w = residual (after a rejection) or p (the bonus).
            rejected = accepted < K
            j = tl.minimum(accepted, K - 1)  # the rejected position (clamped when none)
            lse = _row_max_lse(row, V, inv_temp, BLOCK_V)
            d_j = tl.load(draft_ptr + b * K + j)
            q_row = q_ptr + b * stride_qb + j * stride_qk
            best = tl.full((), -1.0, tl.float32)
            token = tl.full((), 0, tl.int64)
            best_p = tl.full((), -1.0, tl.float32)
            token_p = tl.full((), 0, tl.int64)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                valid = offs < V
                x = tl.load(row + offs, mask=valid, other=float("-inf")).to(tl.float32)
                p = tl.exp(x * inv_temp - lse)
                e = tl.load(noise_ptr + b * V + offs, mask=valid, other=1.0).to(tl.float32)
                if HAS_Q:
                    q = tl.load(q_row + offs, mask=valid, other=0.0).to(tl.float32)
                else:
                    q = tl.where(offs == d_j, 1.0, 0.0)
                w = tl.where(rejected, tl.maximum(p - q, 0.0), p)
                score = tl.where(valid, w / e, -1.0)
                m = tl.max(score, 0)
                a = (tl.argmax(score, 0) + start).to(tl.int64)
                token = tl.where(m > best, a, token)
                best = tl.maximum(best, m)
                score_p = tl.where(valid, p / e, -1.0)
                m_p = tl.max(score_p, 0)
                a_p = (tl.argmax(score_p, 0) + start).to(tl.int64)
                token_p = tl.where(m_p > best_p, a_p, token_p)
                best_p = tl.maximum(best_p, m_p)
            # an all-zero residual has probability 0; fall back to p as the reference does
            token = tl.where(best > 0, token, token_p)
        tl.store(accepted_ptr + b, accepted)
        tl.store(next_ptr + b, token)

    def verify_triton(
        logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        uniform: torch.Tensor,
        noise: torch.Tensor,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bsz, k = draft_tokens.shape
        vocab = logits.shape[-1]
        logits = logits.contiguous()
        draft_tokens = draft_tokens.contiguous()
        greedy = temperature == 0
        q = draft_probs.contiguous() if draft_probs is not None else logits  # dummy pointer
        accepted = torch.empty(bsz, dtype=torch.int64, device=logits.device)
        token = torch.empty(bsz, dtype=torch.int64, device=logits.device)
        _verify_kernel[(bsz,)](
            logits,
            draft_tokens,
            q,
            uniform.contiguous(),
            noise.contiguous(),
            accepted,
            token,
            k,
            vocab,
            logits.stride(0),
            logits.stride(1),
            q.stride(0),
            q.stride(1),
            0.0 if greedy else 1.0 / temperature,
            GREEDY=greedy,
            HAS_Q=draft_probs is not None,
            BLOCK_V=4096,
        )
        return accepted, token
