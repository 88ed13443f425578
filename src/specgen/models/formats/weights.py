"""The weight seam: how a linear layer's weight is stored and multiplied.

Every projection of every layer (the fused q/k/v and gate/up matrices included), the
embedding table and the LM head hold one of these instead of a bare tensor, so how a weight
is stored is decided in one place: layers call `w(x, bias)`, take a fused matrix's part
with `rows=`, embed with `lookup`; memory figures come from `nbytes`, and cost tables know
the format from `identity`. A new storage format (packed 4-bit blocks, say) is another
class with these methods (docs/design.md, "Adding a weight format"); no layer changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from specgen.kernels.linear import linear

_generation = [0]


def generation() -> int:
    """A count that moves whenever a weight's storage is replaced (a format converted, a
    packed weight loaded): whatever holds pointers into weights (models/fused/cpu_pass.py)
    checks it before trusting them."""
    return _generation[0]


def storage_changed() -> None:
    _generation[0] += 1


def new_weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """A bare parameter (norms, biases, small heads): filled by the loader."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class LinearWeight(nn.Module, ABC):
    """What every stored format provides: `forward(x, bias, rows)`, `lookup(ids)`,
    `load(tensor, offset)`, `dense()`, `shape`, `dtype`, `device`, `nbytes`, `identity`,
    and `from_dense(weight)` to make one from a loaded dense weight."""

    @classmethod
    @abstractmethod
    def from_dense(cls, weight: DenseWeight) -> LinearWeight: ...

    def __call__(self, x: torch.Tensor, bias=None, rows: slice | None = None) -> torch.Tensor:
        # straight to forward: a decode step makes hundreds of these calls, and nn.Module's
        # hook machinery (never used on weights) would cost each one a few microseconds
        return self.forward(x, bias, rows)


class DenseWeight(LinearWeight):
    """A [out, in] matrix held as it multiplies (fp32, bf16 or fp16)."""

    def __init__(self, rows: int, cols: int, *, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = new_weight(rows, cols, dtype=dtype, device=device)

    def forward(
        self,
        x: torch.Tensor,  # [..., in]
        bias: torch.Tensor | None = None,  # [out] (or the rows' part of it)
        rows: slice | None = None,  # only these output rows (a part of a fused matrix)
    ) -> torch.Tensor:  # [..., out]
        w = self.weight if rows is None else self.weight[rows]
        return linear(x, w, bias)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:  # [...] int64 -> [..., in]
        """Rows by index, as the matrix's dtype: an embedding, or a trimmed LM head."""
        return F.embedding(ids, self.weight)

    def load(self, tensor: torch.Tensor, offset: int = 0) -> None:
        """Checkpoint rows [offset, offset + len) from a full-precision tensor."""
        self.weight.data[offset : offset + tensor.shape[0]].copy_(tensor)

    def dense(self) -> torch.Tensor:
        """The matrix itself (what a packed format dequantizes to): for training,
        checkpoints and oracles."""
        return self.weight

    @classmethod
    def from_dense(cls, weight: DenseWeight) -> DenseWeight:
        return weight

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    @property
    def identity(self) -> str:
        """What a cost table measured with this weight depends on."""
        return f"dense-{str(self.weight.dtype).removeprefix('torch.')}"


FORMATS: dict[str, type[LinearWeight]] = {"dense": DenseWeight}


def register_format(name: str):
    """Class decorator: a storage format `convert_weights` can turn dense weights into."""

    def add(cls: type[LinearWeight]) -> type[LinearWeight]:
        FORMATS[name] = cls
        return cls

    return add


def replace_weights(module: nn.Module, make) -> None:
    """Every dense weight `w` in `module` replaced by `make(w)`, in place. A weight held in
    two places (a tied head) stays one weight."""
    storage_changed()
    made: dict[int, LinearWeight] = {}
    for parent in list(module.modules()):
        # _modules, not named_children(): that lists a module held twice (tied) only once
        for child_name, child in list(parent._modules.items()):
            if type(child) is DenseWeight:
                if id(child) not in made:
                    made[id(child)] = make(child)
                setattr(parent, child_name, made[id(child)])


def convert_weights(module: nn.Module, name: str) -> None:
    """Every dense weight in `module` stored as format `name` instead, in place."""
    if name not in FORMATS:
        raise ValueError(f"unknown weight format {name!r} (known: {', '.join(FORMATS)})")
    if name != "dense":
        replace_weights(module, FORMATS[name].from_dense)


def held_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every tensor `module` holds (parameters and buffers: packed formats keep buffers),
    each storage once: a tied head is the embedding it shares."""
    tensors = [*module.parameters(), *module.buffers()]
    return list({t.data_ptr(): t for t in tensors}.values())


def resident_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in held_tensors(module))


def weights_identity(module: nn.Module) -> str:
    """The storage formats of `module`'s matrices, e.g. "dense-float32" (cost-table keys)."""
    kinds = sorted({m.identity for m in module.modules() if isinstance(m, LinearWeight)})
    return "+".join(kinds) or "none"


def describe_weights(module: nn.Module) -> dict:
    """What `module`'s matrices are held as: each storage format with its matrix count, the
    bits they take per weight, and the bytes everything resident takes."""
    weights = {id(m): m for m in module.modules() if isinstance(m, LinearWeight)}.values()
    formats: dict[str, int] = {}
    for w in weights:
        formats[w.identity] = formats.get(w.identity, 0) + 1
    count = sum(w.shape[0] * w.shape[1] for w in weights)
    held = sum(w.nbytes for w in weights)
    return {
        "formats": dict(sorted(formats.items())),
        "matrix_bits_per_weight": round(8 * held / count, 2) if count else None,
        "resident_bytes": resident_bytes(module),
    }
