"""What the two block drafters (DFlash, DSpark) share: one checkpoint loaded and checked
against the target, run at its trained block or a smaller one; a context of the target's
features that follows the target cache; a fixed-shape draft step (drafting/static_draft.py)
that the device-resident loop drives with the anchor and the context length on the device.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specgen.core.draft import Draft
from specgen.core.errors import SpecgenError
from specgen.drafting.base import Checkpoint, DraftMethod, ResidentDrafter
from specgen.drafting.context import DraftContext
from specgen.drafting.packing import packed_like
from specgen.drafting.static_draft import StaticBlockDraft
from specgen.drafting.vocab import DraftVocab, load_draft_vocab
from specgen.models.graphs import GREEDY, StepGraphs

if TYPE_CHECKING:
    from specgen.core.config import SpecConfig
    from specgen.models.drafters.dflash import DFlashNet
    from specgen.models.transformer import Transformer


class BlockMethod(DraftMethod):
    label: ClassVar[str]  # "DFlash" or "DSpark", in messages

    def __init__(
        self,
        net: Any,  # DFlashNet, or DSparkNet (a DFlash backbone with heads)
        target: Transformer,
        block_size: int,
        draft_tokens: int | None = None,
        vocab: DraftVocab | None = None,
        *,
        cache_key: str = "",
        cuda_graphs: bool = False,
    ) -> None:
        self.net = net
        self.target = target
        self.block_size = block_size
        self.vocab = vocab  # drafts come from these head rows only (drafting/vocab.py)
        slots = self.draft_slots(block_size)
        self.max_draft_tokens = min(slots, draft_tokens or slots)
        self.cache_key = cache_key
        self.cuda_graphs = cuda_graphs  # draft steps as CUDA graphs

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> BlockMethod:
        if len(checkpoints) != 1:
            raise SpecgenError(f"no {cls.name} drafter given for {target_name}; pass --drafter")
        checkpoint = checkpoints[0]
        if notify:
            notify(f"loading {cls.label} drafter {checkpoint.short_name}")
        net = cls.load_net(checkpoint, target, target_name)
        weights = packed_like(net, target)
        trained = cls.trained_block(net)
        block = spec.block_size or trained
        if block > trained:
            raise SpecgenError(
                f"--block-size {block} exceeds the block {trained} {checkpoint.name} was "
                "trained with (smaller blocks work, larger ones do not)"
            )
        return cls(
            net,
            target,
            block,
            spec.draft_tokens,
            load_draft_vocab(checkpoint.path, target.lm_head, checkpoint.name),
            cache_key=f"{cls.name}|{checkpoint.path}|{block}|{spec.draft_tokens}|{weights}",
            cuda_graphs=spec.cuda_graphs and target.device.type == "cuda",
            **cls.extras(checkpoint.path, net),
        )

    @classmethod
    @abstractmethod
    def load_net(cls, checkpoint: Checkpoint, target: Transformer, target_name: str) -> Any:
        """The drafter network, checked against the target."""

    @classmethod
    @abstractmethod
    def trained_block(cls, net: Any) -> int:
        """The block the checkpoint was trained with."""

    @classmethod
    def extras(cls, path: Path, net: Any) -> dict[str, Any]:
        """What else `__init__` takes from the checkpoint's directory."""
        return {}

    @abstractmethod
    def draft_slots(self, block_size: int) -> int:
        """Draft tokens a block of this size proposes."""


class BlockDrafter(ResidentDrafter):
    taps: tuple[int, ...]
    context: DraftContext
    backbone: DFlashNet
    steps: StepGraphs  # the fixed-shape draft steps (CUDA graphs with graphs on)

    def __init__(self, method: BlockMethod, capacity: int, backbone: DFlashNet) -> None:
        self.method = method
        self.net, self.target, self.backbone = method.net, method.target, backbone
        self.max_draft_tokens = method.max_draft_tokens
        self.taps = backbone.args.target_layer_ids
        self.context = DraftContext(
            backbone.new_cache(capacity), backbone.extend, backbone.extend_at
        )
        self._masks = [backbone.args.mask_token_id] * (method.block_size - 1)
        self.steps = StepGraphs(self.build_step, on=method.cuda_graphs)

    @abstractmethod
    def build_step(self, key: Any, capture: bool) -> Callable[..., Draft]:
        """The drafter's fixed-shape draft step for `key` (`GREEDY`, or the sampling
        setting its sampled steps are keyed by): its head on `StaticBlockDraft`."""

    def tensors(self) -> list[torch.Tensor]:
        return [*self.net.parameters(), self.context.cache.k, self.context.cache.v]

    def rollback(self, length: int) -> None:
        self.context.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        self.context.append(tuple(taps[i] for i in self.taps))  # joined when projected

    def begin_resident(self) -> None:
        self.context.ready()  # what waits is projected now; `observe_at` writes the rest

    def observe_at(
        self, tokens: torch.Tensor, taps: Mapping[int, torch.Tensor], start: torch.Tensor
    ) -> None:
        self.context.write_at(self._features(taps), start)

    def assume(self, length: int) -> None:
        self.context.assume(length)

    def _features(self, taps: Mapping[int, torch.Tensor]) -> torch.Tensor:  # [1, T, K*H]
        return torch.cat([taps[i] for i in self.taps], dim=-1)

    def _block(self, anchor: int) -> torch.Tensor:  # [1, B, H]: [anchor, MASK x (B-1)]
        ids = torch.tensor([[anchor, *self._masks]], device=self.target.device)
        return self.backbone.embed_block(self.target, ids)

    def _static_step(self, finish, capture: bool) -> StaticBlockDraft:
        return StaticBlockDraft(
            self.context, self.backbone, self.target, self._masks, finish, capture
        )

    def _graphed(
        self, anchor: int | torch.Tensor, start: int | torch.Tensor, k: int
    ) -> Draft | None:
        """The greedy draft as a graph replay; None with graphs off (the ordinary path)."""
        return self.steps.replay(GREEDY, anchor, start, k)

    def _fixed(self, anchor: torch.Tensor, start: torch.Tensor, k: int) -> Draft:
        """The fixed-shape greedy draft from device state: replayed, or run eagerly."""
        return self.steps(GREEDY, anchor, start, k)
