"""Frozen configuration dataclasses: one per concern.

`ModelArgs.from_hf` reads a Hugging Face `config.json` of the Llama, Qwen2, Qwen3 and
Qwen3.5 (hybrid) families into the few numbers our decoder needs; unknown keys are ignored,
unsupported features (sliding windows, exotic RoPE scaling, mixture-of-experts layers) are
refused with a clear message rather than silently computed wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specgen.errors import CheckpointError, SpecgenError

# model_type -> family. The family decides which projections carry biases and whether the
# attention has per-head q/k RMSNorm; everything else is read from the config itself.
FAMILIES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_5": "qwen3_5",  # the multimodal checkpoint: text fields in `text_config`
    "qwen3_5_text": "qwen3_5",
}
# Hybrid families whose mixture-of-experts variants specgen does not run (no expert layers).
MOE_TYPES = {"qwen3_5_moe": "Qwen3.5", "qwen3_5_moe_text": "Qwen3.5", "qwen3_next": "Qwen3-Next"}
LINEAR, FULL = "linear_attention", "full_attention"  # Qwen3.5's `layer_types`

SUPPORTED_ROPE = ("default", "linear", "llama3")

ENGINES = ("auto", "overlap", "sync")  # see engine/overlap.py and engine/loop.py


@dataclass(frozen=True)
class RopeArgs:
    theta: float = 10000.0
    kind: str = "default"  # one of SUPPORTED_ROPE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3 only


@dataclass(frozen=True)
class HybridArgs:
    """Qwen3.5's Gated DeltaNet layers: which layers they are, and their shapes."""

    layer_types: tuple[str, ...]  # per layer: LINEAR (Gated DeltaNet) or FULL (attention)
    conv_kernel: int  # the depthwise causal conv over q/k/v
    key_heads: int
    value_heads: int  # a multiple of key_heads: each q/k head serves several value heads
    key_dim: int
    value_dim: int

    @property
    def conv_dim(self) -> int:  # channels of the conv: q, k and v side by side
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a target decoder (Llama, Qwen2, Qwen3 or Qwen3.5 family)."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_positions: int
    rope: RopeArgs = field(default_factory=RopeArgs)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # Qwen3.5: Gated DeltaNet layers beside the attention ones, a sigmoid output gate on
    # attention, RoPE on the first `rotary_dim` channels of a head only, and zero-centred
    # RMSNorm weights (the scale is 1 + weight)
    hybrid: HybridArgs | None = None
    attn_output_gate: bool = False
    rotary_dim: int | None = None  # None: the whole head
    norm_offset: bool = False

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, name: str = "model") -> ModelArgs:
        """Build from a parsed HF config.json; `name` is only used in error messages."""
        model_type = cfg.get("model_type")
        if model_type in MOE_TYPES or cfg.get("num_experts"):
            family_name = MOE_TYPES.get(str(model_type), str(model_type))
            raise CheckpointError(
                f"{name}: {family_name} mixture-of-experts targets are not supported (specgen "
                "has no expert layers); the dense models run (e.g. qwen3.5-4b, -9b, -27b)"
            )
        family = FAMILIES.get(str(model_type))
        if family == "qwen3_5":
            return _qwen3_5_from_hf(cfg, name)
        if family is None:
            arch = ", ".join(cfg.get("architectures") or []) or "unknown architecture"
            raise CheckpointError(
                f"{name}: unsupported architecture {model_type!r} ({arch}); "
                f"specgen runs the {', '.join(sorted(FAMILIES))} families"
            )
        if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
            raise CheckpointError(f"{name}: sliding-window attention targets are not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{name}: unsupported activation {cfg.get('hidden_act')!r}")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            attention_bias = bool(cfg.get("attention_bias", False))
            return cls(
                family=family,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_positions=int(cfg.get("max_position_embeddings", 4096)),
                rope=_rope_from_hf(cfg, name),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always biases q/k/v (never o); Llama and Qwen3 follow attention_bias.
                qkv_bias=True if family == "qwen2" else attention_bias,
                o_bias=False if family == "qwen2" else attention_bias,
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                qk_norm=family == "qwen3",
                eos_token_ids=_ids(cfg.get("eos_token_id")),
                bos_token_id=cfg.get("bos_token_id"),
            )
        except KeyError as e:
            raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None


