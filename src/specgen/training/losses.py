"""Drafter training losses (pure functions of logits; tested on hand-made values).

Slots are weighted w_k = exp(-(k-1)/gamma) for the k-th draft token: early slots decide the
acceptance length, since a token only counts if every earlier one was accepted. A slot
whose target lies past the sequence (target -1) and every slot after it are ignored.

- DFlash: weighted cross-entropy against the target's own tokens. Methods with losses of
  their own (DSpark's, EAGLE-3's) keep them in their packages and weight slots alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slot_weights(targets: torch.Tensor, gamma: float) -> torch.Tensor:  # [A, S] fp32
    """exp(-(k-1)/gamma) on valid slots, 0 from the first invalid slot on."""
    valid = (targets >= 0).int().cumprod(dim=-1).float()
    k = torch.arange(targets.shape[-1], device=targets.device, dtype=torch.float32)
    return valid * torch.exp(-k / gamma)[None, :]


def dflash_loss(
    logits: torch.Tensor, targets: torch.Tensor, gamma: float
) -> torch.Tensor:  # logits [A, S, V], targets [A, S]
    w = slot_weights(targets, gamma)
    ce = F.cross_entropy(
        logits.float().flatten(0, 1), targets.clamp(min=0).flatten(), reduction="none"
    ).view_as(w)
    return (w * ce).sum() / w.sum().clamp(min=1e-9)
