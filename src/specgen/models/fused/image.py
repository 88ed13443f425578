"""A fused pass's fast-start image: every buffer decoder.c reads for one model (packed
weights, their scales and panel-major copies, norms, biases, the RoPE tables), the token
embedding, and the description that points into them, in one file.

Why: `specgen generate` on a small model spends most of its cold start importing torch
(about 0.9 s of 1.5 on two cores) for a pass that runs in C. A full load writes the image
once (`write`, from `FusedPass.image`); later runs map it (`Image.open`, numpy and ctypes
only) and hand decoder.c the very bytes the full load described, so an answer is the
full path's bit for bit (api/quick.py runs it; tests hold the two to each other).

The file: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: the
description, with buffers named by index, and each buffer's offset, dtype and shape), then
the buffers, each 64-byte aligned. An image is keyed by everything its bytes depend on
(`key`): a changed file, kernel source, instruction set or activation kind is a new image.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgen.kernels.decoder_cpu import Layer, Lin, Model, Panels, Seg

MAGIC = b"SGFAST01"
ALIGN = 64
LINS = ("qkv", "o", "gate_up", "down")
NORMS = ("attn_norm", "ffn_norm", "q_norm", "k_norm")


def write(path: Path, header: dict[str, Any], buffers: list[np.ndarray]) -> int:
    """Write an image atomically (a reader never sees half of one); its size in bytes."""
    offsets, at = [], 0
    for b in buffers:
        at += -at % ALIGN
        offsets.append(at)
        at += b.nbytes
    header = {**header, "buffers": [
        {"offset": o, "dtype": b.dtype.str, "shape": list(b.shape)}
        for o, b in zip(offsets, buffers, strict=True)
    ]}  # fmt: skip
    raw = json.dumps(header).encode()
    start = len(MAGIC) + 8 + len(raw)
    start += -start % ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(raw)) + raw)
            for o, b in zip(offsets, buffers, strict=True):
                f.seek(start + o)
                f.write(np.ascontiguousarray(b).tobytes())
            f.truncate(start + at)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return start + at


@dataclass
class Image:
    """An image mapped into memory: its header and its buffers (read-only views)."""

    header: dict[str, Any]
    buffers: list[np.ndarray]

    @classmethod
    def open(cls, path: Path) -> Image | None:
        """The image at `path`, or None when there is none or it is not a whole one."""
        try:
            with open(path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    return None
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
            start = len(MAGIC) + 8 + size
            start += -start % ALIGN
            data = np.memmap(path, dtype=np.uint8, mode="r")
            buffers = []
            for b in header["buffers"]:
                dtype = np.dtype(b["dtype"])
                count = int(np.prod(b["shape"], dtype=np.int64))
                at = start + b["offset"]
                if at + count * dtype.itemsize > data.size:
                    return None  # cut short
                view = data[at : at + count * dtype.itemsize].view(dtype)
                buffers.append(view.reshape(b["shape"]))
        except (OSError, ValueError, KeyError, struct.error):
            return None
        return cls(header, buffers)

    def buffer(self, index: int | None) -> np.ndarray | None:
        return None if index is None else self.buffers[index]

    def pointer(self, index: int | None) -> int | None:
        return None if index is None else self.buffers[index].ctypes.data

    # the pass's description, pointing into the mapped buffers --------------------------
    def model(self) -> Model:
        """decoder.c's Model for this image (capacity, cache and tables: the caller's)."""
        d = self.header["pass"]
        self._keep: list = []  # the ctypes arrays the description points to
        layers = (Layer * len(d["layers"]))()
        for i, layer in enumerate(d["layers"]):
            layers[i] = Layer(**{n: self._lin(layer[n]) for n in LINS},
                              **{n: self.pointer(layer[n]) for n in NORMS})  # fmt: skip
        self._keep.append(layers)
        m = Model(layer=layers, norm=self.pointer(d["norm"]), head=self._lin(d["head"]),
                  **d["sizes"])  # fmt: skip
        return m

    def _lin(self, lin: dict[str, Any]) -> Lin:
        segs = (Seg * len(lin["segs"]))()
        for j, s in enumerate(lin["segs"]):
            p = s["panels"]
            panels = Panels(self.pointer(p["scale"]), self.pointer(p["mins"]), p["width"])
            segs[j] = Seg(row0=s["row0"], rows=s["rows"], bits=s["bits"], group=s["group"],
                          half=s["half"], q=self.pointer(s["q"]), scale=self.pointer(s["scale"]),
                          mins=self.pointer(s["mins"]), panels=panels)  # fmt: skip
        self._keep.append(segs)
        return Lin(segs=segs, nsegs=len(segs), bias=self.pointer(lin["bias"]), N=lin["N"],
                   K=lin["K"])  # fmt: skip

    def embed(self, ids: list[int]) -> np.ndarray:
        """The tokens' embeddings [T, H] fp32, dequantized as PackedMatrix.dequantize does
        (the same fp32 products, so the same bits)."""
        e = self.header["embed"]
        rows = np.asarray(ids, dtype=np.int64)
        q = self.buffers[e["q"]][rows]
        if e["bits"] == 8:
            ints = q.astype(np.int16)
        else:  # byte j of a block of 16 holds columns j (low nibble) and j + 16 (high)
            blocks = q.reshape(len(rows), -1, 16).astype(np.int16)
            ints = np.concatenate([blocks & 15, blocks >> 4], axis=-1).reshape(len(rows), -1)
        n, k = ints.shape
        scale = self.buffers[e["scale"]][rows].astype(np.float32)
        w = ints.astype(np.float32).reshape(n, k // e["group"], e["group"]) * scale[..., None]
        if e["mins"] is not None:
            w = w + self.buffers[e["mins"]][rows].astype(np.float32)[..., None]
        return np.ascontiguousarray(w.reshape(n, k), dtype=np.float32)


class Described:
    """Collects the buffers a description points into, each once, as image indices."""

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []
        self._at: dict[tuple[int, int], int] = {}

    def add(self, array: np.ndarray | None) -> int | None:
        if array is None:
            return None
        if not array.flags["C_CONTIGUOUS"]:
            raise ValueError("an image buffer must be contiguous")
        key = (array.ctypes.data, array.nbytes)
        if key not in self._at:
            self._at[key] = len(self.buffers)
            self.buffers.append(array)
        return self._at[key]
