"""One training step for a DFlash or DSpark drafter on target-generated sequences.

Per sequence: the frozen target runs once over prompt + response (teacher forcing) for the
tap layers' hidden states and its own logits; random anchors inside the response give
blocks built as at inference (`blocks.py`); the drafter runs all of them in one pass and
its slots go through the target's frozen LM head. DFlash minimises the weighted CE;
DSpark adds its Markov head (teacher-forced), the L1 to the target's distribution and the
confidence head's BCE (`losses.py`). Only the drafter's own weights train.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specgen.kernels.rmsnorm import rms_norm
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.drafters.dspark import DSparkNet
from specgen.models.transformer import Transformer
from specgen.training.blocks import Blocks, block_forward, make_blocks
from specgen.training.losses import dflash_loss, dspark_loss, markov_logits


@dataclass(frozen=True)
class Sequence:
    ids: list[int]  # prompt + response
    response_start: int  # index of the first response token


@dataclass(frozen=True)
class Prepared:
    """A sequence with the frozen target's hidden states, computed once (bf16 to save
    memory; the tap layers for the drafter's context, the last layer for DSpark's target
    distribution)."""

    seq: Sequence
    features: torch.Tensor  # [N, K*H]
    last_hidden: torch.Tensor | None  # [N, H] output of the target's last layer

    @classmethod
    def from_layers(
        cls, seq: Sequence, layers: dict[int, torch.Tensor], taps: tuple[int, ...], last: int | None
    ) -> Prepared:
        """From per-layer outputs (`features.target_features`); `last` = the last layer id."""
        features = torch.cat([layers[i] for i in taps], dim=-1)
        return cls(seq, features, None if last is None else layers[last])

    def to(self, device: torch.device) -> Prepared:
        last = None if self.last_hidden is None else self.last_hidden.to(device)
        return Prepared(self.seq, self.features.to(device), last)


@torch.inference_mode()
def layer_outputs(
    target: Transformer, seq: Sequence, layers: tuple[int, ...]
) -> dict[int, torch.Tensor]:
    """One teacher-forced target forward: {layer: [N, H] bf16 output} on the CPU."""
    n = len(seq.ids)
    ids = torch.tensor([seq.ids], device=target.device)
    run = target(ids, target.new_cache(n), taps=layers, num_logits=1)  # no head over all of it
    return {layer: run.taps[layer][0].to(torch.bfloat16).cpu().contiguous() for layer in layers}


def read_layers(taps: tuple[int, ...], last: int | None) -> tuple[int, ...]:
    """The target layers whose outputs training reads: the drafter's taps, and for DSpark
    the last layer too."""
    return taps if last is None else tuple(sorted({*taps, last}))


def prepare(target: Transformer, seq: Sequence, taps: tuple[int, ...], last: bool) -> Prepared:
    final = target.args.num_layers - 1
    hidden = layer_outputs(target, seq, read_layers(taps, final if last else None))
    return Prepared.from_layers(seq, hidden, taps, final if last else None).to(target.device)


@dataclass(frozen=True)
class Drafted:
    """A batch of blocks run through the drafter's backbone (training and evaluation)."""

    blocks: Blocks
    hidden: torch.Tensor  # [A, S, H] the draft slots, after the drafter's final norm

    @property
    def prev(self) -> torch.Tensor:  # [A, S] the true token before each slot (teacher forcing)
        b = self.blocks
        return torch.cat([b.inputs[:, :1], b.targets[:, :-1].clamp(min=0)], dim=1)


def draft_blocks(
    target: Transformer, net: DFlashNet | DSparkNet, item: Prepared, ids: torch.Tensor,
    anchors: torch.Tensor,
) -> Drafted:  # fmt: skip
    """Blocks at `anchors`, built as inference builds them, through the backbone at once."""
    dspark = isinstance(net, DSparkNet)
    backbone = net.backbone if dspark else net
    blocks = make_blocks(
        ids,
        anchors,
        block_size=backbone.args.block_size,
        mask_token_id=backbone.args.mask_token_id,
        anchor_first=dspark and net.args.anchor_first,
    )
    features = item.features.to(target.device, target.dtype)
    hidden = block_forward(backbone, features, target.embed_tokens(blocks.inputs), anchors)
    return Drafted(blocks, hidden[:, blocks.first_slot :])


