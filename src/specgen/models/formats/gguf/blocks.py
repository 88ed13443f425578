"""GGUF quantization blocks, turned into `PackedMatrix` storage without dequantizing.

Block layouts follow ggml's `ggml-common.h` (cross-checked against the `gguf` package's
dequantizers, which tests/test_packed.py uses as the oracle on random blocks). Each format
maps onto one of the two kinds `models/formats/packed_matrix.py` stores:

    Q4_0  w = d (q - 8)          4-bit, scale d, min -8d        (exact: d q and 8d are exact)
    Q4_1  w = d q + m            4-bit, scale d, min m
    Q4_K  w = d sc q - dmin m    4-bit per 32, scale d sc, min -dmin m
    Q5_0  w = d (q - 16)         8-bit, q - 16, scale d
    Q5_1  w = d q + m            8-bit, scale d, min m
    Q5_K  w = d sc q - dmin m    8-bit per 32, scale d sc, min -dmin m
    Q6_K  w = d sc (q - 32)      8-bit per 16, scale d sc
    Q8_0  w = d q                8-bit, scale d

5- and 6-bit formats are widened to one byte per weight (a known cost: 1.5-1.8x their file
size); the 4- and 8-bit ones stay at their file size plus fp32 scales.
"""

from __future__ import annotations

import numpy as np
import torch

from specgen.models.formats.packed_matrix import PackedMatrix

QK_K = 256


def _f16(b: np.ndarray) -> np.ndarray:  # [..., 2] uint8 -> [...] float32
    return _halves(b).astype(np.float32)


def _halves(b: np.ndarray) -> np.ndarray:  # [..., 2] uint8 -> [...] float16, as stored
    """A block's fp16 field as it is: where the format uses it unchanged (a scale, a
    minimum), `PackedMatrix` keeps it so without converting it twice."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _nibbles_to_q4(v: np.ndarray) -> np.ndarray:  # [N, blocks, 32] values 0..15 -> [N, K/2]
    """Values in column order, packed as the Q4 kind stores them."""
    n = v.shape[0]
    return (v[..., :16] | (v[..., 16:] << 4)).astype(np.uint8).reshape(n, -1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    lo, hi = s[..., 0:4], s[..., 4:8]
    tail = s[..., 8:12]
    sc = np.concatenate([lo & 63, (tail & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (tail >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_0(b, n, k):
    b = b.reshape(n, k // 32, 18)
    d = _f16(b[..., 0:2])
    return b[..., 2:].reshape(n, k // 2), d, -8 * d, 4, 32


def _q4_1(b, n, k):
    b = b.reshape(n, k // 32, 20)
    return b[..., 4:].reshape(n, k // 2), _halves(b[..., 0:2]), _halves(b[..., 2:4]), 4, 32


def _q8_0(b, n, k):
    b = b.reshape(n, k // 32, 34)
    return b[..., 2:].view(np.int8).reshape(n, k), _halves(b[..., 0:2]), None, 8, 32


def _q5_high(qh: np.ndarray) -> np.ndarray:  # [N, B, 4] -> [N, B, 32] fifth bits
    bits = np.ascontiguousarray(qh).view(np.uint32)  # little-endian, as ggml writes it
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_low(qs: np.ndarray) -> np.ndarray:  # [N, B, 16] -> [N, B, 32] low nibbles in order
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _q5_0(b, n, k):
    b = b.reshape(n, k // 32, 22)
    q = _q5_low(b[..., 6:]) | (_q5_high(b[..., 2:6]) << 4)
    return (q.astype(np.int8) - 16).reshape(n, k), _halves(b[..., 0:2]), None, 8, 32


def _q5_1(b, n, k):
    b = b.reshape(n, k // 32, 24)
    q = _q5_low(b[..., 8:]) | (_q5_high(b[..., 4:8]) << 4)
    return q.astype(np.int8).reshape(n, k), _halves(b[..., 0:2]), _halves(b[..., 2:4]), 8, 32


def _k_quant_4_5(b, n, k, with_high: bool):
    size = 176 if with_high else 144
    b = b.reshape(n, k // QK_K, size)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    scale = (d[..., None] * sc).reshape(n, -1)  # exact: 11 x 6 bits
    mins = -(dmin[..., None] * mn).reshape(n, -1)
    qs = b[..., 16 + (32 if with_high else 0) :].reshape(n, k // QK_K, 4, 1, 32)
    low = ((qs >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)) & 15).reshape(n, -1, 32)
    if not with_high:  # sub-block 2j: chunk j's low nibbles; 2j + 1: its high ones
        return _nibbles_to_q4(low), scale, mins, 4, 32
    qh = b[..., 16:48].reshape(n, k // QK_K, 1, 32)
    high = ((qh >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1).reshape(n, -1, 32)
    q = (low | (high << 4)).astype(np.int8).reshape(n, k)
    return q, scale, mins, 8, 32


def _q4_k(b, n, k):
    return _k_quant_4_5(b, n, k, with_high=False)


def _q5_k(b, n, k):
    return _k_quant_4_5(b, n, k, with_high=True)


def _q6_k(b, n, k):
    b = b.reshape(n, k // QK_K, 210)
    ql, qh = b[..., :128], b[..., 128:192]
    sc = b[..., 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[..., 208:210])
    # eight rows of 32 per super-block: half h, then (low|high nibble) x (first|second 32 bytes)
    low = (ql.reshape(n, -1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)) & 15
    low = low.reshape(n, -1, 32)
    high = (qh.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)) & 3
    high = high.reshape(n, -1, 32)
    q = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, k)
    return q, (d[..., None] * sc).reshape(n, -1), None, 8, 16


DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q4_K": _q4_k,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q8_0": _q8_0,
}
BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32,
         "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K}  # fmt: skip


def packed_from_blocks(kind: str, data: np.ndarray, rows: int, cols: int) -> PackedMatrix:
    """A [rows, cols] matrix from its GGUF blocks (`data`: uint8 [rows, bytes per row])."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    q, scale, mins, bits, group = DECODERS[kind](data, rows, cols)
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return PackedMatrix(
        as_tensor(q),
        as_tensor(scale).reshape(rows, -1),
        None if mins is None else as_tensor(mins).reshape(rows, -1),
        bits=bits,
        group=group,
        kind=kind,
    )
