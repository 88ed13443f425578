"""EAGLE-3 drafter configs in their three published layouts, read into one `Eagle3Args`, and
the check that a drafter fits its target.

- SpecForge / SGLang / SafeAILab EAGLE (`LlamaForCausalLMEagle3`, or a plain Llama config
  with `draft_vocab_size`): one `midlayer`, `fc` over 3 taps, a draft vocabulary with
  `d2t`/`t2d`. Options: `target_hidden_size`, `fc_norm` (one norm per tap), `norm_output`
  (false: logits from the un-normed hidden).
- vLLM speculators (`speculators_model_type: eagle3`): the layer config nested in
  `transformer_layer_config` (Llama or Qwen3 layers), `layers.{i}` (only layer 0 reads 2H),
  `norm_before_residual`, `fc_norm`, `norm_before_fc`, `norm_output` (here: the normed
  hidden is what a chain step feeds back).
- DeepSpec (`Qwen3Eagle3Model`): the target's Qwen3 config extended, 5 taps, the full
  vocabulary (no d2t), `layers.{i}` each reading 2H, `ttt_length` chain steps.
- DeepSpec for Gemma 4 (`Gemma4Eagle3Model`, `eagle3_gemma4_12b_ttt7`): the target's Gemma
  4 text config extended the same way (`build_draft_config`), Gemma 4 layers shaped as its
  global layers (`gemma`), the target's soft-cap on the logits. Only Gemma 4 targets take
  it, and it is the only EAGLE-3 layout Gemma 4 targets take here.

Taps are normalised to specgen's convention, the output of layer i (HF hidden_states[i+1]):
EAGLE's and vLLM's default (2, L//2, L-3) and speculators' explicit ids count the state
*entering* a layer (the output of the one before); SGLang's explicit ids and DeepSpec's
`target_layer_ids` already name layer outputs (SGLang adds 1 to enter the next layer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from specgen.core.config import ModelArgs
from specgen.core.errors import CheckpointError
from specgen.models.drafters.gemma4 import GemmaDraftArgs, gemma_layers_from_hf
from specgen.models.families import model_args

DEFAULT_CHAIN = 7  # draft tokens per step when the checkpoint names none (EAGLE's depth)
ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator")
DEEPSPEC = ("Qwen3Eagle3Model",)
DEEPSPEC_GEMMA = ("Gemma4Eagle3Model",)


@dataclass(frozen=True)
class Eagle3Args:
    layers: ModelArgs  # the drafter's decoder layers
    layout: str  # "specforge", "speculators" or "deepspec"
    taps: tuple[int, ...]  # target layers whose outputs are fused, in fc's order
    target_hidden: int  # the width of each tap
    draft_vocab: int
    target_head: bool = False  # drafts through the target's LM head (DeepSpec's copy)
    own_embed: bool = False  # the drafter's own embedding (its width differs from the target)
    every_layer_fused: bool = False  # every layer reads cat(embedding, hidden), not only 0
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    feed_normed: bool = False  # a chain step feeds back the normed hidden (Eagle 3.1)
    logits_normed: bool = True  # the head reads the normed hidden
    chain: int = DEFAULT_CHAIN
    num_target_layers: int | None = None  # what the checkpoint says it was built for
    raw_taps: tuple[int, ...] = ()  # the ids as the config gives them (for messages)
    gemma: GemmaDraftArgs | None = None  # Gemma 4 layers (DeepSpec's Gemma4Eagle3Model)
    softcap: float | None = None  # the logits' final soft-cap (Gemma's)

    def layer_prefix(self, i: int) -> str:
        return "midlayer." if self.layout == "specforge" else f"layers.{i}."

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, num_target_layers: int, name: str) -> Eagle3Args:
        arch = set(cfg.get("architectures") or [])
        if arch & set(DEEPSPEC_GEMMA):
            return _deepspec_gemma(cfg, name)
        if cfg.get("speculators_model_type") == "eagle3":
            return _speculators(cfg, num_target_layers, name)
        if arch & set(DEEPSPEC):
            return _deepspec(cfg, name)
        return _specforge(cfg, num_target_layers, name)


def entering_default(num_layers: int) -> list[int]:
    """EAGLE's and vLLM's taps: the states entering layers 2, L//2 and L-3."""
    return [2, num_layers // 2, num_layers - 3]


def _layers(cfg: dict[str, Any], name: str) -> ModelArgs:
    try:
        return model_args({**cfg, "use_sliding_window": False, "sliding_window": None}, name=name)
    except CheckpointError:
        raise
    except Exception as e:  # a config no family parses
        raise CheckpointError(f"{name}: not an EAGLE-3 layer config ({e})") from None


def _common(cfg: dict[str, Any], layers: ModelArgs) -> dict[str, Any]:
    return dict(
        target_hidden=int(cfg.get("target_hidden_size") or layers.hidden_size),
        draft_vocab=int(cfg.get("draft_vocab_size") or layers.vocab_size),
        fc_norm=bool(cfg.get("fc_norm", False)),
        own_embed=int(cfg.get("target_hidden_size") or layers.hidden_size) != layers.hidden_size,
    )


def _specforge(cfg: dict[str, Any], num_target: int, name: str) -> Eagle3Args:
    layers = _layers(cfg, name)
    if layers.num_layers != 1:
        raise CheckpointError(
            f"{name}: a SpecForge/EAGLE drafter has one midlayer, config says {layers.num_layers}"
        )
    eagle = cfg.get("eagle_config") or {}
    explicit = eagle.get(
        "eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids")
    )
    if explicit is not None:  # SGLang's: layer outputs
        raw = [int(i) for i in explicit]
        taps = raw
    else:
        raw = entering_default(num_target)
        taps = [i - 1 for i in raw]
    return Eagle3Args(
        layers=layers,
        layout="specforge",
        taps=tuple(taps),
        raw_taps=tuple(raw),
        logits_normed=bool(cfg.get("norm_output", True)),
        **_common(cfg, layers),
    )