@dataclass(frozen=True)
class Vocab:
    """A training-time LM head restricted to the tokens the data uses.

    The frozen 49k-row head is most of a training step's cost for a small target, and a
    drafter trained on the target's own answers never needs the rows of tokens that never
    occur in them. Logits (drafter's and target's) are taken over `ids` only; the written
    checkpoint is untouched (drafters carry no head), and inference uses the full head.
    """

    ids: torch.Tensor  # [V'] sorted token ids
    index: torch.Tensor  # [V] position of each token in `ids`, -1 when absent
    head: torch.Tensor  # [V', H] the target's head rows

    @classmethod
    def of(cls, target: Transformer, sequences: list[Sequence]) -> Vocab:
        used = sorted({t for seq in sequences for t in seq.ids})
        ids = torch.tensor(used, device=target.device)
        index = torch.full((target.args.vocab_size,), -1, device=target.device)
        index[ids] = torch.arange(len(used), device=target.device)
        return cls(ids, index, target.lm_head.lookup(ids).detach().clone())

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return F.linear(normed, self.head)

    def targets(self, tokens: torch.Tensor) -> torch.Tensor:  # -1 stays -1 (no target)
        return torch.where(tokens >= 0, self.index[tokens.clamp(min=0)], -1)


def draft_logits(
    target: Transformer, backbone: DFlashNet, hidden: torch.Tensor, vocab: Vocab | None
) -> torch.Tensor:
    """The drafter's head logits as it drafts at inference (its output multiplier and
    softcapping: a Gemma target's), over the whole vocabulary or `vocab`'s rows."""
    if vocab is None:
        return backbone.head(target, hidden)
    return backbone.logits(vocab.logits(hidden))


def trainable(net: DFlashNet | DSparkNet) -> list[torch.nn.Parameter]:
    params = list(net.parameters())
    for p in params:
        p.requires_grad_(True)
    return params


def sequence_loss(
    target: Transformer,
    net: DFlashNet | DSparkNet,
    item: Sequence | Prepared,
    *,
    anchors_per_sequence: int,
    gamma: float,
    generator: torch.Generator,
    vocab: Vocab | None = None,
) -> tuple[torch.Tensor, dict[str, float]] | None:
    """The loss of one sequence's random anchors (None when it has no anchor)."""
    backbone = net.backbone if isinstance(net, DSparkNet) else net
    dspark = isinstance(net, DSparkNet)
    if isinstance(item, Sequence):
        item = prepare(target, item, backbone.args.target_layer_ids, last=dspark)
    seq, device = item.seq, target.device
    ids = torch.tensor(seq.ids, device=device)
    n = ids.shape[0]
    lo, hi = max(seq.response_start - 1, 1), n - 2  # anchor = last committed token
    if hi < lo:
        return None
    count = min(anchors_per_sequence, hi - lo + 1)
    anchors = lo + torch.randperm(hi - lo + 1, generator=generator)[:count].to(device)
    drafted = draft_blocks(target, net, item, ids, anchors.sort().values)
    blocks, hidden, anchors = drafted.blocks, drafted.hidden, drafted.blocks.anchors
    targets = blocks.targets if vocab is None else vocab.targets(blocks.targets)
    logits = draft_logits(target, backbone, hidden, vocab)  # [A, S, V]
    if not dspark:
        loss = dflash_loss(logits, targets, gamma)
        return loss, {"ce": loss.item()}
    prev = drafted.prev
    draft = markov_logits(net, logits, hidden, prev, None if vocab is None else vocab.ids)
    # the target's distribution for the token at position p is its output at p - 1
    positions = (anchors[:, None] + torch.arange(draft.shape[1], device=device)).clamp(max=n - 1)
    assert item.last_hidden is not None
    with torch.no_grad():
        last = item.last_hidden[positions].to(target.dtype)
        normed = rms_norm(last, target.norm, target.args.rms_norm_eps)
        target_logits = (
            target.head(normed) if vocab is None else target.softcap(vocab.logits(normed))
        )
    conf = None
    if net.args.confidence:
        a, s, h = hidden.shape
        conf = net.confidence_logit(hidden.reshape(a * s, h), prev.reshape(-1)).view(a, s)
    return dspark_loss(draft, target_logits, targets, conf, gamma)
