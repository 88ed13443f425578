"""A hybrid target's state (Qwen3.5): the KV cache of its attention layers, and the conv and
recurrent state of its Gated DeltaNet layers, under the KV cache's contract: a forward
commits its tokens, `rollback(length)` forgets every token from `length` on, exactly.

A Gated DeltaNet layer folds every token into one recurrent state, so a rejected draft
cannot simply be left behind as dead positions: after a verify pass over [anchor, d1..dk]
the state must be the state after the anchor and the accepted drafts only. This cache
keeps, per layer, the state before the last step and that step's inputs (a tape of the
rule's q, k, v, g, beta); the next step first replays the tokens that were committed, then
runs its own (kernels/gated_delta.gated_delta_replay), the way z-lab's MLX backend rolls
back. Measured against keeping the state after every token (benchmarks/hybrid_rollback.py,
docs/results.md), it costs a third of the time on the CPU and one state's memory instead
of one per draft position; on a GPU its replay stays in registers.

Two generations of (base state, tape) alternate: a step writes the one it does not read,
so the previous step's range stays restorable while the next is in flight (the device-
resident loop runs a step ahead of the host), and a step interrupted half-way leaves the
one it read intact. The conv inputs of recent positions live in a ring indexed by
position (the conv looks K-1 tokens back).

Prefills (longer than a step, or the loops' prompt forwards) run the chunked form and
start a generation with an empty tape. They also leave snapshots (`checkpoints`) a few
tokens before their end and at their end: a chat's next turn usually re-renders the end of
the last prompt differently (the assistant header, an empty think block), and rolling back
there must not mean prefilling the conversation again. A length no generation and no
snapshot covers is not restorable: `restorable` says how far back one can go, and the
sessions prefill the rest again (exact, only slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.core.config import FULL, ModelArgs
from specgen.kernels.gated_delta import replay_tape
from specgen.models.cache.kv import StaticKVCache

CHECKPOINT_MARGIN = 8  # a prefill is also snapshotted this many tokens before its end
MAX_CHECKPOINTS = 4  # snapshots kept (the newest); each is one full set of layer states

Snapshot = tuple[torch.Tensor, torch.Tensor]  # ([n, B, Hv, dk, dv] states, [n, B, C, K-1])


@dataclass(frozen=True)
class LinearStep:
    """Where one forward's Gated DeltaNet layers read and write (the same for every layer)."""

    tokens: int
    # the generation holding the state before the block (base state + tape), and the one
    # the block's start state and inputs go to: host ints, or [1] on the device (static)
    read: int | torch.Tensor
    write: int | torch.Tensor
    replay: int | torch.Tensor  # tape tokens between that base and the block
    conv_read: torch.Tensor  # [K-1] int64: conv-ring slots of the K-1 inputs before the block
    conv_write: torch.Tensor  # [T] int64: conv-ring slots of the block's inputs (steps)
    # A prefill runs the chunked form and hands the cache (`stage`) the state after each
    # of these offsets (the last is the whole block); nothing is written before the
    # forward commits, so an interrupted prefill leaves the cache as it was.
    prefill: bool = False
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
        hy = args.layout
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
        self.steps = steps  # the longest forward a tape holds (1 + the most drafts)
        self.kernel = hy.conv_kernel
        self.conv_ring = 2 * steps + hy.conv_kernel + 1  # two generations and the conv's reach
        n, f32 = len(linear), dict(dtype=torch.float32, device=device)
        # per layer and generation: the state at the generation's base position, and the
        # tape of the rule's inputs for the tokens after it (zeros, never NaN: a replay on
        # the device multiplies the unused rest by 0)
        self.base = torch.zeros((n, 2, batch, hy.value_heads, hy.key_dim, hy.value_dim), **f32)
        key = (n, 2, batch, steps, hy.key_heads, hy.key_dim)
        self.tape = (
            torch.zeros(key, **f32),
            torch.zeros(key, **f32),
            torch.zeros((n, 2, batch, steps, hy.value_heads, hy.value_dim), **f32),
            torch.zeros((n, 2, batch, steps, hy.value_heads), **f32),
            torch.zeros((n, 2, batch, steps, hy.value_heads), **f32),
        )
        self.conv = torch.zeros((n, batch, hy.conv_dim, self.conv_ring), dtype=dtype, device=device)
        # each generation's base position, and the generation a static step reads and the
        # one it writes: on the device, for graph-captured steps (`stepped` flips them)
        self.positions = torch.zeros(2, dtype=torch.int64, device=device)
        self.read_gen = torch.zeros(1, dtype=torch.int64, device=device)
        self.write_gen = torch.ones(1, dtype=torch.int64, device=device)
        # host view: base position and tape length per generation (None: not restorable)
        self._gens: list[tuple[int, int] | None] = [(0, 0), None]
        self._current = 0  # the generation the next forward reads
        self.checkpoints: dict[int, Snapshot] = {}
        self.step: LinearStep | None = None  # the forward in progress
        # the forward in progress as the host knows it: (start, tokens, kind), kind one of
        # "step" (eager), "static" (begin_static ran), "prefill", "padded" (no snapshots)
        self._block: tuple[int, int, str] | None = None
        self._staged: dict[int, list[Snapshot]] = {}
        self._unsynced = False  # static steps ran whose positions only the device knows

    def slot(self, layer: int) -> int:
        return self._kv_slot[layer]

    def state_slot(self, layer: int) -> int:
        return self._state_slot[layer]

    def tensors(self) -> list[torch.Tensor]:
        return [*super().tensors(), self.base, *self.tape, self.conv]

    def generation(self, layer: int, gen: int | torch.Tensor):
        """One layer's (base state [B, Hv, dk, dv], tape) of a generation: views for a host
        index, copies for a device one."""
        j = self._state_slot[layer]
        if isinstance(gen, int):
            return self.base[j, gen], tuple(x[j, gen] for x in self.tape)
        base = self.base[j].index_select(0, gen)[0]
        return base, tuple(x[j].index_select(0, gen)[0] for x in self.tape)

    def keep_step(
        self, layer: int, gen: int | torch.Tensor, start: torch.Tensor | None, inputs
    ) -> None:
        """A step's start state (unless already written in place) and its inputs (q, k, v,
        g, beta for its T tokens) as a generation's base and tape."""
        j, t = self._state_slot[layer], inputs[0].shape[1]
        if isinstance(gen, int):
            for keep, new in zip(self.tape, inputs, strict=True):
                keep[j, gen, :, :t].copy_(new)
            return
        self.base[j].index_copy_(0, gen, start[None])
        for keep, new in zip(self.tape, inputs, strict=True):
            keep[j, :, :, :t].index_copy_(0, gen, new[None])

    # -- a forward's steps ---------------------------------------------------------------

    def begin(self, tokens: int, *, prefill: bool, pad: torch.Tensor | None = None) -> None:
        """Before an eager forward of `tokens` new tokens at `length`: where its Gated
        DeltaNet layers read and write (`step`). A forward longer than a step (or
        `prefill`) keeps only the state after it, plus snapshots near and at its end."""
        start, read = self.length, self._current
        base, span = self._generations()[read]  # rollback() put `length` in this generation
        assert base <= start <= base + span, (base, start, span)
        prefill = prefill or tokens > self.steps or pad is not None
        device = self.base.device
        real = None
        if pad is not None:
            real = (start + torch.arange(tokens, device=device))[None, :] >= pad[:, None]
        snaps: tuple[int, ...] = ()
        if prefill:
            early = tokens - CHECKPOINT_MARGIN
            snaps = (early, tokens) if early > 0 and pad is None else (tokens,)
        self._gens[1 - read] = None  # overwritten from here on
        self.step = self._slots(torch.tensor([start], device=device), tokens, read, 1 - read,
                                start - base, prefill, snaps, real)  # fmt: skip
        kind = "step" if not prefill else "prefill" if pad is None else "padded"
        self._block = (start, tokens, kind)
        self._staged = {}

    def begin_static(self, positions: torch.Tensor) -> None:  # [T] int64 on the device
        """`begin` for a graph-capturable step whose position lives on the device: it reads
        and writes the generations named in device memory, so a captured graph replays at
        any position and parity; what it does is the same however often it runs (warm-up,
        capture), until `stepped` moves the cache on."""
        if positions.shape[0] > self.steps:
            raise ValueError(f"a static step of {positions.shape[0]} tokens; this cache's "
                             f"tapes hold {self.steps} (new_cache(steps=...))")  # fmt: skip
        start = positions[:1]
        replay = start - self.positions.index_select(0, self.read_gen)
        self.step = self._slots(start, positions.shape[0], self.read_gen, self.write_gen,
                                replay, False, (), None)  # fmt: skip
        self.positions.index_copy_(0, self.write_gen, start)  # the next base: this start
        # (host bookkeeping, run when the step is traced, not when a graph replays it: the
        # generation written is no longer what the host knew of it)
        self._gens[1 - self._current] = None

    def stepped(self) -> None:
        """After each static step, outside any graph: the next one reads what it wrote."""
        self._gens[1 - self._current] = None  # known again at `commit`, if one follows
        self._current = 1 - self._current
        self.read_gen.fill_(self._current)
        self.write_gen.fill_(1 - self._current)
        self._unsynced = True

    def _slots(self, start, tokens, read, write, replay, prefill, snaps, real) -> LinearStep:
        ahead = torch.arange(tokens, device=start.device)
        back = torch.arange(1 - self.kernel, 0, device=start.device)
        return LinearStep(
            tokens=tokens,
            read=read,
            write=write,
            replay=replay,
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
        self._block = (start, tokens, "static")  # begin_static follows, in the forward
        return start

    def commit(self, length: int) -> None:
        super().commit(length)
        if self._block is None:
            return
        (start, tokens, kind), self._block, self.step = self._block, None, None
        staged, self._staged = self._staged, {}
        if kind in ("step", "static"):  # the step's generation: its start and its tape
            if kind == "step":  # an eager step read one generation and wrote the other
                self._current = 1 - self._current
                self.positions[self._current].fill_(start)
                self._point_static_steps()
            self._gens[self._current] = (start, tokens)
            self._unsynced = False
            return
        self._restore(length, self._stacked(staged[tokens]))  # the state after the block
        if kind == "prefill":  # snapshots near the end and at the end
            for offset, per_layer in staged.items():
                self.checkpoints[start + offset] = self._stacked(per_layer)
            while len(self.checkpoints) > MAX_CHECKPOINTS:
                del self.checkpoints[min(self.checkpoints)]

    def assume_written(self, length: int) -> None:
        """The device-resident loop's steps wrote the state up to `length`, where the step
        still in flight (if any) starts; where the generations begin, only the device
        knows until the host next needs it (`restorable`, `rollback`)."""
        super().assume_written(length)

    # -- rolling back ----------------------------------------------------------------------

    def _point_static_steps(self) -> None:
        self.read_gen.fill_(self._current)
        self.write_gen.fill_(1 - self._current)

    def _generations(self) -> list[tuple[int, int] | None]:
        if self._unsynced:  # after the device-resident loop's steps: one host sync
            bases, current = self.positions.tolist(), self._current
            # the last step starts at or before the committed length and its tape holds
            # what was committed after it; the step before committed up to its start
            self._gens[current] = (bases[current], max(0, self.length - bases[current]))
            other = bases[1 - current]
            self._gens[1 - current] = (other, bases[current] - other)
            self._unsynced = False
        return self._gens

    def restorable(self, length: int) -> int:
        """The longest length <= `length` this cache can roll back to exactly."""
        length = min(length, self.length)
        for gen in self._generations():
            if gen and gen[0] <= length <= sum(gen):
                return length
        return max([p for p in self.checkpoints if p <= length], default=0)

    def rollback(self, length: int) -> None:
        gens = self._generations()
        order = (self._current, 1 - self._current)
        held = [g for g in order if gens[g] and gens[g][0] <= length <= sum(gens[g])]
        if held:
            self._current = held[0]  # the next forward replays from this generation
            self._point_static_steps()
        elif length == 0 or length in self.checkpoints:
            self._restore(length)
        else:
            raise ValueError(
                f"rollback({length}): a hybrid target's state is kept for lengths "
                f"{[g for g in gens if g]} and at {sorted(self.checkpoints)} only "
                "(ask restorable() first)"
            )
        super().rollback(length)
        self.checkpoints = {p: c for p, c in self.checkpoints.items() if p <= length}
        self._block, self.step = None, None

    def _restore(self, length: int, snapshot: Snapshot | None = None) -> None:
        """Make `snapshot` (by default the checkpoint at `length`, or the empty state at
        0) the state after `length` tokens: a new generation with an empty tape."""
        if snapshot is None and length == 0:
            snapshot = (
                torch.zeros_like(self.base[:, 0]),
                torch.zeros_like(self.conv[:, :, :, : self.kernel - 1]),
            )
        state, window = snapshot or self.checkpoints[length]
        gen = 1 - self._current
        self.base[:, gen].copy_(state)
        back = torch.arange(length + 1 - self.kernel, length, device=self.conv.device)
        self.conv.index_copy_(3, back % self.conv_ring, window)
        self.positions[gen] = length
        self._gens[gen], self._current = (length, 0), gen
        self._point_static_steps()

    def states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each Gated DeltaNet layer's recurrent state [B, Hv, dk, dv] and last K-1 conv
        inputs [B, C, K-1] after the committed tokens (replayed from its generation): what
        the next token reads. For tests and inspection; decoding never needs it."""
        n = self.length
        gens = self._generations()
        order = (self._current, 1 - self._current)
        gen = next(g for g in order if gens[g] and gens[g][0] <= n <= sum(gens[g]))
        back = torch.arange(n + 1 - self.kernel, n, device=self.conv.device) % self.conv_ring
        out = []
        for layer in self._state_slot:
            base, tape = self.generation(layer, gen)
            state = replay_tape(base, tape, n - self._gens[gen][0])
            out.append((state, self.conv[self._state_slot[layer]].index_select(2, back)))
        return out

    @staticmethod
    def _stacked(per_layer: list[Snapshot]) -> Snapshot:
        """One layer's staged (state, window) each -> ([n, B, Hv, dk, dv], [n, B, C, K-1])."""
        return torch.stack([s for s, _ in per_layer]), torch.stack([w for _, w in per_layer])

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows)
        self.base = self.base[:, :, rows].contiguous()
        self.tape = tuple(x[:, :, rows].contiguous() for x in self.tape)
        self.conv = self.conv[:, rows].contiguous()
        self.checkpoints = {}
