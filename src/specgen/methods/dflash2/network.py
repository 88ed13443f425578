"""The DFlash 2 drafter network, in z-lab's published format (`DFlash2DraftModel`, PyPI
`dflash` 0.1.0; e.g. z-lab/Qwen3.8-27B-DFlash2).

It is DFlash's block drafter (models/drafters/dflash.py: context features as K/V, one pass over
[anchor, MASK x (B-1)], the target's LM head) with two additions:
- every layer's attention and MLP sit inside a grouped dynamic causal convolution over the
  block (methods/dflash2/layer.py);
- a candidate selector picks the draft as a chain instead of a per-slot argmax: slot j
  keeps the top `selector_top_k` tokens of its logits (after `output_multiplier` and the
  soft-cap, as DFlash's) and scores each candidate c as

      unary[j, c] + < predecessor[prev] * P h_j , successor[c] >

  (`predecessor_codebook`, `successor_codebook`: [V, rank]; P: `hidden_projection`),
  where prev is the token chosen at slot j-1 (the anchor for the first). Greedy takes the
  best candidate slot by slot; sampling draws from softmax(score / T) over the candidates,
  which is the q the verifier gets (zero outside them), so rejection sampling stays exact.
The codebooks are stored without a `.weight` suffix (z-lab's `from_pretrained` maps them).
Config: `dflash_config` (else the top level, as z-lab's `_draft_value`) adds
`conv_kernel_size`, `conv_group_size`, `selector_rank` and `selector_top_k` to DFlash's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specgen.core.errors import CheckpointError
from specgen.methods.dflash2.layer import ConvDecoderLayer
from specgen.models.drafters.dflash import DFlashArgs, DFlashNet, check_pair
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.loading import SafetensorsIndex, fill, read_config
from specgen.models.plans import Plan, Row
from specgen.models.transformer import Transformer

ARCHITECTURE = "DFlash2DraftModel"
FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SELECTOR = "candidate_selector."
CODEBOOKS = (SELECTOR + "predecessor_codebook", SELECTOR + "successor_codebook")


@dataclass(frozen=True)
class DFlash2Args(DFlashArgs):
    conv_kernel: int = 2
    conv_group: int = 16
    selector_rank: int = 1
    selector_top_k: int = 1

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, name: str) -> DFlash2Args:
        base = DFlashArgs.from_hf(cfg, name=name)
        if base.gemma is not None:
            raise CheckpointError(f"{name}: DFlash 2 drafters have Qwen3 layers, not Gemma's")
        nested = cfg.get("dflash_config") or {}
        given = {k: nested.get(k, cfg.get(k)) for k in FIELDS}
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise CheckpointError(
                f"{name}: a DFlash 2 config.json needs dflash_config.{', '.join(missing)}"
            )
        try:
            kernel, group, rank, top_k = (int(given[k]) for k in FIELDS)
        except (TypeError, ValueError):
            raise CheckpointError(f"{name}: {', '.join(FIELDS)} must be integers") from None
        values = (kernel, group, rank, top_k)
        bad = [f"{k} {v}" for k, v in zip(FIELDS, values, strict=True) if v < 1]
        if bad:
            raise CheckpointError(f"{name}: {', '.join(bad)} must be positive")
        h, v = base.layers.hidden_size, base.layers.vocab_size
        if h % group:
            raise CheckpointError(f"{name}: conv_group_size {group} does not divide hidden {h}")
        if top_k > v:
            raise CheckpointError(f"{name}: selector_top_k {top_k} exceeds the vocabulary {v}")
        return cls(
            **{f.name: getattr(base, f.name) for f in fields(DFlashArgs)},
            conv_kernel=kernel,
            conv_group=group,
            selector_rank=rank,
            selector_top_k=top_k,
        )


class CandidateSelector(nn.Module):
    def __init__(self, args: DFlash2Args, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        v, h, r = args.layers.vocab_size, args.layers.hidden_size, args.selector_rank
        w = dict(dtype=dtype, device=device)
        self.top_k = args.selector_top_k
        self.predecessor = new_weight(v, r, **w)
        self.successor = new_weight(v, r, **w)
        self.projection = DenseWeight(r, h, **w)

    def plan(self) -> Plan:
        v, r = self.predecessor.shape
        yield Row(CODEBOOKS[0], self.predecessor, (v, r))
        yield Row(CODEBOOKS[1], self.successor, (v, r))
        yield Row(
            SELECTOR + "hidden_projection.weight", self.projection, (r, self.projection.shape[1])
        )

    def walk(
        self,
        hidden: torch.Tensor,  # [k, H]: the draft slots' outputs (after the final norm)
        logits: torch.Tensor,  # [k, W]: their drafter logits (W: the vocabulary, or a subset)
        ids: torch.Tensor | None,  # [W] token ids of the logits' columns (None: 0..W-1)
        anchor: torch.Tensor,  # [1] int64: the token before slot 0
        temperature: float | None = None,  # None: greedy
        noise: torch.Tensor | None = None,  # [>= k, >= top_k] Exp(1): a sampled walk's races
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The chain: tokens [k], the candidates [k, C] and, sampled, q over them [k, C].

        Every step is a device op (no host read), so the walk replays in a CUDA graph. A
        sampled pick is an exponential race: argmax(q / E), E ~ Exp(1), picks c with
        probability q(c)."""
        unary, index = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)
        candidates = index if ids is None else ids[index]
        unary = unary.float()
        proj = self.projection(hidden).float()  # [k, r]
        succ = F.embedding(candidates, self.successor).float()  # [k, C, r]
        prev, tokens, qs = anchor.reshape(1), [], []
        for j in range(hidden.shape[0]):
            pred = F.embedding(prev, self.predecessor).float()[0]  # [r]
            scores = unary[j] + succ[j] @ (pred * proj[j])  # [C]
            if temperature is None:
                pick = scores.argmax(dim=-1, keepdim=True)
            else:
                q = (scores / temperature).softmax(dim=-1)
                pick = (q / noise[j, : q.shape[0]]).argmax(dim=-1, keepdim=True)
                qs.append(q)
            prev = candidates[j].gather(0, pick)
            tokens.append(prev)
        return torch.cat(tokens), candidates, torch.stack(qs) if qs else None


class DFlash2Net(DFlashNet):
    def __init__(self, args: DFlash2Args, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(args, dtype=dtype, device=device)
        self.selector = CandidateSelector(args, dtype, device)

    def new_layer(self, i: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
        a = self.args
        return ConvDecoderLayer(a.layers, a.conv_kernel, a.conv_group, dtype, device)

    def plan(self) -> Plan:
        yield from super().plan()
        yield from self.selector.plan()


def load_dflash2(path: Path, *, target: Transformer, target_name: str, name: str) -> DFlash2Net:
    """Load a z-lab-format DFlash 2 drafter for `target` (validated as a pair first: the
    codebooks must have one row per target token)."""
    args = DFlash2Args.from_hf(read_config(path, name), name=name)
    index = SafetensorsIndex(path, name)
    want = (target.args.vocab_size, args.selector_rank)
    extra = [
        f"{key} is {index.shape(key)}, the target's vocabulary needs {want}"
        for key in CODEBOOKS
        if key in index.where and index.shape(key) != want
    ]
    check_pair(args, target.args, name, target_name, extra)
    net = DFlash2Net(args, dtype=target.dtype, device=target.device)
    fill(net.plan(), index, net.device)
    return net.eval()
