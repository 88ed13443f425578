"""Loading what a `Pipeline` runs: the target (resolved, downloaded, converted, loaded) and,
for a checked `SpecConfig`, its draft method and the cost table its schedulers decide from.
`Pipeline.load` and `Pipeline.with_spec` are thin calls into here; a Pipeline itself only
runs what it is given."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from specgen.api.spec import load_method
from specgen.core.config import DEFAULT_CONTEXT, SpecConfig
from specgen.core.device import resolve_device, resolve_dtype
from specgen.core.errors import CheckpointError, OptionError, SpecgenError
from specgen.core.timings import phase
from specgen.drafting import DraftMethod
from specgen.engine.costs import CostWatch, cached_costs
from specgen.hub import Notify, ResolvedModel, resolve_model
from specgen.models.formats.gguf.convert import ensure_converted
from specgen.models.formats.gguf.index import gguf_architecture
from specgen.models.formats.gguf.layouts import OWN_LAYOUTS
from specgen.models.loading import load_gguf_target
from specgen.models.loading import load_target as load_model
from specgen.models.transformer import Transformer
from specgen.scheduling.cost import CostTable
from specgen.text.codec import TextCodec


@dataclass(frozen=True)
class Target:
    """A loaded target: weights, tokenizer, the context its sessions are sized for, and
    where it came from (`source`, part of the cost-table key)."""

    model: Transformer
    codec: TextCodec
    name: str
    context: int
    source: str

    @property
    def cost_key(self) -> str:
        return f"{self.name}|{self.source}"


@dataclass(frozen=True)
class Decoding:
    """What a checked spec loads on a target: its draft method (None: plain AR), the cost
    table its schedulers decide from (None: every draft verified whole, one drafter) and,
    for a measured table, the watch that measures it again when it goes stale."""

    spec: SpecConfig
    method: DraftMethod | None = None
    costs: CostTable | None = None
    watch: CostWatch | None = None


def load_target(
    model: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    context: int | None = None,
    notify: Notify | None = None,
    quantize: str | None = None,
    dequantize: bool = False,
) -> Target:
    """Resolve `model` (alias, path, .gguf or Hub repo) and load it; `context`: KV-cache
    capacity in tokens, default min(model limit, `DEFAULT_CONTEXT`). A GGUF target runs
    packed in its own quantization unless `dequantize` (its weights at `dtype` instead);
    `quantize` ("int8", "int4") packs a full-precision target's matrices on load."""
    with phase("model resolved"):
        resolved = resolve_model(model, notify=notify)
    dev = resolve_device(device)
    # the tokenizer loads in a thread beside the weights: reading its file and filling the
    # matrices both spend time outside Python's lock
    pool = ThreadPoolExecutor(1, thread_name_prefix="specgen-tokenizer")
    tokenizer = pool.submit(_codec, resolved)
    try:
        with phase("weights"):
            target = load_weights(
                resolved,
                resolve_dtype(dtype, dev),
                dev,
                notify=notify,
                quantize=quantize,
                dequantize=dequantize,
            )
        codec = tokenizer.result()
    finally:
        pool.shutdown(wait=False)
    codec.stop_ids |= frozenset(target.args.eos_token_ids)  # the config's, known now
    limit = target.args.max_positions
    if context is not None and not 1 < context <= limit:
        raise SpecgenError(f"--context must be in [2, {limit}] for {resolved.name}")
    context = context or min(limit, DEFAULT_CONTEXT)
    source = resolved.gguf or resolved.path  # a GGUF target: its file (bench's `hf` reads it)
    return Target(target, codec, resolved.name, context, str(source))


def _codec(resolved: ResolvedModel) -> TextCodec:
    with phase("tokenizer"):
        return TextCodec(resolved.path, resolved.name)


def load_weights(
    resolved: ResolvedModel,
    dtype: torch.dtype,
    device: str,
    *,
    notify: Notify | None = None,
    quantize: str | None = None,
    dequantize: bool = False,
) -> Transformer:
    """The resolved model's weights: a GGUF file's packed as they are stored (or
    dequantized to `dtype`), a safetensors checkpoint's at `dtype` (or packed as `quantize`)."""
    if quantize is not None and quantize not in QUANTIZE:
        raise OptionError("quantize", "must be int8 or int4", quantize)
    if resolved.gguf is not None and not dequantize:
        if quantize:
            raise OptionError(
                "quantize",
                f"is not for {resolved.name}: its GGUF file is "
                "already quantized (run it as it is, or add --dequantize)",
                quantize,
            )
        return load_gguf_target(
            resolved.gguf, resolved.path, dtype=dtype, device=device, name=resolved.name
        )
    if resolved.gguf is not None and gguf_architecture(resolved.gguf) in OWN_LAYOUTS:
        # transformers' GGUF reader cannot dequantize these (models/formats/gguf/layouts.py)
        return load_gguf_target(resolved.gguf, resolved.path, dtype=dtype, device=device,
                                name=resolved.name, dequantize=True)  # fmt: skip
    path = resolved.path
    if resolved.gguf is not None:
        path = ensure_converted(resolved.gguf, notify, weights=True)
    model = load_model(path, dtype=dtype, device=device, name=resolved.name)
    if quantize:
        quantize_target(model, quantize, resolved.name)
    return model


QUANTIZE = ("int8", "int4")


def quantize_target(model: Transformer, bits: str, name: str) -> None:
    """Every matrix of `model` packed as `bits` (group-wise; models/formats/packed_weight.py)."""
    import specgen.models.formats.packed_weight  # noqa: F401  (registers int8/int4)
    from specgen.models.formats.weights import convert_weights

    try:
        convert_weights(model, bits)
    except ValueError as e:
        raise CheckpointError(f"{name}: cannot quantize to {bits} ({e})") from None


def load_decoding(
    target: Target,
    spec: SpecConfig,
    *,
    notify: Notify | None = None,
    costs: CostTable | None = None,
    measure_costs: bool = False,
) -> Decoding:
    """`spec` (already `checked_spec`) on `target`: its drafter loaded and, where the
    policy or a choice among drafters needs them, the measured costs (cached;
    `measure_costs`: measured again) with their `CostWatch`. `costs` given instead (fixed
    prices) are used as they are, for the drafters the method mounts, and never watched."""
    if spec.is_ar:
        return Decoding(spec)
    with phase("drafter"):
        method = load_method(target.model, spec, target.name, notify)
    if costs is not None:
        mounted = replace(costs, drafts={n: costs.drafts[n] for n in method.mounted})
        return Decoding(spec, method, mounted)
    if not (spec.verify_policy.needs_costs or len(method.mounted) > 1):
        return Decoding(spec, method)
    graphs = spec.cuda_graphs
    key = target.cost_key
    with phase("cost table"):
        measured = cached_costs(
            target.model, key, method, notify, graphs=graphs, fresh=measure_costs
        )
    watch = CostWatch(target.model, key, method, notify, graphs=graphs)
    return Decoding(spec, method, measured, watch)
