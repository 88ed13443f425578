"""The slow oracle for verification: one row, one position at a time, in plain Python.

Same inputs and random numbers as `kernels.verify.verify_torch` (see its docstring), so
the two must agree exactly; written to be obviously right rather than fast.
"""

from __future__ import annotations

import torch


def verify_reference(
    logits: torch.Tensor,  # [B, k+1, V]
    draft_tokens: torch.Tensor,  # [B, k]
    draft_probs: torch.Tensor | None,  # [B, k, V]
    uniform: torch.Tensor,  # [B, k]
    noise: torch.Tensor,  # [B, V]
    temperature: float,
) -> tuple[list[int], list[int]]:
    accepted_all, next_all = [], []
    bsz, k = draft_tokens.shape
    for b in range(bsz):
        accepted = 0
        for i in range(k):
            d = int(draft_tokens[b, i])
            if temperature == 0:
                if d != int(logits[b, i].argmax()):
                    break
            else:
                p = torch.softmax(logits[b, i].float() / temperature, dim=-1)
                q_d = 1.0 if draft_probs is None else float(draft_probs[b, i, d])
                if not float(uniform[b, i]) * q_d < float(p[d]):
                    break
            accepted += 1
        if temperature == 0:
            token = int(logits[b, accepted].argmax())
        else:
            p = torch.softmax(logits[b, accepted].float() / temperature, dim=-1)
            weights = p
            if accepted < k:  # rejected: sample from what p has beyond q
                if draft_probs is None:
                    q = torch.zeros_like(p)
                    q[int(draft_tokens[b, accepted])] = 1.0
                else:
                    q = draft_probs[b, accepted].float()
                residual = (p - q).clamp(min=0)
                if float(residual.sum()) > 0:
                    weights = residual
            token = int((weights / noise[b]).argmax())
        accepted_all.append(accepted)
        next_all.append(token)
    return accepted_all, next_all
