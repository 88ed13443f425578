"""Training a DSpark drafter (`specgen train --kind dspark`): DFlash's block training
(`training/block_drafters.py`) with DSpark's heads and DeepSpec's loss.

The loss: 0.1 * CE + 0.9 * L1(p_draft, p_target) on the Markov-corrected draft
distribution (L1 = 2 x total variation, the quantity acceptance depends on), plus a BCE
of the confidence head against the analytic acceptance 1 - 1/2 ||p_draft - p_target||_1
(detached), all position-weighted as DFlash's. The Markov head is teacher-forced: slot k's
previous token is the true token k-1 (the anchor for the first slot). The slots are
anchor-first (slot k predicts the token after anchor + k), and the target's own
distribution comes from its last layer, which the features cache therefore keeps too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specgen.kernels.rmsnorm import rms_norm
from specgen.methods.dspark.network import DSparkArgs, DSparkNet, load_dspark
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.transformer import Transformer
from specgen.training.block_drafters import BlockTraining, Drafted
from specgen.training.losses import slot_weights
from specgen.training.trainer import Prepared, Vocab

# parameters that start at 0: the Markov head's output (the drafter starts as its plain
# backbone) and the confidence head (it starts undecided)
NEUTRAL = ("markov_w2", "conf_w", "conf_b")


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


class DSparkTraining(BlockTraining):
    architecture = "Qwen3DSparkModel"
    neutral = NEUTRAL

    def new_net(self, config: dict[str, Any], device: torch.device) -> nn.Module:
        return DSparkNet(DSparkArgs.from_hf(config, name="new"), dtype=torch.float32,
                         device=device)  # fmt: skip

    def load(self, path: Path, target: Transformer) -> nn.Module:
        return load_dspark(path, target=target, target_name="target", name=str(path))

    def backbone(self, net: nn.Module) -> DFlashNet:
        return net.backbone  # type: ignore[union-attr,return-value]

    def anchor_first(self, net: nn.Module) -> bool:
        return net.args.anchor_first  # type: ignore[union-attr]

    def config_fields(self, cfg) -> dict[str, Any]:
        return dict(
            num_anchors=512,  # its presence marks the anchor-first layout
            markov_rank=cfg.markov_rank,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        )

    def checkpoint_fields(self, net: nn.Module) -> dict[str, Any]:
        a, args = net.args, self.backbone(net).args  # type: ignore[union-attr]
        fields = dict(
            architectures=[self.architecture],
            mask_token_id=args.mask_token_id,
            target_layer_ids=list(args.target_layer_ids),
            markov_rank=a.markov_rank,
            markov_head_type=a.markov_kind or "vanilla",
            enable_confidence_head=a.confidence,
            confidence_head_with_markov=a.confidence_with_markov,
        )
        if a.anchor_first:
            fields["num_anchors"] = 512
        return fields

    def reads(self, net: nn.Module, target: Transformer) -> tuple[tuple[int, ...], int | None]:
        taps, _ = super().reads(net, target)
        return taps, target.args.num_layers - 1  # the target's own distribution

    def slot_logits(
        self, net: nn.Module, base: torch.Tensor, drafted: Drafted, vocab: Vocab | None
    ) -> torch.Tensor:
        ids = None if vocab is None else vocab.ids
        return markov_logits(net, base, drafted.hidden, drafted.prev, ids)  # type: ignore[arg-type]

    def slot_loss(
        self, target: Transformer, net: nn.Module, item: Prepared, drafted: Drafted,
        base: torch.Tensor, targets: torch.Tensor, gamma: float, vocab: Vocab | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        hidden, prev, device = drafted.hidden, drafted.prev, target.device
        draft = self.slot_logits(net, base, drafted, vocab)
        # the target's distribution for the token at position p is its output at p - 1
        anchors, n = drafted.blocks.anchors, len(item.seq.ids)
        positions = (anchors[:, None] + torch.arange(draft.shape[1], device=device)).clamp(
            max=n - 1
        )
        assert item.last_hidden is not None
        with torch.no_grad():
            last = item.last_hidden[positions].to(target.dtype)
            normed = rms_norm(last, target.norm, target.args.rms_norm_eps)
            target_logits = (
                target.head(normed) if vocab is None else target.softcap(vocab.logits(normed))
            )
        conf = None
        if net.args.confidence:  # type: ignore[union-attr]
            a, s, h = hidden.shape
            conf = net.confidence_logit(hidden.reshape(a * s, h), prev.reshape(-1)).view(a, s)  # type: ignore[operator]
        return dspark_loss(draft, target_logits, targets, conf, gamma)
