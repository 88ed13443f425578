"""A GGUF file read for what specgen needs, and nothing more.

The layout (ggml's `docs/gguf.md`): a header (magic, version, tensor and key/value
counts), the key/values, one info record per tensor (name, dims, type, offset), then the
tensor data from an aligned offset. The `gguf` package builds a numpy view for every part
of every field, each string of a 49,152-token vocabulary included (7 s for the default
model, over a minute for a 262k-token Gemma); here the file is mapped once, scalars are
read with `struct`, a numeric array is one `np.frombuffer` and a string array is walked
by its lengths alone until someone asks for its strings. `general.architecture` is handed
to `check` as soon as it is read (llama.cpp writes it first), so a file of an
architecture specgen does not run is refused before the rest of it is parsed.

Values come back as the `gguf` package's `ReaderField.contents()` gives them (ints,
floats, bools, str, lists), which the tests hold this reader to on every key specgen
reads. Tensor data are views of the mapping: nothing is read from disk until used.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.core.errors import CheckpointError

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> (struct code, numpy dtype); 8 is a string, 9 an array. numpy is
# imported when an array is read, not to parse the header (a refusal needs none of it)
SCALARS = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"),
    4: ("<I", "<u4"), 5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"),
    10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8"),
}  # fmt: skip
STRING, ARRAY = 8, 9

# ggml tensor types: id -> (name, elements per block, bytes per block), from ggml.h / ggml.c
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class LazyArray:
    """An array value not yet read: its item type, length and where its items start."""

    item_type: int
    count: int
    start: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    dims: tuple[int, ...]  # ggml order: ne0 (the contiguous one) first
    offset: int  # from the start of the data section

    @property
    def kind(self) -> str:
        """The ggml type's name (`Q4_K`), or `type N` for an id this reader does not know."""
        known = GGML_TYPES.get(self.type_id)
        return known[0] if known else f"type {self.type_id}"

    @property
    def shape(self) -> tuple[int, ...]:  # numpy/torch order
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def n_bytes(self) -> int | None:
        known = GGML_TYPES.get(self.type_id)
        if known is None:
            return None
        _, block, size = known
        return self.n_elements // block * size


