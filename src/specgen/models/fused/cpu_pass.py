"""A Llama-shaped target with packed weights, run on the CPU as one fused C pass.

`FusedPass.of(model)` describes the model once to `kernels/cpu/decoder.c` (every layer's
weights, norms and biases as pointers into the model's own tensors; nothing is copied) and
then runs decode steps, verify blocks and prefills as one call each: the same layer as
models/layers/decoder.py, with packed.c's batch-invariant products. A model it cannot run
(a family that does not declare `fused_cpu`, an option outside `OPTIONS`, dense or bf16
weights, a GPU, a hybrid or shared cache, padded batches) goes through the eager layers;
`SPECGEN_CPU_PASS=eager` forces that path (the oracle in tests, the baseline in benchmarks).
Answers stepped together share one pass (`run_many`) unless `SPECGEN_CPU_PASS=separate`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import time

import torch

from specgen.kernels.decoder_cpu import (
    Layer,
    Lin,
    Model,
    Panels,
    Seg,
    Seq,
    decoder_forward,
    decoder_forward_many,
)
from specgen.kernels.library import kv_kind
from specgen.kernels.packed import ACTIVATIONS, DIRECT_ROWS, activations, kernel_lanes
from specgen.models.cache.kv import StaticKVCache
from specgen.models.family import family_of
from specgen.models.formats import weights as weights_module
from specgen.models.formats.packed_matrix import PackedMatrix
from specgen.models.formats.packed_weight import PackedWeight
from specgen.models.fused.threads import ThreadTuner
from specgen.models.layers.decoder import DecoderLayer

MAX_HEAD_DIM = 512  # decoder.c's per-query accumulator
# below this many multiply-adds per phase (a layer has six, between barriers) one thread
# runs the pass: a tiny model's phases are shorter than waking and meeting a second thread
MIN_PARALLEL_WORK = 1 << 18
# token embeddings kept, dequantized, for decode steps and verify blocks: looking one up
# through the packed matrix's torch ops took 0.1 ms, 2-3% of the default's decode step
EMBED_CACHE_BYTES = 16 << 20
EMBED_CACHED_ROWS = 16  # blocks of up to this many tokens read the cache (a prefill does not)


def wanted() -> bool:
    return os.environ.get("SPECGEN_CPU_PASS", "fused").lower() != "eager"


def kv_dtype() -> torch.dtype:
    """How a target the pass runs keeps its keys and values: fp16 (the default, as
    llama.cpp's), or fp32 with `SPECGEN_CPU_KV=f32`: a long context's decode step and a
    pass of several answers read them all, and in fp32 they outweighed the default's
    weights at 8 answers of 500 positions; side by side fp16 was 0.74-1.00x fp32's time in
    every shape measured (docs/results.md, session 61). The eager layers store the same
    halves."""
    return torch.float16 if kv_kind() == "f16" else torch.float32


def shared_wanted() -> bool:
    """Whether answers stepped together share one pass; `SPECGEN_CPU_PASS=separate` gives
    each its own (the baseline in benchmarks; the same bits)."""
    return os.environ.get("SPECGEN_CPU_PASS", "fused").lower() != "separate"


def tuned_threads() -> bool:
    """Whether the pass picks its thread count from its measured calls (fused_threads.py),
    up to torch's count; `SPECGEN_CPU_THREADS=fixed` always takes torch's count."""
    return os.environ.get("SPECGEN_CPU_THREADS", "tuned").lower() != "fixed"


class FusedPass:
    """The C description of one model; `run` does one forward pass through it."""

    def __init__(self, model) -> None:
        a = model.args
        self.keep: list = []  # every ctypes array and tensor the description points into
        self.tensors: dict[int, torch.Tensor] = {}  # the tensors, by the address described
        self.model_act = ACTIVATIONS[activations()]
        layers = (Layer * a.num_layers)()
        for i, layer in enumerate(model.layers):
            layers[i] = Layer(
                qkv=self._lin(layer.wqkv, layer.bqkv),
                o=self._lin(layer.wo, layer.bo),
                gate_up=self._lin(layer.w_gate_up, layer.b_gate_up),
                down=self._lin(layer.w_down, layer.b_down),
                attn_norm=self._ptr(layer.attn_norm),
                ffn_norm=self._ptr(layer.ffn_norm),
                q_norm=self._ptr(layer.q_norm),
                k_norm=self._ptr(layer.k_norm),
            )
        self.keep.append(layers)
        self.model = Model(
            layers=a.num_layers,
            hidden=a.hidden_size,
            heads=a.num_heads,
            kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            inter=a.intermediate_size,
            vocab=a.vocab_size,
            direct_rows=DIRECT_ROWS,
            act=self.model_act,
            eps=a.rms_norm_eps,
            attn_scale=1.0 / math.sqrt(a.head_dim),
            layer=layers,
            norm=self._ptr(model.norm),
            head=self._lin(model.lm_head, None),
            kv_half=int(kv_dtype() == torch.float16),
        )
        self.layer_count = a.num_layers
        layer = model.layers[0]
        self.layer_work = sum(
            w.shape[0] * w.shape[1] for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
        )
        self.min_parallel_work = MIN_PARALLEL_WORK
        self.tuner = ThreadTuner() if tuned_threads() else None
        self._rows: dict[int, torch.Tensor] = {}  # token id -> its embedding [H]
        self._rows_limit = max(1, EMBED_CACHE_BYTES // (4 * a.hidden_size))

    def embed(self, model, ids: list[int]) -> torch.Tensor:  # [1, T, H] fp32, contiguous
        """`model.embed_tokens` of these tokens (the same bits: cached rows are its own)."""
        if len(ids) > EMBED_CACHED_ROWS:
            return model.embed_tokens(torch.tensor([ids])).contiguous()
        missing = list(dict.fromkeys(i for i in ids if i not in self._rows))
        if missing:
            if len(self._rows) + len(missing) > self._rows_limit:
                self._rows.clear()  # a full cache starts over: simple, and rare
                missing = list(dict.fromkeys(ids))  # this block's cached ones went too
            rows = model.embed_tokens(torch.tensor([missing]))[0]
            self._rows.update(zip(missing, rows.unbind(0), strict=True))
        rows = [self._rows[i] for i in ids]
        return (rows[0] if len(rows) == 1 else torch.stack(rows)).reshape(1, len(ids), -1)

    # describing ------------------------------------------------------------------------
    def _ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        self.keep.append(t)
        known = self.tensors.get(t.data_ptr())
        if known is None or known.nbytes < t.nbytes:  # a view from the start: the larger
            self.tensors[t.data_ptr()] = t
        return t.data_ptr()

    def _lin(self, w: PackedWeight, bias: torch.Tensor | None) -> Lin:
        segs = (Seg * len(w.segments))()
        for j, (start, seg) in enumerate(zip(w.starts, w.segments, strict=True)):
            if isinstance(seg, PackedMatrix):
                segs[j] = Seg(
                    row0=start,
                    rows=seg.shape[0],
                    bits=seg.bits,
                    group=seg.group,
                    half=seg.scale.dtype == torch.float16,
                    q=self._ptr(seg.q),
                    scale=self._ptr(seg.scale),
                    mins=self._ptr(seg.mins),
                    panels=self._panels(seg),
                )
            else:  # a dense fp32 segment
                segs[j] = Seg(row0=start, rows=seg.shape[0], bits=0, group=0, q=self._ptr(seg.w))
        self.keep.append(segs)
        return Lin(segs=segs, nsegs=len(segs), bias=self._ptr(bias), N=w.shape[0], K=w.shape[1])

    def _panels(self, seg: PackedMatrix) -> Panels:
        """The 8-bit-activation kernel's view of the scales, made once here rather than
        transposed in every call (packed.h's Panels); none for fp32 activations."""
        width = kernel_lanes()
        if self.model_act == ACTIVATIONS["fp32"] or width < 2:
            return Panels(width=0)
        mins = None if seg.mins is None else panel_major(seg.mins, width)
        return Panels(self._ptr(panel_major(seg.scale, width)), self._ptr(mins), width)

    # the fast-start image (models/fused/image.py) ---------------------------------------
    def image(self, model) -> tuple[dict, list]:
        """This description as an image's header and buffers: every pointer it holds named
        by its buffer's index, the token embedding and the RoPE tables beside them (the
        model's as built for its last cache: `rope.length` positions)."""
        from specgen.models.fused.image import LINS, NORMS, Described

        d = Described()

        def buf(t) -> int | None:
            return None if t is None else d.add(t.detach().numpy())

        def at(address: int | None) -> int | None:
            return None if not address else buf(self.tensors[address])

        def lin(w: Lin) -> dict:
            segs = []
            for j in range(w.nsegs):
                g = w.segs[j]
                segs.append({
                    "row0": g.row0, "rows": g.rows, "bits": g.bits, "group": g.group,
                    "half": g.half, "q": at(g.q), "scale": at(g.scale), "mins": at(g.mins),
                    "panels": {"scale": at(g.panels.scale), "mins": at(g.panels.mins),
                               "width": g.panels.width},
                })  # fmt: skip
            return {"N": w.N, "K": w.K, "bias": at(w.bias), "segs": segs}

        m = self.model
        sizes = {f: getattr(m, f) for f in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                            "inter", "vocab", "direct_rows", "act", "eps",
                                            "attn_scale", "kv_half")}  # fmt: skip
        layers = [{**{n: lin(getattr(m.layer[i], n)) for n in LINS},
                   **{n: at(getattr(m.layer[i], n)) for n in NORMS}}
                  for i in range(self.layer_count)]  # fmt: skip
        described = {"sizes": sizes, "layers": layers, "norm": at(m.norm), "head": lin(m.head),
                     "layer_work": self.layer_work,
                     "min_parallel_work": self.min_parallel_work}  # fmt: skip
        embed = model.embed
        if len(embed.segments) != 1 or not isinstance(embed.segments[0], PackedMatrix):
            raise ValueError("the image takes a packed embedding of one segment")
        e = embed.segments[0]
        if e.columns is not None or model.args.embed_scale is not None:
            raise ValueError("the image takes an embedding in column order, unscaled")
        cos, sin = model._tables[0]
        header = {
            "pass": described,
            "embed": {"q": buf(e.q), "scale": buf(e.scale), "mins": buf(e.mins),
                      "bits": e.bits, "group": e.group},
            "rope": {"cos": buf(cos), "sin": buf(sin), "length": cos.shape[0]},
            "eos": list(model.args.eos_token_ids),
            "max_positions": model.args.max_positions,
        }  # fmt: skip
        return header, d.buffers

    # running ---------------------------------------------------------------------------
    def run(
        self,
        model,
        tokens: torch.Tensor,  # [1, T]
        cache: StaticKVCache,
        start: int,
        taps: tuple[int, ...],
        num_logits: int,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:  # logits [1, n, V], taps [1, T, H]
        t, h = tokens.shape[1], model.args.hidden_size
        x = self.embed(model, tokens[0].tolist())
        cos, sin = model._tables[0]
        m = self.model
        m.capacity, m.cos, m.sin = cache.capacity, cos.data_ptr(), sin.data_ptr()
        m.k, m.v = cache.k.data_ptr(), cache.v.data_ptr()
        wanted_taps = tuple(dict.fromkeys(i for i in taps if 0 <= i < self.layer_count))
        tap_ids = (ctypes.c_int64 * max(len(wanted_taps), 1))(*wanted_taps)
        tapped = torch.empty(len(wanted_taps), 1, t, h)
        logits = torch.empty(1, num_logits, model.args.vocab_size)
        reading = num_logits < t  # a prompt's chunk
        threads, began = self.threads(t, reading), time.perf_counter()
        failed = decoder_forward()(
            ctypes.byref(m),
            x.data_ptr(),
            t,
            start,
            tap_ids,
            len(wanted_taps),
            tapped.data_ptr(),
            num_logits,
            logits.data_ptr(),
            threads,
        )
        if self.tuner is not None and not reading:
            self.tuner.record(t, threads, time.perf_counter() - began)
        if failed:
            raise MemoryError("fused decoder pass: out of memory for its buffers")
        return logits, dict(zip(wanted_taps, tapped.unbind(0), strict=True))  # one call

    def run_many(
        self,
        model,
        parts: list[tuple[list[int], StaticKVCache, int]],  # (tokens, cache, num_logits)
        taps: tuple[int, ...],
    ) -> list[tuple[torch.Tensor, dict[int, torch.Tensor]]]:
        """Several answers' rows in one pass, each after what its own cache holds (the
        caller reserves and commits): every weight read once for all of them, and each
        row's bits what its answer alone would get (decoder.c). Per answer, as `run`:
        logits [1, num_logits, V] and taps [1, T, H]."""
        h, vocab = model.args.hidden_size, model.args.vocab_size
        rows = [len(tokens) for tokens, _, _ in parts]
        total = sum(rows)
        x = self.embed(model, [t for tokens, _, _ in parts for t in tokens])
        cos, sin = model._tables[0]
        m = self.model
        m.cos, m.sin = cos.data_ptr(), sin.data_ptr()
        seqs = (Seq * len(parts))()
        for i, (tokens, cache, num_logits) in enumerate(parts):
            seqs[i] = Seq(
                k=cache.k.data_ptr(),
                v=cache.v.data_ptr(),
                capacity=cache.capacity,
                start=cache.length,
                rows=len(tokens),
                num_logits=num_logits,
            )
        wanted_taps = tuple(dict.fromkeys(i for i in taps if 0 <= i < self.layer_count))
        tap_ids = (ctypes.c_int64 * max(len(wanted_taps), 1))(*wanted_taps)
        tapped = torch.empty(len(wanted_taps), total, h)
        logits = torch.empty(sum(n for _, _, n in parts), vocab)
        reading = any(n < len(tokens) for tokens, _, n in parts)  # a prompt's chunk among them
        threads, began = self.threads(total, reading), time.perf_counter()
        failed = decoder_forward_many()(
            ctypes.byref(m), seqs, len(parts), x.data_ptr(), tap_ids, len(wanted_taps),
            tapped.data_ptr(), logits.data_ptr(), threads,
        )  # fmt: skip
        if self.tuner is not None and not reading:
            self.tuner.record(total, threads, time.perf_counter() - began)
        if failed:
            raise MemoryError("fused decoder pass: out of memory for its buffers")
        outs, row, head = [], 0, 0
        for (_, _, num_logits), n in zip(parts, rows, strict=True):
            mine = logits[head : head + num_logits].unsqueeze(0)
            rows_taps = tapped[:, row : row + n].unsqueeze(1).unbind(0)  # [1, n, H] each
            outs.append((mine, dict(zip(wanted_taps, rows_taps, strict=True))))
            row, head = row + n, head + num_logits
        return outs

    def threads(self, rows: int, reading: bool = False) -> int:
        """One for a pass too small to share; else up to torch's count (set by --threads),
        as many as run this kind of call fastest now (the same bits whatever the count).
        A pass that reads a prompt's chunk takes them all, untimed: its phases are long
        (threads.py), and served prompts come in 64-row chunks, which the tuner's tries of
        one thread made twice as slow as a step (a request sent meanwhile waited on them)."""
        if rows * self.layer_work < 6 * self.min_parallel_work:
            return 1
        most = torch.get_num_threads()
        return most if self.tuner is None or reading else self.tuner.choose(rows, most)

    # when it applies -------------------------------------------------------------------
    @staticmethod
    def of(model) -> FusedPass | None:
        """The model's pass (built on first use, rebuilt after its weights changed), or
        None where the model cannot run fused (that answer kept too: it is asked every
        forward)."""
        key = (weights_module.generation(), wanted(), activations(), kv_dtype())
        known = model.__dict__.get("_fused")
        if known is not None and known[0] == key:
            return known[1]
        made = FusedPass(model) if key[1] and runnable(model) else None
        model.__dict__["_fused"] = (key, made)
        return made


def panel_major(table: torch.Tensor, width: int) -> torch.Tensor:
    """[N, G] -> [ceil(N / width), G, width], a last panel of fewer rows repeating its last."""
    pad = -table.shape[0] % width
    if pad:
        table = torch.cat([table, table[-1:].expand(pad, -1)])
    return table.reshape(-1, width, table.shape[1]).transpose(1, 2).contiguous()


def cache_fits(model, cache, batch: int, pad) -> bool:
    """Whether a pass over this cache and batch can run fused."""
    a = model.args
    k = getattr(cache, "k", None)
    return (
        type(cache) is StaticKVCache
        and batch == 1
        and pad is None
        and cache._slot_of is None
        and isinstance(k, torch.Tensor)
        and k.shape == (a.num_layers, 1, a.num_kv_heads, cache.capacity, a.head_dim)
        and k.dtype == kv_dtype()
        and cache.v.dtype == k.dtype
        and k.is_contiguous()
        and cache.v.is_contiguous()
        and model._tables[0][0].shape[0] >= cache.capacity
    )


def _any(value, args) -> bool:
    return True


# Every option of a target's ModelArgs, and the values the pass computes: an allow-list,
# so an option added later (or a family's) keeps a model off the pass until it is
# written here and into decoder.c (tests/test_fused_cpu.py checks every field is named).
OPTIONS = {
    "family": _any,  # the family itself says whether its layer is the pass's (fused_cpu)
    "vocab_size": _any,
    "hidden_size": _any,
    "intermediate_size": _any,
    "num_layers": _any,
    "num_heads": lambda v, a: v % a.num_kv_heads == 0,
    "num_kv_heads": _any,
    "head_dim": lambda v, a: v % 2 == 0 and v <= MAX_HEAD_DIM,
    "rms_norm_eps": _any,
    "max_positions": _any,
    "rope": _any,  # the pass reads the model's own cos/sin tables
    "tie_word_embeddings": _any,
    "qkv_bias": _any,
    "o_bias": _any,
    "mlp_bias": _any,
    "qk_norm": _any,
    "eos_token_ids": _any,
    "bos_token_id": _any,
    "attn_output_gate": lambda v, a: not v,
    "rotary_dim": lambda v, a: v is None or v == a.head_dim,
    "norm_offset": lambda v, a: not v,  # decoder.c scales by w, not 1 + w
    "fp32_norms": _any,  # an fp32 model's norms are fp32 anyway
    "layout": lambda v, a: v is None,  # a family's own layer pattern: not the pass's
    "embed_scale": lambda v, a: v is None,
    "logit_softcap": lambda v, a: v is None,
}


def options_runnable(args) -> bool:
    """Whether the pass computes a model with these options: each one named in `OPTIONS`
    with a value it allows, and the family's layer the pass's."""
    return family_of(args).fused_cpu and all(
        f.name in OPTIONS and OPTIONS[f.name](getattr(args, f.name), args)
        for f in dataclasses.fields(args)
    )


def runnable(model) -> bool:
    """A fp32 CPU target of a family and options the pass computes, whose every matrix is
    packed (or fp32 rows)."""
    a = model.args
    if (
        not options_runnable(a)
        or decoder_forward() is None
        or model.dtype != torch.float32
        or model.device.type != "cpu"
        or len(model._tables) != 1
        or any(w is not None for w in model.windows)
        or not _packed(model.lm_head)
    ):
        return False
    for layer in model.layers:
        if type(layer) is not DecoderLayer or layer.in_features != a.hidden_size:
            return False
        if not all(_packed(w) for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)):
            return False
        if (layer.q_norm is None) != (layer.k_norm is None):
            return False
    return True


def _packed(w) -> bool:
    return isinstance(w, PackedWeight) and all(
        (isinstance(s, PackedMatrix) and s.columns is None)  # the pass reads columns in order
        or (not isinstance(s, PackedMatrix) and s.w.dtype == torch.float32)
        for s in w.segments
    )
