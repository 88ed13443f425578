"""The weight seam (models/formats/weights.py): every projection, the embedding and the head go
through a `LinearWeight`, so a storage format is a class, not a change to the layers.

The test format stores its matrix transposed ([in, out]) and multiplies accordingly: a
layer that reached past the seam for `.weight`, or sliced a fused matrix itself, would get
a wrong shape or wrong numbers here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.models.formats.weights import (
    FORMATS,
    DenseWeight,
    LinearWeight,
    convert_weights,
    register_format,
)
from specgen.models.loading import load_target


class Transposed(LinearWeight):
    def __init__(self, matrix: torch.Tensor) -> None:  # [out, in]
        super().__init__()
        self.register_buffer("t", matrix.detach().t().contiguous())  # [in, out]

    @classmethod
    def from_dense(cls, weight: DenseWeight) -> Transposed:
        return cls(weight.dense())

    def forward(self, x, bias=None, rows=None):
        t = self.t if rows is None else self.t[:, rows]
        y = x @ t
        return y if bias is None else y + bias

    def lookup(self, ids):
        return F.embedding(ids, self.t.t())

    def load(self, tensor, offset=0):
        self.t[:, offset : offset + tensor.shape[0]].copy_(tensor.t())

    def dense(self):
        return self.t.t()

    shape = property(lambda self: self.t.t().shape)
    dtype = property(lambda self: self.t.dtype)
    device = property(lambda self: self.t.device)
    nbytes = property(lambda self: self.t.numel() * self.t.element_size())
    identity = property(lambda self: f"transposed-{self.t.dtype}")


register_format("test-transposed")(Transposed)


@pytest.fixture(params=["llama", "qwen2", "qwen3", "qwen3_5", "gemma3", "gemma4"])
def target_dir(request, tiny_dirs, tiny_qwen3_5, tiny_gemma3, tiny_gemma4):
    own = {"qwen3_5": tiny_qwen3_5, "gemma3": tiny_gemma3, "gemma4": tiny_gemma4}
    return own.get(request.param) or tiny_dirs[
        request.param
    ]


def test_a_format_behind_the_seam_gives_the_dense_models_logits(target_dir):
    """In fp64, where the two matmul orders agree far below any real difference."""
    dense = load_target(target_dir, dtype=torch.float64, device="cpu")
    other = load_target(target_dir, dtype=torch.float64, device="cpu")
    convert_weights(other, "test-transposed")
    assert not any(isinstance(m, DenseWeight) for m in other.modules())
    assert other.weights_identity == "transposed-torch.float64" != dense.weights_identity
    assert (other.lm_head is other.embed) == (dense.lm_head is dense.embed)  # tied stays tied
    assert other.resident_bytes == dense.resident_bytes
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, dense.args.vocab_size, (1, 9), generator=gen)
    outs = []
    for model in (dense, other):
        cache = model.new_cache(32, steps=4)
        first = model(tokens[:, :6], cache, taps=(0,))
        step = model(tokens[:, 6:], cache)  # a verify block after a prefix
        outs.append((first, step))
    (a, b), (c, d) = outs
    torch.testing.assert_close(c.logits, a.logits, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(c.taps[0], a.taps[0], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(d.logits, b.logits, atol=1e-9, rtol=1e-9)


def test_drafters_run_on_a_target_of_another_format(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    """DFlash and DSpark embed and draft through the target's embedding and head: through
    the seam too, so a target in another format still gives AR's greedy answer."""
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    want = ar.generate("the seam", max_new_tokens=24, raw=True).token_ids
    convert_weights(ar.model, "test-transposed")
    for method, drafter in (("dflash", tiny_dflash), ("dspark", tiny_dspark)):
        pipe = ar.with_spec(SpecConfig(method=method, drafter=str(drafter), verify_policy="full"))
        got = pipe.generate("the seam", max_new_tokens=24, raw=True)
        assert got.token_ids == want and got.stats.verified > 0  # drafts were made and judged


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="unknown weight format 'int3'.*dense"):
        convert_weights(torch.nn.Linear(2, 2), "int3")
    assert FORMATS["dense"] is DenseWeight


def test_roofline_reads_the_weights_as_stored(tiny_dirs):
    """A decoding step's bytes: the weights as the seam counts them, one embedding row,
    and the cache's K/V for the context."""
    from specgen.bench.roofline import model_bytes_per_step

    model = load_target(tiny_dirs["qwen3"], dtype=torch.float32, device="cpu")
    a = model.args
    kv = 2 * a.num_layers * a.num_kv_heads * a.head_dim * 4 * 100
    row = a.hidden_size * 4
    assert model_bytes_per_step(model, 100) == model.resident_bytes - model.embed.nbytes + row + kv
    convert_weights(model, "test-transposed")  # another format: its own byte count
    assert model_bytes_per_step(model, 100) == model.resident_bytes - model.embed.nbytes + row + kv