def _qwen3_5_from_hf(cfg: dict[str, Any], name: str) -> ModelArgs:
    """Qwen3.5's text backbone: from `text_config` of the multimodal checkpoint (the vision
    tower is never read), or from a text-only config."""
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{name}: config.json has a malformed text_config")
    if text.get("num_experts"):
        return ModelArgs.from_hf({**text, "model_type": "qwen3_5_moe"}, name=name)
    try:
        layers = int(text["num_hidden_layers"])
        types = tuple(text.get("layer_types") or _default_layer_types(text, layers))
        if len(types) != layers or set(types) - {LINEAR, FULL}:
            raise CheckpointError(
                f"{name}: layer_types must give {LINEAR!r} or {FULL!r} for each of the "
                f"{layers} layers (got {list(types)})"
            )
        hybrid = HybridArgs(
            layer_types=types,
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
            key_heads=int(text.get("linear_num_key_heads", 16)),
            value_heads=int(text.get("linear_num_value_heads", 32)),
            key_dim=int(text.get("linear_key_head_dim", 128)),
            value_dim=int(text.get("linear_value_head_dim", 128)),
        )
        if hybrid.value_heads % hybrid.key_heads:
            raise CheckpointError(
                f"{name}: linear_num_value_heads {hybrid.value_heads} is not a multiple of "
                f"linear_num_key_heads {hybrid.key_heads}"
            )
        params = text.get("rope_parameters") or {}
        partial = float(
            params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        )
        base = {**text, "model_type": "qwen3", "rope_parameters": params}
        base.setdefault("head_dim", 256)
        base.setdefault("rope_theta", params.get("rope_theta", 10000.0))
        # the multimodal wrapper decides tying at the top, a text-only config in its own fields
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        args = ModelArgs.from_hf({**base, "tie_word_embeddings": tie}, name=name)
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None
    rotary = int(args.head_dim * partial)
    if rotary % 2 or not 0 < rotary <= args.head_dim:
        raise CheckpointError(
            f"{name}: partial_rotary_factor {partial} gives no usable rotary size"
        )
    eos = args.eos_token_ids or _ids(cfg.get("eos_token_id"))
    return replace(
        args,
        family="qwen3_5",
        hybrid=hybrid,
        attn_output_gate=bool(text.get("attn_output_gate", True)),
        rotary_dim=rotary,
        norm_offset=True,
        eos_token_ids=eos,
    )


def _default_layer_types(text: dict[str, Any], layers: int) -> list[str]:
    """transformers' default: every `full_attention_interval`-th layer is full attention."""
    interval = int(text.get("full_attention_interval", 4))
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope_from_hf(cfg: dict[str, Any], name: str) -> RopeArgs:
    # transformers 5 writes `rope_parameters` (theta inside); older configs have
    # `rope_theta` at the top and `rope_scaling` for the scaling variant.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE:
        raise CheckpointError(f"{name}: unsupported RoPE scaling {kind!r}")
    return RopeArgs(
        theta=float(theta),
        kind=kind,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_positions=int(merged.get("original_max_position_embeddings", 8192)),
    )


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    temperature 0 means greedy (argmax). top_k 0 and top_p 1.0 disable those filters; they
    are applied in transformers' order: temperature, then top-k, then top-p.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecgenError(f"--temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise SpecgenError(f"--top-k must be >= 0 (got {self.top_k})")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecgenError(f"--top-p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


