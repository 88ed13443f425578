"""What every drafter trains on: target-generated sequences, the frozen target's hidden
states at the layers a drafter reads (one teacher-forced forward per sequence), and the
training-time head restricted to the tokens the data uses. A method's loss over them is
its own (`training/kind.py`); only the drafter's own weights train.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specgen.models.transformer import Transformer


@dataclass(frozen=True)
class Sequence:
    ids: list[int]  # prompt + response
    response_start: int  # index of the first response token


@dataclass(frozen=True)
class Prepared:
    """A sequence with the frozen target's hidden states, computed once (bf16 to save
    memory; the tap layers for the drafter's context, the last layer where a loss reads the
    target's own distribution)."""

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
    """The target layers whose outputs training reads: the drafter's taps, and the last
    layer too when the loss reads the target's own distribution (`last`)."""
    return taps if last is None else tuple(sorted({*taps, last}))


def prepare(target: Transformer, seq: Sequence, taps: tuple[int, ...], last: bool) -> Prepared:
    final = target.args.num_layers - 1
    hidden = layer_outputs(target, seq, read_layers(taps, final if last else None))
    return Prepared.from_layers(seq, hidden, taps, final if last else None).to(target.device)


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
    def of(cls, target: Transformer, sequences: list[Sequence], limit: int | None = None) -> Vocab:
        """The tokens `sequences` use; with `limit`, the `limit` most frequent in their
        answers (the tokens a drafter drafts; ties by id), a smaller head to draft through
        at the cost of the rarer tokens, which it then never drafts."""
        used = sorted({t for seq in sequences for t in seq.ids})
        if limit is not None and limit < len(used):
            counts = Counter(t for seq in sequences for t in seq.ids[seq.response_start :])
            ranked = sorted(used, key=lambda t: (-counts[t], t))
            used = sorted(ranked[:limit])
        return cls.of_ids(target, used)

    @classmethod
    def of_ids(cls, target: Transformer, used: list[int]) -> Vocab:
        """The vocabulary of these token ids (sorted)."""
        ids = torch.tensor(used, device=target.device)
        index = torch.full((target.args.vocab_size,), -1, device=target.device)
        index[ids] = torch.arange(len(used), device=target.device)
        return cls(ids, index, target.lm_head.lookup(ids).detach().clone())

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return F.linear(normed, self.head)

    def targets(self, tokens: torch.Tensor) -> torch.Tensor:  # -1 stays -1 (no target)
        return torch.where(tokens >= 0, self.index[tokens.clamp(min=0)], -1)
