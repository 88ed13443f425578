"""Training a block drafter (z-lab's DFlash network, and methods built on its backbone).

`BlockTraining` is DFlash's training; a method whose network wraps the backbone with heads
of its own (DSpark) subclasses it and overrides the hooks marked so: the network it builds
and loads, where its backbone is, how its slots' logits come out of the backbone's, its
loss, and the config fields that name its layout.

Per sequence: random anchors inside the response give blocks built as at inference
(`blocks.py`); the backbone runs all of them in one pass and its slots go through the
target's frozen LM head (`draft_logits`); the loss is over the slots' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specgen.drafting.vocab import save_draft_vocab
from specgen.models.drafters.dflash import (
    DFlashArgs,
    DFlashNet,
    build_target_layer_ids,
    load_dflash,
)
from specgen.models.transformer import Transformer
from specgen.training.blocks import Blocks, block_forward, make_blocks
from specgen.training.checkpoint import save_drafter, text_config
from specgen.training.evaluate import OfflineAcceptance, walk
from specgen.training.init import init_from_target, random_init
from specgen.training.kind import DrafterTraining
from specgen.training.losses import dflash_loss
from specgen.training.trainer import Prepared, Sequence, Vocab, prepare


@dataclass(frozen=True)
class Drafted:
    """A batch of blocks run through the drafter's backbone (training and evaluation)."""

    blocks: Blocks
    hidden: torch.Tensor  # [A, S, H] the draft slots, after the drafter's final norm

    @property
    def prev(self) -> torch.Tensor:  # [A, S] the true token before each slot (teacher forcing)
        b = self.blocks
        return torch.cat([b.inputs[:, :1], b.targets[:, :-1].clamp(min=0)], dim=1)


def draft_logits(
    target: Transformer, backbone: DFlashNet, hidden: torch.Tensor, vocab: Vocab | None
) -> torch.Tensor:
    """The backbone's head logits as it drafts at inference (its output multiplier and
    softcapping: a Gemma target's), over the whole vocabulary or `vocab`'s rows."""
    if vocab is None:
        return backbone.head(target, hidden)
    return backbone.logits(vocab.logits(hidden))


