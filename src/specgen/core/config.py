"""Frozen configuration dataclasses: one per concern.

`ModelArgs` is the few numbers our decoder needs; `models.families.model_args` reads them
from a Hugging Face `config.json` through the family its `model_type` names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgen.core.errors import OptionError, SpecgenError

# Plain decoding's name among the methods (`--method ar`), the key of every speedup's
# baseline; every other method is a registered drafter (specgen.methods)
AR = "ar"

LINEAR, FULL = "linear_attention", "full_attention"  # Qwen3.5's `layer_types`
SLIDING = "sliding_attention"  # Gemma 4's other layer type

ENGINES = ("auto", "overlap", "sync")  # see engine/overlap.py and engine/loop.py

# The answer length when a caller names none: the library's, the CLI's and the server's.
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_CONTEXT = 8192  # positions the KV cache is sized for unless --context says more
# The sampling bounds, one rule for every caller (CLI flags, server request fields);
# temperature stops at OpenAI's 2, where sampling is close to uniform anyway.
MAX_TEMPERATURE = 2.0
# ... and starts, past greedy's 0, at 1e-4: logits / T must stay finite in fp32 (a T of
# 1e-300 is 0 there: the softmax was NaN, a 500 from the server)
MIN_TEMPERATURE = 1e-4
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
# OpenAI's range for presence and frequency penalties
PENALTY_RANGE = (-2.0, 2.0)
# the repetition penalty divides (multiplies) logits: near 0 a logit overflows fp32, and
# past 100 every seen token is out of reach anyway
REPETITION_RANGE = (0.01, 100.0)
MAX_LOGPROBS = 20  # the likeliest tokens reported per position (OpenAI's chat limit)


@dataclass(frozen=True)
class RopeArgs:
    theta: float = 10000.0
    kind: str = "default"  # models/family_config.SUPPORTED_ROPE, or "proportional"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3 only
    # proportional (Gemma 4's global layers): the share of a head's frequencies that turn;
    # the rest have frequency 0 (they pass through), all spaced as over the whole head
    partial: float = 1.0


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a target decoder: what every family's layers share, and (`layout`)
    what is the family's own."""

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
    # Options of the shared layers that some families set: a sigmoid output gate on
    # attention (Qwen3.5), RoPE on the first `rotary_dim` channels of a head only,
    # zero-centred RMSNorm weights (the scale is 1 + weight), RMSNorm weights kept in
    # fp32, embeddings scaled (Gemma: sqrt(hidden)), logits capped as tanh(x / c) * c
    attn_output_gate: bool = False
    rotary_dim: int | None = None  # None: the whole head
    norm_offset: bool = False
    fp32_norms: bool = False
    embed_scale: float | None = None
    logit_softcap: float | None = None
    # The family's own facts about its layers, in its own type (None: every layer alike):
    # Qwen3.5's Gated DeltaNet pattern and shapes (families/qwen3_5.HybridArgs), Gemma 4's
    # per-layer attention shapes (families/gemma4.GemmaArgs); only the family's modules
    # read it
    layout: Any = None

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits, and what is reported of them.

    temperature 0 means greedy (argmax). top_k 0 and top_p 1.0 disable those filters; they
    are applied in transformers' order: temperature, then top-k, then top-p.

    Penalties change the logits first (vLLM's definitions and order; verify/penalties.py):
    `repetition_penalty` (1: off) divides the positive logits and multiplies the negative
    ones of every token in the prompt or the answer so far; `frequency_penalty` subtracts
    itself once per time a token is in the answer so far, `presence_penalty` once if it is
    there at all (OpenAI's). Greedy decoding takes the argmax of the penalised logits.

    `logprobs` (None: off) reports each answer token's log-probability and the `logprobs`
    likeliest tokens' (0: the chosen token's only), from the target's raw distribution:
    log_softmax of its logits before penalties, temperature and filters (vLLM's default,
    `raw_logprobs`), so they do not depend on how the token was chosen. A stop token that
    ends the answer is reported too, after the answer's tokens (vLLM's and OpenAI's way).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            rule = f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]"
            raise OptionError("temperature", rule, self.temperature)
        if self.top_k < -1:
            raise OptionError("top_k", "must be >= 0 (or -1: off)", self.top_k)
        if self.top_k == -1:  # vLLM's and other servers' "off"
            object.__setattr__(self, "top_k", 0)
        if not 0.0 < self.top_p <= 1.0:
            raise OptionError("top_p", "must be in (0, 1]", self.top_p)
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise OptionError("seed", "must be a 64-bit integer", self.seed)
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:  # NaN fails too
                raise OptionError(name, f"must be in [{low:g}, {high:g}]", getattr(self, name))
        low, high = REPETITION_RANGE
        if not low <= self.repetition_penalty <= high:
            rule = f"must be in [{low:g}, {high:g}] (1: off)"
            raise OptionError("repetition_penalty", rule, self.repetition_penalty)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise OptionError("logprobs", f"must be in [0, {MAX_LOGPROBS}]", self.logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def seeded(self) -> bool:
        """A sampled answer with a seed: it depends on its conversation and seed alone, so
        nothing learnt from earlier answers may steer its drafts (they decide which of the
        generator's draws fall on which token)."""
        return self.seed is not None and not self.greedy

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )


def checked_max_new_tokens(n: int) -> int:
    """`n` as an answer length (the rule every caller shares)."""
    if n < 1:
        raise OptionError("max_new_tokens", "must be at least 1", n)
    return n


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

    `method` is `AR` (plain decoding) or a name registered in `specgen.methods`.
    `drafter` is a drafter checkpoint (local directory or Hub repo) overriding the registry,
    or a tuple of them for a method that mounts several (stacked).
    `draft_tokens` caps the tokens drafted per step (None: the method's default).
    `block_size` runs a block drafter at a smaller block than it was trained with.
    `store_mib` caps the memory (MiB) a drafter that reads earlier answers keeps of them
    (suffix; None: its default, 0: none kept), the oldest forgotten first.
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

    method: str = AR
    drafter: str | tuple[str, ...] | None = None
    draft_tokens: int | None = None
    block_size: int | None = None
    store_mib: float | None = None
    verify_policy: VerifyPolicy | str = field(default_factory=VerifyPolicy)
    trace: bool = False
    engine: str = "auto"
    cuda_graphs: bool = True
    # (drafter as given, where it was found on disk) pairs: `api.spec.checked_spec` fills
    # them, so a Hub drafter is resolved (downloaded) once; a drafter not among them is
    # resolved when loaded
    resolved: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

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
            raise OptionError("draft_tokens", "must be at least 1", self.draft_tokens)
        if self.store_mib is not None and not self.store_mib >= 0:  # NaN fails too
            raise OptionError("store_mib", "must be >= 0", self.store_mib)
        if self.block_size is not None and self.block_size < 2:
            raise OptionError("block_size", "must be at least 2", self.block_size)

    @property
    def is_ar(self) -> bool:
        """Plain decoding (with a drafter given, `checked_spec` reads the drafter's kind)."""
        return self.method == AR