def _speculators(cfg: dict[str, Any], num_target: int, name: str) -> Eagle3Args:
    layer_cfg = cfg.get("transformer_layer_config")
    if not isinstance(layer_cfg, dict):
        raise CheckpointError(f"{name}: speculators config has no transformer_layer_config")
    layers = _layers(layer_cfg, name)
    if cfg.get("fc_norm") and cfg.get("norm_before_fc"):
        raise CheckpointError(f"{name}: fc_norm and norm_before_fc exclude each other")
    explicit = cfg.get("eagle_aux_hidden_state_layer_ids")
    raw = [int(i) for i in explicit] if explicit is not None else entering_default(num_target)
    proposals = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    chain = int(proposals[0].get("speculative_tokens") or DEFAULT_CHAIN)
    common = _common({**layer_cfg, **cfg}, layers)
    return Eagle3Args(
        layers=layers,
        layout="speculators",
        taps=tuple(i - 1 for i in raw),  # vLLM's ids: the state entering the layer
        raw_taps=tuple(raw),
        norm_before_fc=bool(cfg.get("norm_before_fc", False)),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        feed_normed=bool(cfg.get("norm_output", False)),
        chain=max(chain, 1),
        **common,
    )


def _deepspec(cfg: dict[str, Any], name: str) -> Eagle3Args:
    layers = _layers(cfg, name)
    layers = replace(layers, num_layers=int(cfg.get("draft_num_hidden_layers", layers.num_layers)))
    common = _common(cfg, layers)
    return Eagle3Args(**{**common, **_deepspec_fields(cfg, layers, name)})


def _deepspec_fields(cfg: dict[str, Any], layers: ModelArgs, name: str) -> dict[str, Any]:
    """What both DeepSpec layouts read alike: taps, chain, the target's head."""
    ids, num_target = cfg.get("target_layer_ids"), cfg.get("num_target_layers")
    if not ids:
        raise CheckpointError(f"{name}: config.json has no target_layer_ids")
    return dict(
        layers=layers,
        layout="deepspec",
        taps=tuple(int(i) for i in ids),  # hidden_states[id + 1]: layer outputs
        raw_taps=tuple(int(i) for i in ids),
        target_head=True,
        every_layer_fused=True,
        chain=int(cfg.get("ttt_length") or DEFAULT_CHAIN),
        num_target_layers=None if num_target is None else int(num_target),
        draft_vocab=layers.vocab_size,
    )


def _deepspec_gemma(cfg: dict[str, Any], name: str) -> Eagle3Args:
    """`Gemma4Eagle3Model`: build_draft_config sets num_hidden_layers to the draft's
    layers (also `draft_num_hidden_layers`); the rest is the target's text config."""
    layers, gemma = gemma_layers_from_hf(cfg, name)
    draft = int(cfg.get("draft_num_hidden_layers", layers.num_layers))
    if draft != layers.num_layers:
        raise CheckpointError(
            f"{name}: num_hidden_layers {layers.num_layers} and draft_num_hidden_layers "
            f"{draft} disagree"
        )
    cap = cfg.get("final_logit_softcapping")
    return Eagle3Args(
        **_deepspec_fields(cfg, layers, name),
        target_hidden=layers.hidden_size,
        gemma=gemma,
        softcap=None if cap is None else float(cap),
    )