class BlockTraining(DrafterTraining):
    """DFlash's training; the base of every block drafter's."""

    warm_starts = True
    architecture = "DFlashDraftModel"
    neutral: tuple[str, ...] = ()  # parameter-name endings that start at 0 (random_init)

    # -- what a method built on the backbone overrides --------------------------------
    def new_net(self, config: dict[str, Any], device: torch.device) -> nn.Module:
        return DFlashNet(DFlashArgs.from_hf(config, name="new"), dtype=torch.float32,
                         device=device)  # fmt: skip

    def load(self, path: Path, target: Transformer) -> nn.Module:
        return load_dflash(path, target=target, target_name="target", name=str(path))

    def backbone(self, net: nn.Module) -> DFlashNet:
        return net  # type: ignore[return-value]

    def anchor_first(self, net: nn.Module) -> bool:
        """Slot 0 predicts the token after the anchor (DSpark) instead of being it."""
        return False

    def config_fields(self, cfg) -> dict[str, Any]:
        """The fields of a new drafter's config.json beyond the backbone's."""
        return {}

    def checkpoint_fields(self, net: nn.Module) -> dict[str, Any]:
        """The written config.json's fields that name this layout."""
        args = self.backbone(net).args
        return {
            "architectures": [self.architecture],
            "dflash_config": {
                "mask_token_id": args.mask_token_id,
                "target_layer_ids": list(args.target_layer_ids),
            },
        }

    def slot_logits(
        self, net: nn.Module, base: torch.Tensor, drafted: Drafted, vocab: Vocab | None
    ) -> torch.Tensor:  # [A, S, V]
        """The slots' draft logits from the backbone's head logits (teacher-forced)."""
        return base

    def slot_loss(
        self, target: Transformer, net: nn.Module, item: Prepared, drafted: Drafted,
        base: torch.Tensor, targets: torch.Tensor, gamma: float, vocab: Vocab | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        loss = dflash_loss(base, targets, gamma)
        return loss, {"ce": loss.item()}

    # -- the shared parts -------------------------------------------------------------
    def config(self, target_config: dict[str, Any], target_layers: int, cfg, vocab) -> dict:
        """A drafter config.json for the target, in the layout it is published in."""
        ids = list(cfg.target_layers) or build_target_layer_ids(target_layers, 3)
        out = {
            **text_config(target_config),
            "model_type": "qwen3",
            "num_hidden_layers": cfg.draft_layers,
            "layer_types": ["full_attention"] * cfg.draft_layers,
            "block_size": cfg.block_size,
            "num_target_layers": target_layers,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": ids,
            "tie_word_embeddings": False,
        }
        return {**out, **self.config_fields(cfg)}

    def new(self, target: Transformer, config: dict[str, Any], cfg, vocab) -> nn.Module:
        """Starting weights (`training/init.py`): random, or the target's upper layers (a
        trained drafter's weights are loaded over them by `--init DIR`)."""
        net = self.new_net(config, target.device)
        random_init(net, cfg.seed, self.neutral)
        if cfg.init_from_target:
            init_from_target(self.backbone(net), target)
        return net

    def reads(self, net: nn.Module, target: Transformer) -> tuple[tuple[int, ...], int | None]:
        taps = tuple(self.backbone(net).args.target_layer_ids)
        return taps, None

    def drafted(
        self, target: Transformer, net: nn.Module, item: Prepared, ids: torch.Tensor,
        anchors: torch.Tensor,
    ) -> Drafted:  # fmt: skip
        """Blocks at `anchors`, built as inference builds them, through the backbone at once."""
        backbone = self.backbone(net)
        blocks = make_blocks(
            ids,
            anchors,
            block_size=backbone.args.block_size,
            mask_token_id=backbone.args.mask_token_id,
            anchor_first=self.anchor_first(net),
        )
        features = item.features.to(target.device, target.dtype)
        hidden = block_forward(backbone, features, target.embed_tokens(blocks.inputs), anchors)
        return Drafted(blocks, hidden[:, blocks.first_slot :])

    def loss(
        self, target: Transformer, net: nn.Module, item: Sequence | Prepared, *,
        anchors_per_sequence: int, gamma: float, generator: torch.Generator,
        vocab: Vocab | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]] | None:  # fmt: skip
        if isinstance(item, Sequence):  # not yet through the target (tests, one-offs)
            taps, last = self.reads(net, target)
            item = prepare(target, item, taps, last=last is not None)
        seq, device = item.seq, target.device
        ids = torch.tensor(seq.ids, device=device)
        lo, hi = max(seq.response_start - 1, 1), ids.shape[0] - 2  # anchor: last committed
        if hi < lo:
            return None
        count = min(anchors_per_sequence, hi - lo + 1)
        anchors = lo + torch.randperm(hi - lo + 1, generator=generator)[:count].to(device)
        drafted = self.drafted(target, net, item, ids, anchors.sort().values)
        targets = drafted.blocks.targets
        targets = targets if vocab is None else vocab.targets(targets)
        base = draft_logits(target, self.backbone(net), drafted.hidden, vocab)  # [A, S, V]
        return self.slot_loss(target, net, item, drafted, base, targets, gamma, vocab)

    @torch.no_grad()
    def accepted_lengths(
        self, target: Transformer, net: nn.Module, item: Prepared, chunk: int = 128,
        vocab: Vocab | None = None,
    ) -> tuple[int, torch.Tensor]:  # fmt: skip
        """(first anchor, accepted drafts at each anchor of the answer): the first anchor
        is the answer's first token (decoding's prefill makes it); with `vocab` the drafter
        drafts from its token ids only, as at inference (`drafting/vocab.py`)."""
        seq, device = item.seq, target.device
        ids = torch.tensor(seq.ids, device=device)
        lo, hi = seq.response_start, ids.shape[0] - 2
        out = []
        for start in range(lo, hi + 1, chunk):
            anchors = torch.arange(start, min(start + chunk, hi + 1), device=device)
            drafted = self.drafted(target, net, item, ids, anchors)
            base = draft_logits(target, self.backbone(net), drafted.hidden, vocab)
            logits = self.slot_logits(net, base, drafted, vocab)
            drafts = logits.argmax(-1) if vocab is None else vocab.ids[logits.argmax(-1)]
            targets = drafted.blocks.targets
            match = (drafts == targets) & (targets >= 0)
            out.append(match.int().cumprod(-1).sum(-1))
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return lo, torch.cat(out) if out else empty

    def evaluate(self, target: Transformer, net: nn.Module, held: list[Prepared],
                 vocab: Vocab | None = None) -> OfflineAcceptance:  # fmt: skip
        return walk(self.accepted_lengths(target, net, item, vocab=vocab) for item in held)

    def save(
        self, out: Path, net: nn.Module, target_config: dict[str, Any], *,
        dtype: torch.dtype = torch.bfloat16, extra: dict[str, Any] | None = None,
    ) -> Path:  # fmt: skip
        """config.json + model.safetensors in the published layout."""
        fields = {**self.checkpoint_fields(net), **(extra or {})}
        return save_drafter(out, net, self.backbone(net), target_config, fields, dtype=dtype)

    def write(self, out: Path, net: nn.Module, config: dict[str, Any], vocab: Vocab | None,
              record: dict[str, Any]) -> None:  # fmt: skip
        self.save(out, net, config, extra={"specgen_training": record})
        if vocab is not None:  # inference drafts from the rows training ranked
            save_draft_vocab(out, vocab.ids.tolist())
