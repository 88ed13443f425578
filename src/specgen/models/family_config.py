"""Config fields every family reads the same way (shared by the family modules, which
never import each other): the Llama-shaped attention and MLP fields, RoPE, token ids."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from specgen.core.config import ModelArgs, RopeArgs
from specgen.core.errors import CheckpointError

SUPPORTED_ROPE = ("default", "linear", "llama3")


def attention_args(
    cfg: dict[str, Any], name: str, *, family: str, qkv_bias: bool | None = None,
    o_bias: bool | None = None, qk_norm: bool = False,
) -> ModelArgs:  # fmt: skip
    """A Llama-shaped decoder's `ModelArgs` (biases follow `attention_bias` unless given)."""
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise CheckpointError(f"{name}: sliding-window attention targets are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{name}: unsupported activation {cfg.get('hidden_act')!r}")
    with config_errors(name):
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        attention_bias = bool(cfg.get("attention_bias", False))
        return ModelArgs(
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
            rope=rope_from_hf(cfg, name),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias if qkv_bias is None else qkv_bias,
            o_bias=attention_bias if o_bias is None else o_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=qk_norm,
            eos_token_ids=token_ids(cfg.get("eos_token_id")),
            bos_token_id=cfg.get("bos_token_id"),
        )


@contextmanager
def config_errors(name: str) -> Iterator[None]:
    """A missing or malformed config field as one CheckpointError line naming it."""
    try:
        yield
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None


def token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def rope_from_hf(cfg: dict[str, Any], name: str) -> RopeArgs:
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