VERIFY_POLICIES = ("cost", "full", "threshold")  # --verify-policy (see VerifyPolicy)


@dataclass(frozen=True)
class VerifyPolicy:
    """`--verify-policy`: how the verify length of each step is chosen. `cost` (default):
    the length with the best expected tokens per second, from the drafter's confidences
    (or acceptance learnt from earlier steps) and measured costs; `full`: every draft
    token; `threshold=X`: while each slot's acceptance estimate c_j >= X (DeepSpec's rule).
    """

    kind: str = "cost"
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in VERIFY_POLICIES:
            raise SpecgenError(f"--verify-policy must be cost, full or threshold=X (got {self})")
        if not 0.0 <= self.threshold <= 1.0:
            raise SpecgenError(f"--verify-policy threshold must be in [0, 1] (got {self})")

    @classmethod
    def parse(cls, text: str) -> VerifyPolicy:
        name, sep, value = text.strip().partition("=")
        if name == "threshold" and sep:
            try:
                return cls("threshold", float(value))
            except ValueError:
                pass
        elif not sep and name in ("cost", "full"):
            return cls(name)
        raise SpecgenError(f"--verify-policy must be cost, full or threshold=X (got {text!r})")

    @property
    def needs_costs(self) -> bool:
        return self.kind == "cost"

    def __str__(self) -> str:
        return f"threshold={self.threshold:g}" if self.kind == "threshold" else self.kind


@dataclass(frozen=True)
class SpecConfig:
    """Which decoding method runs, and its drafting knobs.

    `method` is "ar" (plain decoding) or a name registered in `specgen.drafting.DRAFTERS`.
    `drafter` is a drafter checkpoint (local directory or Hub repo) overriding the registry,
    or a tuple of them for a method that mounts several (stacked).
    `draft_tokens` caps the tokens drafted per step (None: the method's default).
    `block_size` runs a block drafter at a smaller block than it was trained with.
    `verify_policy` chooses each step's verify length: "cost" (best expected tokens per
    second from confidences or acceptance so far, and measured costs), "full" (every draft
    token) or "threshold=X" (while each token's acceptance estimate is >= X); a string or
    a `VerifyPolicy`.
    `trace` records every step (draft, verify length, accepted, bonus) in the stats.
    `engine` is "overlap" (decoding in a thread of its own, one or two steps ahead of the
    caller's detokenizing and rendering; on CUDA a block drafter's steps also keep their
    state on the device, so each step is queued before the host reads the one before,
    engine/resident.py), "sync" (the plain loop) or "auto" (overlap on CUDA, sync on the
    CPU, where torch runs slower from a second thread). Greedy output is the same.
    `cuda_graphs` replays the target's decode and verify steps as CUDA graphs on a CUDA
    device (models/graphs.py); False keeps the eager forward. Ignored on the CPU.
    """

    method: str = "ar"
    drafter: str | tuple[str, ...] | None = None
    draft_tokens: int | None = None
    block_size: int | None = None
    verify_policy: VerifyPolicy | str = field(default_factory=VerifyPolicy)
    trace: bool = False
    engine: str = "auto"
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.drafter, list | tuple):  # one drafter is a plain string
            drafters = tuple(self.drafter)
            one = drafters[0] if drafters else None
            object.__setattr__(self, "drafter", drafters if len(drafters) > 1 else one)
        if self.engine not in ENGINES:
            raise SpecgenError(f"--engine must be auto, overlap or sync (got {self.engine!r})")
        if isinstance(self.verify_policy, str):
            object.__setattr__(self, "verify_policy", VerifyPolicy.parse(self.verify_policy))
        if self.draft_tokens is not None and self.draft_tokens < 1:
            raise SpecgenError(f"--draft-tokens must be at least 1 (got {self.draft_tokens})")
        if self.block_size is not None and self.block_size < 2:
            raise SpecgenError(f"--block-size must be at least 2 (got {self.block_size})")
