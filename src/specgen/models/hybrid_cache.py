"""A hybrid target's state (Qwen3.5): the KV cache of its attention layers, and the conv and
recurrent state of its Gated DeltaNet layers, under the KV cache's contract: a forward
commits its tokens, `rollback(length)` forgets every token from `length` on, exactly.

A Gated DeltaNet layer folds every token into one recurrent state, so a rejected draft
cannot simply be left behind as dead positions. After a verify pass over [anchor, d1..dk]
the state must be the state after the anchor and the accepted drafts only. This cache keeps
the state after *every* token of decode and verify steps (the per-position mechanism, as
SGLang keeps intermediate states), in a ring indexed by length: the state after L tokens
lives in slot L % R. Rolling back is then free (the next forward starts from the slot of
the rolled-back length) and needs no host value, so CUDA graphs and the device-resident
loop read and write the ring with indices computed on the device. The conv inputs of
recent positions live in a second ring the same way (the conv looks K-1 tokens back).

Prefills (more tokens than the longest step, or the loops' prompt forwards) run the
chunked form and keep only the state after the block, plus snapshots (`checkpoints`) a few
tokens before their end and at their end: a chat's next turn usually re-renders the end of
the last prompt differently (the assistant header, an empty think block), and rolling back
there must not mean prefilling the conversation again. A length the ring no longer holds
and no snapshot covers is not restorable: `restorable` says how far back one can go, and
the sessions prefill the rest again (exact, only slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.config import FULL, ModelArgs
from specgen.models.kv_cache import StaticKVCache

CHECKPOINT_MARGIN = 8  # a prefill is also snapshotted this many tokens before its end
MAX_CHECKPOINTS = 4  # snapshots kept (the newest); each is one full set of layer states


@dataclass(frozen=True)
class LinearStep:
    """Where one forward's Gated DeltaNet layers read and write (the same for every layer).
    Slots are device tensors, so a graph of the forward replays at any length."""

    tokens: int
    read: torch.Tensor  # [1] int64: the state slot before the block
    write: torch.Tensor  # [T] int64: slots of the state after each token (stepwise)
    conv_read: torch.Tensor  # [K-1] int64: conv-ring slots of the K-1 inputs before the block
    conv_write: torch.Tensor  # [T] int64: conv-ring slots of the block's inputs (stepwise)
    # A prefill runs the chunked form and hands the cache (`stage`) the state after each
    # of these offsets (the last is the whole block); nothing enters the rings before the
    # forward commits, so an interrupted prefill leaves them as they were.
    prefill: bool
    snapshots: tuple[int, ...] = ()
    real: torch.Tensor | None = None  # [B, T] bool: False on left padding (batched prompts)


class HybridCache(StaticKVCache):
    def __init__(
        self,
        args: ModelArgs,
        *,
        batch: int,
        capacity: int,
        steps: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        hy = args.hybrid
        assert hy is not None
        attention = [i for i, kind in enumerate(hy.layer_types) if kind == FULL]
        super().__init__(
            num_layers=len(attention),
            batch=batch,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            capacity=capacity,
            dtype=dtype,
            device=device,
        )
        self._kv_slot = {layer: j for j, layer in enumerate(attention)}
        linear = [i for i in range(args.num_layers) if hy.linear(i)]
        self._state_slot = {layer: j for j, layer in enumerate(linear)}
        self.steps = steps  # the longest forward whose every position can be rolled back to
        # the resident loop (CUDA) runs a step ahead of the host: twice the ring keeps every
        # state of the step before the one in flight
        self.ring = steps + 1 if torch.device(device).type == "cpu" else 2 * steps + 2
        self.kernel = hy.conv_kernel
        self.conv_ring = self.ring + hy.conv_kernel - 1
        n = len(linear)
        self.states = torch.zeros(
            (n, batch, self.ring, hy.value_heads, hy.key_dim, hy.value_dim),
            dtype=torch.float32,  # the rule accumulates in fp32 (transformers and fla alike)
            device=device,
        )
        self.conv = torch.zeros((n, batch, hy.conv_dim, self.conv_ring), dtype=dtype, device=device)
        self.low = 0  # the ring holds the state after every length in [low, length]
        self.checkpoints: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.step: LinearStep | None = None  # the forward in progress
        self._block: tuple[int, int, bool, bool] | None = None  # start, tokens, prefill, keep
        self._staged: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def slot(self, layer: int) -> int:
        return self._kv_slot[layer]

    def state_slot(self, layer: int) -> int:
        return self._state_slot[layer]

    def tensors(self) -> list[torch.Tensor]:
        return [*super().tensors(), self.states, self.conv]

    # -- a forward's steps ---------------------------------------------------------------

    def begin(self, tokens: int, *, prefill: bool, pad: torch.Tensor | None = None) -> None:
        """Before an eager forward of `tokens` new tokens at `length`: where its Gated
        DeltaNet layers read and write (`step`). A forward longer than `steps` (or
        `prefill`) keeps only the state after it, plus snapshots near and at its end."""
        start = self.length
        prefill = prefill or tokens > self.steps or pad is not None
        device = self.states.device
        at = torch.tensor([start], device=device)
        real = None
        if pad is not None:
            real = (start + torch.arange(tokens, device=device))[None, :] >= pad[:, None]
        snaps: tuple[int, ...] = ()
        if prefill:
            early = tokens - CHECKPOINT_MARGIN
            snaps = (early, tokens) if early > 0 and pad is None else (tokens,)
        else:  # the steps write over the slots of the oldest lengths the ring held
            self.low = max(self.low, start + tokens - self.ring + 1)
        self.step = self._slots(at, tokens, prefill, real, snaps)
        self._block = (start, tokens, prefill, pad is None)
        self._staged = {}

    def begin_static(self, positions: torch.Tensor) -> None:  # [T] int64 on the device
        """`begin` for a graph-capturable step whose position lives on the device."""
        self.step = self._slots(positions[:1], positions.shape[0], False, None, ())

    def _slots(self, start, tokens, prefill, real, snaps) -> LinearStep:
        ahead = torch.arange(tokens, device=start.device)
        back = torch.arange(1 - self.kernel, 0, device=start.device)
        return LinearStep(
            tokens=tokens,
            read=start % self.ring,
            write=(start + 1 + ahead) % self.ring,
            conv_read=(start + back) % self.conv_ring,
            conv_write=(start + ahead) % self.conv_ring,
            prefill=prefill,
            snapshots=snaps,
            real=real,
        )

    def stage(self, layer: int, offset: int, state: torch.Tensor, window: torch.Tensor) -> None:
        """A prefill's state after `offset` of its tokens [B, Hv, dk, dv], and the K-1 conv
        inputs before that point [B, C, K-1], for one layer (layers in order)."""
        self._staged.setdefault(offset, []).append((state, window.clone()))

    def reserve(self, tokens: int) -> int:
        start = super().reserve(tokens)
        self.low = max(self.low, start + tokens - self.ring + 1)
        self._block = (start, tokens, False, False)  # a static step: every state kept
        return start

    def commit(self, length: int) -> None:
        super().commit(length)
        if self._block is None:
            return
        start, tokens, prefill, snapshot = self._block
        self._block, self.step = None, None
        staged, self._staged = self._staged, {}
        if not prefill:
            return
        final = self._stacked(staged[tokens])
        self._restore(length, final)  # the state after the block enters the rings
        if snapshot:  # a snapshot near the end and at the end (not for padded batches)
            for offset, per_layer in staged.items():
                self.checkpoints[start + offset] = self._stacked(per_layer)
            while len(self.checkpoints) > MAX_CHECKPOINTS:
                del self.checkpoints[min(self.checkpoints)]

    def assume_written(self, length: int) -> None:
        """The device-resident loop's steps (at most `steps` tokens each, one possibly still
        in flight past `length`) wrote the states up to `length`."""
        super().assume_written(length)
        self.low = min(length, max(self.low, length + self.steps - self.ring + 1))

    # -- rolling back ----------------------------------------------------------------------

    def restorable(self, length: int) -> int:
        """The longest length <= `length` this cache can roll back to exactly."""
        length = min(length, self.length)
        if length >= self.low:
            return length
        return max([p for p in self.checkpoints if p <= length], default=0)

    def rollback(self, length: int) -> None:
        if length < self.low:
            if length != 0 and length not in self.checkpoints:
                raise ValueError(
                    f"rollback({length}): a hybrid target's state is kept for lengths "
                    f"{self.low}..{self.length} and at {sorted(self.checkpoints)} only "
                    "(ask restorable() first)"
                )
            self._restore(length)
        super().rollback(length)
        self.checkpoints = {p: c for p, c in self.checkpoints.items() if p <= length}
        self._block, self.step = None, None

    def _restore(self, length: int, snapshot: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Put a snapshot (by default the checkpoint at `length`, or the empty state at 0)
        into the rings as the state after `length` tokens."""
        slots = self._slots(torch.tensor([length], device=self.states.device), 1, False, None, ())
        if snapshot is None and length == 0:
            snapshot = (
                torch.zeros_like(self.states[:, :, 0]),
                torch.zeros_like(self.conv[:, :, :, : self.kernel - 1]),
            )
        state, window = snapshot or self.checkpoints[length]
        self.states.index_copy_(2, slots.read, state.unsqueeze(2))
        self.conv.index_copy_(3, slots.conv_read, window)
        self.low = length

    @staticmethod
    def _stacked(per_layer: list[tuple[torch.Tensor, torch.Tensor]]):
        """One layer's staged (state, window) each -> ([n, B, Hv, dk, dv], [n, B, C, K-1])."""
        return torch.stack([s for s, _ in per_layer]), torch.stack([w for _, w in per_layer])

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows)
        self.states = self.states[:, rows].contiguous()
        self.conv = self.conv[:, rows].contiguous()
        self.checkpoints = {}
