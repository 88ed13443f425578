"""The fused CPU decoder pass (`kernels/cpu/decoder.c`): its C structures and its call.

A model is described once as C structures pointing into its tensors (models/fused/cpu_pass.py
builds them); a pass then costs one ctypes call instead of hundreds of torch ops and
packed products. The structures here mirror decoder.c's field for field.
"""

from __future__ import annotations

import ctypes
import functools

from specgen.kernels.library import compiled

i32, i64, f64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p


class Panels(ctypes.Structure):
    """A packed weight's scales and minimums laid out panel by panel (packed.h)."""

    _fields_ = [("scale", ptr), ("mins", ptr), ("width", i64)]


class Seg(ctypes.Structure):
    """Rows [row0, row0 + rows) of a weight: packed (bits 4 or 8) or dense fp32 (bits 0)."""

    _fields_ = [
        ("row0", i64),
        ("rows", i64),
        ("bits", i32),
        ("group", i32),
        ("half", i32),
        ("unused", i32),
        ("q", ptr),
        ("scale", ptr),
        ("mins", ptr),
        ("panels", Panels),
    ]


class Lin(ctypes.Structure):
    _fields_ = [
        ("segs", ctypes.POINTER(Seg)),
        ("nsegs", i64),
        ("bias", ptr),
        ("N", i64),
        ("K", i64),
    ]


class Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", Lin),
        ("o", Lin),
        ("gate_up", Lin),
        ("down", Lin),
        ("attn_norm", ptr),
        ("ffn_norm", ptr),
        ("q_norm", ptr),
        ("k_norm", ptr),
    ]


class Model(ctypes.Structure):
    _fields_ = [
        ("layers", i64),
        ("hidden", i64),
        ("heads", i64),
        ("kv_heads", i64),
        ("head_dim", i64),
        ("inter", i64),
        ("vocab", i64),
        ("capacity", i64),
        ("direct_rows", i64),
        ("act", i64),  # packed.ACTIVATIONS: what the products multiply
        ("eps", f64),
        ("attn_scale", f64),
        ("layer", ctypes.POINTER(Layer)),
        ("norm", ptr),
        ("head", Lin),
        ("cos", ptr),
        ("sin", ptr),
        ("k", ptr),
        ("v", ptr),
        ("kv_half", i64),  # the cache keeps keys and values as fp16 (else fp32)
    ]


class Seq(ctypes.Structure):
    """One answer's part of a shared pass: its cache, positions, rows and logit rows."""

    _fields_ = [
        ("k", ptr),
        ("v", ptr),
        ("capacity", i64),
        ("start", i64),
        ("rows", i64),
        ("num_logits", i64),
    ]


@functools.cache
def decoder_forward_many():
    """decoder.c's `decoder_forward_many` (several answers' rows in one pass), or None when
    the library could not be built."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.decoder_forward_many
    f.argtypes = [ctypes.POINTER(Model), ctypes.POINTER(Seq), i64, ptr, ptr, i64, ptr, ptr,
                  ctypes.c_int]  # fmt: skip
    f.restype = ctypes.c_int
    return f


@functools.cache
def decoder_forward():
    """decoder.c's `decoder_forward`, or None when the library could not be built."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.decoder_forward
    f.argtypes = [ctypes.POINTER(Model), ptr, i64, i64, ptr, i64, ptr, i64, ptr, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


def kv_round():
    """decoder.c's rounding of keys and values to fp16 (`decoder_kv_round(x, out, n,
    portable)`), for its test; None when the library could not be built."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.decoder_kv_round
    f.argtypes = [ptr, ptr, i64, ctypes.c_int]
    f.restype = None
    return f


def gate_exp():
    """decoder.c's e^x for the MLP's gate (`decoder_exp(x, out, n)`: 8 lanes at a time where
    the build has them, the last n % 8 one by one), for its test; None without the library."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.decoder_exp
    f.argtypes = [ptr, ptr, i64]
    f.restype = None
    return f
