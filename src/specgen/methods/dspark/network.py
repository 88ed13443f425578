"""The DSpark drafter network, in DeepSpec's published formats (`Qwen3DSparkModel`,
`Gemma4DSparkModel`).

The backbone is DFlash's (`models/drafters/dflash.py`): context features of the target's chosen
layers fused by `fc` + `hidden_norm` and injected as K/V, a non-causal block, a final
`norm`, the target's LM head. DSpark adds:

- An anchor-first block (the config has `num_anchors`): the block [anchor, MASK x (g-1)]
  sits at positions anchor_pos .. anchor_pos+g-1 and slot k predicts anchor_pos+k+1, so
  one pass gives g draft logits. Without `num_anchors` slots follow DFlash (slot k predicts
  anchor_pos+k; slots 1..g-1 draft).
- A Markov head: draft token k's logits are the backbone's plus a bias from the previous
  token x_{k-1} (the anchor for the first slot): W2 z, with z = W1[x_{k-1}] (vanilla),
  sigmoid(gate([h_k ; W1[x_{k-1}]])) * W1[x_{k-1}] (gated), or the output of a GRU-like
  state over the block (rnn). Drawing is left to right, each token feeding the next bias.
- A confidence head: c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])) estimates P(x_k accepted |
  x_1..x_{k-1} accepted). h_k is the backbone's output AFTER the final norm: DeepSpec's
  `_forward_backbone` returns `self.norm(...)` and both heads read that tensor.

DeepSpec's plain `dflash_*_block7` checkpoints are the same class with `markov_rank` 0 and
no confidence head: they load here and draft with the anchor-first layout alone.
Its Gemma 4 drafters (`Gemma4DSparkModel`, e.g. `deepseek-ai/dspark_gemma4_12b_block7`)
are the same model over Gemma draft layers (models/drafters/gemma4.py), the noise block
embedded with Gemma's sqrt(H) scale and the base logits soft-capped (`compute_logits`)
before the Markov bias is added.
The checkpoint's `embed_tokens` / `lm_head` are copies of the target's and are skipped
(only their shapes are checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specgen.core.errors import CheckpointError
from specgen.kernels.linear import linear
from specgen.models.drafters.dflash import DFlashArgs, DFlashNet, check_pair
from specgen.models.formats.weights import new_weight
from specgen.models.loading import SafetensorsIndex, fill, read_config
from specgen.models.plans import Plan, Row
from specgen.models.transformer import Transformer

MARKOV_KINDS = ("vanilla", "gated", "rnn")
COPIES = ("embed_tokens.weight", "lm_head.weight")  # the target's own tensors, duplicated


@dataclass(frozen=True)
class DSparkArgs:
    backbone: DFlashArgs
    anchor_first: bool
    markov_rank: int  # 0: no Markov head
    markov_kind: str | None  # one of MARKOV_KINDS when markov_rank > 0
    confidence: bool
    confidence_with_markov: bool

    @property
    def first_slot(self) -> int:
        """The block slot whose output is the first draft token."""
        return 0 if self.anchor_first else 1

    @property
    def max_drafts(self) -> int:
        return self.backbone.block_size - self.first_slot

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, name: str) -> DSparkArgs:
        backbone = DFlashArgs.from_hf(cfg, name=name)
        try:
            rank = int(cfg.get("markov_rank") or 0)
        except (TypeError, ValueError):
            raise CheckpointError(f"{name}: markov_rank must be an integer") from None
        kind = None
        if rank < 0:
            raise CheckpointError(f"{name}: markov_rank must be >= 0 (got {rank})")
        if rank > 0:
            kind = str(cfg.get("markov_head_type") or "").lower()
            if kind not in MARKOV_KINDS:
                raise CheckpointError(
                    f"{name}: markov_head_type must be one of {', '.join(MARKOV_KINDS)} "
                    f"when markov_rank > 0 (got {cfg.get('markov_head_type')!r})"
                )
        confidence = bool(cfg.get("enable_confidence_head", False))
        with_markov = confidence and bool(cfg.get("confidence_head_with_markov", False))
        if with_markov and rank == 0:
            raise CheckpointError(f"{name}: confidence_head_with_markov needs markov_rank > 0")
        return cls(
            backbone=backbone,
            anchor_first="num_anchors" in cfg,
            markov_rank=rank,
            markov_kind=kind,
            confidence=confidence,
            confidence_with_markov=with_markov,
        )


class DSparkNet(nn.Module):
    def __init__(self, args: DSparkArgs, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.args = args
        self.backbone = DFlashNet(args.backbone, dtype=dtype, device=device)
        la, r = args.backbone.layers, args.markov_rank
        h, v = la.hidden_size, la.vocab_size
        w = dict(dtype=dtype, device=device)
        self._rows: torch.Tensor | None = None  # markov_rows' gather, and what it is of
        self._rows_of: torch.Tensor | None = None
        self._rows_key: tuple[int, ...] | None = None
        self._plan: list[Row] = []  # the heads' tensors, in the order they are made
        if r:
            self.markov_w1 = self._param("markov_head.markov_w1.weight", (v, r), w)
            self.markov_w2 = self._param("markov_head.markov_w2.weight", (v, r), w)
        if args.markov_kind == "gated":
            self.gate_w = self._param("markov_head.gate_proj.weight", (r, h + r), w)
            self.gate_b = self._param("markov_head.gate_proj.bias", (r,), w)
        if args.markov_kind == "rnn":
            self.joint_w = self._param("markov_head.joint_proj.weight", (3 * r, 2 * r + h), w)
            self.joint_b = self._param("markov_head.joint_proj.bias", (3 * r,), w)
        if args.confidence:
            width = h + (r if args.confidence_with_markov else 0)
            self.conf_w = self._param("confidence_head.proj.weight", (1, width), w)
            # optional in the checkpoint (nn.Linear's default bias in DeepSpec): zero if absent
            self.conf_b = self._param("confidence_head.proj.bias", (1,), w, optional=True)
            self.conf_b.data.zero_()

    def _param(
        self, key: str, shape: tuple[int, ...], w: dict, optional: bool = False
    ) -> nn.Parameter:
        param = new_weight(*shape, **w)
        self._plan.append(Row(key, param, shape, optional=optional))
        return param

    def plan(self) -> Plan:
        """Every checkpoint tensor: the block backbone's, then the heads'."""
        yield from self.backbone.plan()
        yield from self._plan

    def markov_step(
        self,
        prev: torch.Tensor,  # [N] int64: the token before each slot
        hidden: torch.Tensor,  # [N, H]: the slots' backbone outputs (after the final norm)
        state: torch.Tensor | None,  # [N, r] for the rnn head (zeros at the block start)
        vocab: torch.Tensor | None = None,  # training: bias for these token ids only
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The Markov bias [N, V] (fp32) for these slots, and the rnn head's next state."""
        emb = F.embedding(prev, self.markov_w1)
        kind = self.args.markov_kind
        if kind == "vanilla":
            z = emb
        elif kind == "gated":
            z = torch.sigmoid(F.linear(torch.cat([hidden, emb], -1), self.gate_w, self.gate_b))
            z = z * emb
        else:
            assert state is not None
            joint = F.linear(torch.cat([state, emb, hidden], -1), self.joint_w, self.joint_b)
            gate, candidate, out = joint.chunk(3, dim=-1)
            gate = torch.sigmoid(gate)
            state = gate * state + (1.0 - gate) * torch.tanh(candidate)
            z = torch.tanh(out)
        return linear(z, self.markov_rows(vocab), None).float(), state

    def markov_rows(self, vocab: torch.Tensor | None) -> torch.Tensor:
        """markov_w2's rows for these token ids (all of them without). Outside autograd the
        gather is kept: drafting repeats it at every slot, and for a small target's drafter
        that copy is most of a slot. Kept for this very ids tensor (held,
        so its memory is never another's) at the weight's storage and version, so changed
        weights or ids are never served stale."""
        if vocab is None:
            return self.markov_w2
        if torch.is_grad_enabled():
            return self.markov_w2[vocab]
        w2 = self.markov_w2
        key = (_version(vocab), w2.data_ptr(), _version(w2))
        if self._rows_of is not vocab or self._rows_key != key:
            self._rows, self._rows_of, self._rows_key = w2[vocab], vocab, key
        return self._rows

    def new_state(self, n: int) -> torch.Tensor | None:
        if self.args.markov_kind != "rnn":
            return None
        return torch.zeros(n, self.args.markov_rank, dtype=self.markov_w1.dtype, device=self.device)

    def confidence_logit(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """proj([h ; W1[prev]]) per slot, [N] fp32 (sigmoid of it is the confidence)."""
        features = hidden
        if self.args.confidence_with_markov:
            features = torch.cat([hidden, F.embedding(prev, self.markov_w1)], dim=-1)
        return F.linear(features.float(), self.conf_w.float(), self.conf_b.float())[:, 0]

    @property
    def device(self) -> torch.device:
        return self.backbone.device


def _version(t: torch.Tensor) -> int:
    """t's in-place update count; 0 for an inference tensor, which keeps none (one made in
    inference mode, e.g. weights loaded there, is not updated after loading)."""
    return 0 if t.is_inference() else t._version


def _check_copies(index: SafetensorsIndex, target: Transformer) -> None:
    """The embedding / LM head copies are not loaded, but must fit the target's."""
    want = (target.args.vocab_size, target.args.hidden_size)
    for key in COPIES:
        if key in index.where:
            shape = index.shape(key)
            if shape != want:
                raise CheckpointError(
                    f"{index.name}: {key} has shape {shape}, but the target's is {want}"
                )


def load_dspark(path: Path, *, target: Transformer, target_name: str, name: str) -> DSparkNet:
    """Load a DeepSpec-format DSpark (or DeepSpec DFlash) drafter for `target`."""
    args = DSparkArgs.from_hf(read_config(path, name), name=name)
    check_pair(args.backbone, target.args, name, target_name, min_block=2 - args.first_slot)
    index = SafetensorsIndex(path, name)
    _check_copies(index, target)
    net = DSparkNet(args, dtype=target.dtype, device=target.device)

    fill(net.plan(), index, net.device)
    return net.eval()
