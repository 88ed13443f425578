"""Drafter training losses (pure functions of logits; tested on hand-made values).

Slots are weighted w_k = exp(-(k-1)/gamma) for the k-th draft token: early slots decide the
acceptance length, since a token only counts if every earlier one was accepted. A slot
whose target lies past the sequence (target -1) and every slot after it are ignored.

- DFlash: weighted cross-entropy against the target's own tokens.
- DSpark (DeepSpec's recipe): 0.1 * CE + 0.9 * L1(p_draft, p_target) on the Markov-corrected
  draft distribution (L1 = 2 x total variation, the quantity acceptance depends on), plus a
  BCE of the confidence head against the analytic acceptance 1 - 1/2 ||p_draft - p_target||_1
  (detached), all position-weighted. The Markov head is teacher-forced: slot k's previous
  token is the true token k-1 (the anchor for the first slot).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.models.drafters.dspark import DSparkNet


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


def markov_logits(
    net: DSparkNet,
    base: torch.Tensor,  # [A, S, V] backbone logits of the draft slots
    hidden: torch.Tensor,  # [A, S, H]
    prev: torch.Tensor,  # [A, S] the true previous token of each slot (anchor first)
    vocab: torch.Tensor | None = None,  # the token ids `base` covers (None: all)
) -> torch.Tensor:  # [A, S, V] fp32, Markov-corrected (teacher-forced)
    if not net.args.markov_rank:
        return base.float()
    a, s, _ = base.shape
    state = None if net.args.markov_kind != "rnn" else hidden.new_zeros(a, net.args.markov_rank)
    out = []
    for k in range(s):  # the rnn head carries state; vanilla/gated just go slot by slot
        bias, state = net.markov_step(prev[:, k], hidden[:, k], state, vocab)
        out.append(base[:, k].float() + bias)
    return torch.stack(out, dim=1)


def dspark_loss(
    draft_logits: torch.Tensor,  # [A, S, V] Markov-corrected
    target_logits: torch.Tensor,  # [A, S, V] the target's logits for the same positions
    targets: torch.Tensor,  # [A, S]
    confidence_logits: torch.Tensor | None,  # [A, S]
    gamma: float,
    *,
    ce_weight: float = 0.1,
    l1_weight: float = 0.9,
    confidence_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    w = slot_weights(targets, gamma)
    norm = w.sum().clamp(min=1e-9)
    ce = F.cross_entropy(
        draft_logits.float().flatten(0, 1), targets.clamp(min=0).flatten(), reduction="none"
    ).view_as(w)
    p_draft = draft_logits.float().softmax(-1)
    p_target = target_logits.float().softmax(-1).detach()
    l1 = (p_draft - p_target).abs().sum(-1)  # [A, S], in [0, 2]
    loss = (ce_weight * (w * ce).sum() + l1_weight * (w * l1).sum()) / norm
    parts = {
        "ce": ((w * ce).sum() / norm).item(),
        "l1": ((w * l1).sum() / norm).item(),
    }
    if confidence_logits is not None:
        accept = (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)
        bce = F.binary_cross_entropy_with_logits(
            confidence_logits.float(), accept, reduction="none"
        )
        loss = loss + confidence_weight * (w * bce).sum() / norm
        parts["bce"] = ((w * bce).sum() / norm).item()
    return loss, parts