class GGUFFile:
    """One GGUF file, mapped read-only: `meta` (key -> value, arrays left lazy),
    `tensors` (name -> `TensorInfo`, in file order) and `data(name)`."""

    def __init__(
        self, path: Path | str, name: str | None = None,
        check: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        self.path = Path(path)
        self.name = name or str(path)
        self._check = check
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24 or f.read(4) != MAGIC:
                    raise CheckpointError(f"{self.name}: not a readable GGUF file (no GGUF header)")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise CheckpointError(f"{self.name}: cannot read the file ({e})") from None
        self.size = size
        try:
            self._parse()
        except struct.error:  # a read past the end
            raise CheckpointError(
                f"{self.name}: not a readable GGUF file (it ends early: truncated?)"
            ) from None
        except (IndexError, OverflowError, ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"{self.name}: not a readable GGUF file ({type(e).__name__}: {e})"
            ) from None

    # -- parsing ----------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._map
        (self.version,) = _U32.unpack_from(buf, 4)
        if self.version and self.version & 0xFFFF == 0:  # 3 read in the other byte order
            raise ValueError("a big-endian GGUF file (specgen reads little-endian ones)")
        if self.version not in (2, 3):
            raise ValueError(f"GGUF version {self.version} (specgen reads versions 2 and 3)")
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        # every key/value takes at least 13 bytes and every tensor info 24: a count the file
        # cannot hold is a broken header, refused before anything loops over it
        if 13 * n_kv + 24 * n_tensors > self.size:
            raise ValueError(f"header counts {n_tensors} tensors and {n_kv} key/values")
        self.meta: dict[str, Any] = {}
        off = 24
        for _ in range(n_kv):
            key, off = self._string(off)
            (kind,) = _U32.unpack_from(buf, off)
            value, off = self._value(kind, off + 4)
            if key in self.meta:
                raise ValueError(f"key {key!r} twice")
            self.meta[key] = value
            if key == "general.architecture" and self._check is not None:
                self._check(str(value))
        tensors: dict[str, TensorInfo] = {}
        for _ in range(n_tensors):
            name, off = self._string(off)
            (n_dims,) = _U32.unpack_from(buf, off)
            if n_dims > 4:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            off += 4 + 8 * n_dims
            type_id, offset = struct.unpack_from("<IQ", buf, off)
            off += 12
            if name in tensors:
                raise ValueError(f"tensor {name} twice")
            tensors[name] = TensorInfo(name, type_id, tuple(dims), offset)
        align = self.meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment {align!r} is not a power of two")
        self.data_start = off + (-off % align)
        for t in tensors.values():
            n = t.n_bytes
            if n is not None and self.data_start + t.offset + n > self.size:
                raise ValueError(f"tensor {t.name} runs past the end of the file (truncated?)")
        self.tensors = tensors

    def _string(self, off: int) -> tuple[str, int]:
        (n,) = _U64.unpack_from(self._map, off)
        end = off + 8 + n
        if end > self.size:
            raise ValueError(f"a string at byte {off} runs past the end of the file")
        return self._map[off + 8 : end].decode("utf-8"), end

    def _value(self, kind: int, off: int) -> tuple[Any, int]:
        if kind in SCALARS:
            code, _ = SCALARS[kind]
            (v,) = struct.unpack_from(code, self._map, off)
            return v, off + struct.calcsize(code)
        if kind == STRING:
            return self._string(off)
        if kind != ARRAY:
            raise ValueError(f"value type {kind} at byte {off}")
        item, count = struct.unpack_from("<IQ", self._map, off)
        start = off + 12
        if item in SCALARS:
            end = start + count * struct.calcsize(SCALARS[item][0])
        elif item == STRING:
            end = self._skip_strings(start, count)
        elif item == ARRAY:  # arrays of arrays: rare, kept as a list of their arrays
            if 12 * count > self.size - start:
                raise ValueError(f"{count} arrays at byte {off} cannot fit in the file")
            items, end = [], start
            for _ in range(count):
                value, end = self._value(ARRAY, end)
                items.append(value)
            return items, end
        else:
            raise ValueError(f"array of value type {item} at byte {off}")
        if end > self.size:
            raise ValueError(f"an array at byte {off} runs past the end of the file")
        return LazyArray(item, count, start), end

    def _skip_strings(self, off: int, count: int) -> int:
        if 8 * count > self.size - off:
            raise ValueError(f"{count} strings at byte {off} cannot fit in the file")
        unpack, size = _U64.unpack_from, self.size
        for _ in range(count):
            off += 8 + unpack(self._map, off)[0]
            if off > size:
                raise ValueError("a string array runs past the end of the file")
        return off

    # -- reading values ---------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        arch = self.meta.get("general.architecture")
        return None if arch is None else str(arch)

    def get(self, key: str, default: Any = None) -> Any:
        """A key's value as `gguf`'s `contents()` gives it (an array as a list)."""
        if key not in self.meta:
            return default
        try:
            return self._contents(self.meta[key])
        except UnicodeDecodeError as e:
            raise self._not_utf8(key, e) from None

    def count(self, key: str) -> int:
        """How many items an array value holds (without reading them)."""
        value = self.meta[key]
        return value.count if isinstance(value, LazyArray) else len(value)

    def array(self, key: str) -> np.ndarray:
        """A numeric array value as one numpy array (a view of the file)."""
        import numpy as np

        value = self.meta[key]
        if not isinstance(value, LazyArray) or value.item_type not in SCALARS:
            raise CheckpointError(f"{self.name}: {key} is not a numeric array")
        dtype = np.dtype(SCALARS[value.item_type][1])
        return np.frombuffer(self._map, dtype, value.count, value.start)

    def strings(self, key: str) -> list[str]:
        """A string array value, decoded in one pass over its bytes."""
        value = self.meta[key]
        if not isinstance(value, LazyArray) or value.item_type != STRING:
            raise CheckpointError(f"{self.name}: {key} is not an array of strings")
        try:
            return self._strings(value)
        except UnicodeDecodeError as e:
            raise self._not_utf8(key, e) from None

    def _not_utf8(self, key: str, e: UnicodeDecodeError) -> CheckpointError:
        return CheckpointError(f"{self.name}: {key} holds a string that is not UTF-8 ({e})")

    def _strings(self, value: LazyArray) -> list[str]:
        buf, unpack, off, out = self._map, _U64.unpack_from, value.start, []
        for _ in range(value.count):
            n = unpack(buf, off)[0]
            out.append(buf[off + 8 : off + 8 + n].decode("utf-8"))
            off += 8 + n
        return out

    def _contents(self, value: Any) -> Any:
        if isinstance(value, list):  # an array of arrays
            return [self._contents(v) for v in value]
        if not isinstance(value, LazyArray):
            return value
        if value.item_type == STRING:
            return self._strings(value)
        import numpy as np

        dtype = np.dtype(SCALARS[value.item_type][1])
        return np.frombuffer(self._map, dtype, value.count, value.start).tolist()

    def data(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes, [rows, bytes per row] (rows: every dimension but ne0),
        a view of the file."""
        import numpy as np

        t = self.tensors[name]
        n = t.n_bytes
        if n is None:
            raise CheckpointError(f"{self.name}: tensor {name} has ggml type {t.type_id}, unknown")
        flat = np.frombuffer(self._map, np.uint8, n, self.data_start + t.offset)
        rows = t.n_elements // t.dims[0] if t.dims and t.dims[0] else 1
        return flat.reshape(rows, -1)