def check_pair(
    args: Eagle3Args,
    target: ModelArgs,
    drafter: str,
    target_name: str,
    *,
    d2t: torch.Tensor | None,
    t2d: torch.Tensor | None,
    fc: tuple[int, ...] | None,
    head: tuple[int, ...] | None,
) -> torch.Tensor:  # [draft_vocab] int64: each draft index's target id
    """Refuse a drafter not built for this target, naming both; return its vocabulary map."""
    problems = []
    la = args.layers
    gemma_target = target.family == "gemma4"
    if target.family == "gemma3":  # scaled embeddings: no published layout, none trained here
        problems.append("specgen runs no EAGLE-3 drafter on a gemma3 target")
    elif gemma_target and args.gemma is None:
        problems.append(
            f"a {target.family} target takes DeepSpec's Gemma 4 EAGLE-3 drafters only "
            f"(Gemma4Eagle3Model), not a {args.layout} one"
        )
    if args.gemma is not None and not gemma_target:
        problems.append(
            f"a Gemma 4 EAGLE-3 drafter (Gemma4Eagle3Model) for a {target.family} target"
        )
    if args.target_hidden != target.hidden_size:
        problems.append(f"hidden size {args.target_hidden} vs {target.hidden_size}")
    if la.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {la.vocab_size} vs {target.vocab_size}")
    if args.num_target_layers not in (None, target.num_layers):
        problems.append(
            f"built for {args.num_target_layers} target layers, target has {target.num_layers}"
        )
    bad = [
        r for r, i in zip(args.raw_taps, args.taps, strict=True) if not 0 <= i < target.num_layers
    ]
    if bad:
        problems.append(
            f"tapped layers {list(args.raw_taps)} ({args.layout} ids) fall outside the "
            f"target's {target.num_layers} layers"
        )
    if fc is not None and fc[1:] != (len(args.taps) * args.target_hidden,):
        problems.append(
            f"fc.weight takes {fc[1] if len(fc) > 1 else '?'} features, {len(args.taps)} taps "
            f"of {args.target_hidden} need {len(args.taps) * args.target_hidden}"
        )
    if args.target_head and head is not None and head != (target.vocab_size, target.hidden_size):
        problems.append(f"lm_head {head} is not a copy of the target's head")
    if problems:
        raise CheckpointError(
            f"drafter {drafter} does not fit target {target_name}: {'; '.join(problems)}"
        )
    return vocab_map(args, target, drafter, target_name, d2t, t2d)


def vocab_map(
    args: Eagle3Args,
    target: ModelArgs,
    drafter: str,
    target_name: str,
    d2t: torch.Tensor | None,
    t2d: torch.Tensor | None,
) -> torch.Tensor:  # [draft_vocab] int64
    """target id = draft index + d2t[index] (SpecForge's `used_tokens[i] - i`); checked to
    name distinct target tokens, and to agree with `t2d` where the checkpoint has it."""
    n, vocab = args.draft_vocab, target.vocab_size

    def refuse(why: str) -> CheckpointError:
        return CheckpointError(
            f"drafter {drafter}'s draft vocabulary does not fit target {target_name}: {why}"
        )

    if d2t is None:
        if n != vocab:
            raise refuse(f"{n} draft tokens but no d2t map to the target's {vocab}")
        return torch.arange(n)
    if tuple(d2t.shape) != (n,) or d2t.dtype.is_floating_point:
        raise refuse(f"d2t has shape {tuple(d2t.shape)} ({d2t.dtype}), expected ({n},) integers")
    ids = torch.arange(n, device=d2t.device) + d2t.long()
    if n > vocab or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise refuse(f"d2t maps draft tokens outside the target's vocabulary of {vocab}")
    if torch.unique(ids).numel() != n:
        raise refuse("d2t maps two draft tokens to one target token")
    if t2d is not None:
        if tuple(t2d.shape) != (vocab,):
            raise refuse(f"t2d has {tuple(t2d.shape)} entries for a vocabulary of {vocab}")
        if int(t2d.bool().sum()) != n or not bool(t2d.bool()[ids].all()):
            raise refuse("t2d and d2t name different draft tokens")
    return ids.cpu()
