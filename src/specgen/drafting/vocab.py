"""A drafter's own vocabulary: the LM-head rows it drafts from (optional, lossless).

A drafter that only ever proposes tokens from a subset of the vocabulary needs only those
rows of the target's LM head. For a small target the head is most of a draft step (SmolLM2:
49,152 rows, against ~8k tokens its answers ever use), so drafting through the subset makes
the step several times cheaper. Output stays exact: the verifier judges every draft against
the target's full distribution, and a sampled draft hands it the distribution it was really
drawn from (zero outside the subset).

specgen's trainer writes `draft_vocab.json` ({"token_ids": [...]}) beside a drafter trained
through a restricted head, so inference drafts from the rows training ranked. Drafters
without the file (z-lab's, DeepSpec's) draft from the whole head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.core.errors import CheckpointError
from specgen.kernels.linear import linear
from specgen.models.formats.packed_matrix import PackedMatrix
from specgen.models.formats.packed_weight import PackedWeight
from specgen.models.formats.weights import LinearWeight

FILE = "draft_vocab.json"


@dataclass(frozen=True)
class DraftVocab:
    ids: torch.Tensor  # [V'] token ids, sorted
    # [V', H] the target's LM-head rows for them: on the CPU, a packed head's own packed
    # rows (a quarter of the bytes a draft step streams through fp32 rows, the same logits
    # up to fp32 summation; drafts are judged by the verifier either way)
    head: torch.Tensor | PackedMatrix

    def logits(self, normed: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V']
        if isinstance(self.head, PackedMatrix):
            return self.head(normed)
        return linear(normed, self.head, None)  # the few-row CPU paths of kernels/linear.py

    def to_full(self, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[N, V'] probabilities as [N, V] (zero outside the subset)."""
        out = probs.new_zeros(probs.shape[0], vocab_size)
        return out.index_copy_(1, self.ids, probs)


def save_draft_vocab(path: Path, ids: list[int]) -> None:
    (path / FILE).write_text(json.dumps({"token_ids": sorted(ids)}) + "\n")


def load_draft_vocab(path: Path, lm_head: LinearWeight, name: str) -> DraftVocab | None:
    """The drafter's vocabulary from `path/draft_vocab.json`, or None when it has none."""
    file = path / FILE
    if not file.is_file():
        return None
    try:
        ids = json.loads(file.read_text(encoding="utf-8"))["token_ids"]
        tensor = torch.tensor(sorted({int(i) for i in ids}), dtype=torch.long)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{name}: {FILE} is corrupt ({e})") from None
    vocab = lm_head.shape[0]
    if tensor.numel() == 0 or tensor[0] < 0 or tensor[-1] >= vocab:
        raise CheckpointError(f"{name}: {FILE} names tokens outside the target's {vocab}")
    tensor = tensor.to(lm_head.device)
    return DraftVocab(tensor, _head_rows(lm_head, tensor))


def _head_rows(lm_head: LinearWeight, ids: torch.Tensor) -> torch.Tensor | PackedMatrix:
    if (
        isinstance(lm_head, PackedWeight)
        and lm_head.device.type == "cpu"
        and len(lm_head.segments) == 1
        and isinstance(lm_head.segments[0], PackedMatrix)
    ):
        return lm_head.segments[0].permute_rows(ids)
    return lm_head.lookup(ids).contiguous()
