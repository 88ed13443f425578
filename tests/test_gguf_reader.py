"""The lean GGUF reader (models/formats/gguf/reader.py) against the `gguf` package, its
oracle: every key/value, tensor info and tensor byte of the default model's file and of
tiny files of every architecture specgen runs; the tensor names each architecture's table
gives (names.py) against gguf's own name map, for every key a load plan reads; and the
refusals: a file of an architecture specgen does not run is refused as soon as that key is
read, a broken file in one line."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from specgen.core.errors import CheckpointError
from specgen.models.families import model_args
from specgen.models.formats.gguf.config import own_config
from specgen.models.formats.gguf.index import GGUFIndex
from specgen.models.formats.gguf.names import ARCHITECTURES, open_gguf, plan_names
from specgen.models.formats.gguf.reader import GGML_TYPES, GGUFFile
from specgen.models.loading import read_config
from specgen.models.transformer import Transformer
from support.cold_start import imported, run_cli
from support.packed import FAMILY_MIXES, write_tiny_gguf

# the test-suite families and the GGUF architecture llama.cpp's converter writes for each
ARCH_OF = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_5": "qwen35",
           "gemma3": "gemma3", "gemma4": "gemma4"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_files(tiny_dirs, tiny_qwen3_5, tiny_gemma3_gguf_shape, tiny_gemma4, tmp_path_factory):
    """One tiny GGUF file per architecture specgen runs: family -> (file, HF dir)."""
    out = tmp_path_factory.mktemp("tiny-ggufs")
    dirs = {**{f: tiny_dirs[f] for f in ("llama", "qwen2", "qwen3")},
            "qwen3_5": tiny_qwen3_5, "gemma3": tiny_gemma3_gguf_shape,
            "gemma4": tiny_gemma4}  # fmt: skip
    files = {}
    for family, hf in dirs.items():
        path = out / f"{family}.gguf"
        write_tiny_gguf(hf, path, FAMILY_MIXES["q4_1"])
        files[family] = (path, hf)
    assert {ARCH_OF[f] for f in files} == set(ARCHITECTURES)
    return files


def same_as_gguf(path: Path) -> None:
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.meta) == keys
    for key in keys:
        want = theirs.fields[key].contents()
        got = ours.get(key)
        assert got == want and type(got) is type(want), key
        if isinstance(want, list) and want and not isinstance(want[0], (str, list)):
            assert ours.array(key).tolist() == want, key  # the bulk read, too
        if isinstance(want, list) and want and isinstance(want[0], str):
            assert ours.strings(key) == want and ours.count(key) == len(want), key
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert (mine.kind, mine.dims, mine.shape) == (
            t.tensor_type.name,
            tuple(t.shape.tolist()),
            tuple(reversed(t.shape.tolist())),
        ), t.name
        assert mine.n_elements == t.n_elements and mine.n_bytes == t.n_bytes, t.name
        data = ours.data(t.name)
        assert data.shape[0] == mine.n_elements // mine.dims[0], t.name  # [rows, bytes]
        want = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        assert np.array_equal(data.reshape(-1), want), t.name


def test_the_default_models_file_reads_as_gguf_reads_it(embedded_gguf):
    same_as_gguf(embedded_gguf)


def test_tiny_files_of_every_architecture_read_as_gguf_reads_them(tiny_files):
    for path, _ in tiny_files.values():
        same_as_gguf(path)


def test_the_ggml_type_table_is_ggmls():
    for kind in gguf.GGMLQuantizationType:
        if kind.value in GGML_TYPES:
            name, block, size = GGML_TYPES[kind.value]
            assert (name, (block, size)) == (kind.name, gguf.GGML_QUANT_SIZES[kind]), kind


RENAMES = {"qwen35": (("linear_attn.dt_proj.bias", "linear_attn.dt_bias"),),
           "gemma4": (("layer_scalar.weight", "layer_scalar"),)}  # fmt: skip


def gguf_where(path: Path, arch: str, layers: int) -> dict[str, str]:
    """Plan key -> tensor as gguf's own name map gives it (the loader's map before the
    lean reader): every HF name gguf lists for a tensor, with specgen's renames."""
    by_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    names = gguf.get_tensor_name_map(by_arch[arch], layers)
    gguf_to_hf: dict[str, list[str]] = {}
    for hf, (_, gg) in names.mapping.items():
        gguf_to_hf.setdefault(gg, []).append(hf)
    where = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        full = t.name
        base, dot, suffix = full.rpartition(".")
        for stem, end in ((full, ""), (base, dot + suffix)) if dot else ((full, ""),):
            for hf in gguf_to_hf.get(stem, ()):
                key = hf + end
                for ending, plan in RENAMES.get(arch, ()):
                    if key.endswith(ending):
                        key = key[: -len(ending)] + plan
                where[key] = full
    return where


def plan_keys(args) -> list[str]:
    model = Transformer(args, dtype=torch.float32, device="meta")
    return [row.key for row in model.plan("model.")]


def check_names(path: Path, args) -> None:
    """Every plan key names the tensor gguf's map names, and every one is in the file."""
    arch = GGUFFile(path).architecture
    ours = plan_names(arch, GGUFFile(path).tensors, args.num_layers)
    theirs = gguf_where(path, arch, args.num_layers)
    keys = plan_keys(args)
    for key in keys:
        assert ours.get(key) == theirs.get(key), (arch, key)
    assert set(ours) <= set(theirs)  # nothing named that gguf would not name
    assert [key for key in keys if key not in ours] == [], arch


def test_every_plan_key_names_the_tensor_ggufs_map_names(tiny_files, embedded_gguf, embedded_dir):
    for family, (path, hf) in tiny_files.items():
        check_names(path, model_args(read_config(hf, family), name=family))
    check_names(embedded_gguf, model_args(read_config(embedded_dir, "default"), name="default"))


def test_a_qwen3_5_files_prediction_block_stays_unnamed(tiny_qwen3_5, tmp_path):
    write_tiny_gguf(tiny_qwen3_5, tmp_path / "mtp.gguf", FAMILY_MIXES["q8_0"], mtp=1)
    args = model_args(read_config(tiny_qwen3_5, "q"), name="q")
    index = GGUFIndex(tmp_path / "mtp.gguf", "q", args)
    assert not any(f"layers.{args.num_layers}." in key for key in index.where)
    assert any(name.startswith(f"blk.{args.num_layers}.") for name in index.tensors)
    check_names(tmp_path / "mtp.gguf", args)


# -- refusals ---------------------------------------------------------------------------


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_header(path: Path, arch: str, *, tokens: int = 0, corrupt_rest: bool = False) -> None:
    """A GGUF whose first key is `general.architecture`, then a vocabulary of `tokens`
    strings (or, `corrupt_rest`, an array that claims far more than the file holds)."""
    kv = _string("general.architecture") + struct.pack("<I", 8) + _string(arch)
    count = 2**40 if corrupt_rest else tokens
    kv += _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
    body = b"".join(_string(f"t{i}") for i in range(tokens))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + body)


def test_an_unsupported_architecture_is_refused_before_the_rest_is_read(tmp_path):
    """The rest of this file is broken: only a refusal made at the architecture key, before
    parsing on, gives the architecture's message."""
    path = tmp_path / "g.gguf"
    write_header(path, "gemma3n", corrupt_rest=True)
    with pytest.raises(CheckpointError) as e:
        open_gguf(path, "g")
    assert str(e.value) == (
        "g: unsupported architecture 'gemma3n_text' (GGUF gemma3n); specgen runs the llama, "
        "qwen2, qwen3, qwen35, gemma3, gemma4 GGUF architectures"
    )
    write_header(path, "qwen35moe", corrupt_rest=True)
    with pytest.raises(CheckpointError, match="Qwen3.5 mixture-of-experts targets are not"):
        open_gguf(path, "m")
    write_header(path, "gemma3", corrupt_rest=True)  # supported: the broken rest is found
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        open_gguf(path, "ok")


def _valid(path: Path) -> bytes:
    write_header(path, "llama", tokens=3)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda b: b"GGUF", "no GGUF header"),
        (lambda b: b"GGML" + b[4:], "no GGUF header"),
        (lambda b: b"GGUF" + b"\x00" * 64, "GGUF version 0"),
        (lambda b: b[:4] + struct.pack(">I", 3) + b[8:], "big-endian"),
        (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "GGUF version 1"),
        (lambda b: b[:8] + struct.pack("<QQ", 0, 10**9) + b[24:], "header counts"),
        (lambda b: b[:-1], "past the end of the file"),
        (lambda b: b[:-5], "it ends early: truncated?"),
        (lambda b: b[:24] + struct.pack("<Q", 3) + b"\xff\xfe\xfd" + b[52:], "UnicodeDecodeError"),
    ],
)
def test_a_broken_file_is_refused_in_one_line(tmp_path, edit, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(edit(_valid(path)))
    with pytest.raises(CheckpointError) as e:
        GGUFFile(path, "bad.gguf")
    message = str(e.value)
    assert "\n" not in message and says in message, message
    assert message.startswith("bad.gguf: ")


def test_a_truncated_tensor_is_refused_at_open(embedded_gguf, tmp_path):
    """The tensor index says where each tensor ends: a cut file fails when opened, not
    when a plan row first reads past the end."""
    cut = tmp_path / "cut.gguf"
    data = embedded_gguf.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"runs past the end of the file \(truncated\?\)"):
        GGUFFile(cut)


def test_the_cli_refuses_before_loading_torch(tmp_path):
    """`generate` on an unsupported or broken GGUF answers in one line with exit 2, and
    never imports torch (what keeps the refusal well under a second)."""
    unsupported, broken = tmp_path / "g3n.gguf", tmp_path / "broken.gguf"
    write_header(unsupported, "gemma3n", tokens=1000)
    write_header(broken, "llama", corrupt_rest=True)
    lacking = tmp_path / "g3.gguf"  # a family we run, its metadata missing
    write_header(lacking, "gemma3", tokens=1000)
    for path, says in ((unsupported, "unsupported architecture 'gemma3n_text'"),
                       (broken, "not a readable GGUF file"),
                       (lacking, "not a readable gemma3 GGUF (metadata: KeyError")):  # fmt: skip
        done = run_cli("generate", "hi", "--model", str(path))
        assert done.returncode == 2, done.stderr
        assert not {"torch", "transformers"} & set(imported(done)), done.stdout
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and says in lines[0], done.stderr


def test_the_llama_shaped_configs_come_from_the_file(tiny_files, embedded_gguf):
    """What the first run writes as a Llama, Qwen2 or Qwen3 file's config describes the
    checkpoint's own model (its epsilon through the file's fp32), and the default model
    exactly as transformers' reader does."""
    from transformers import AutoConfig

    for family in ("llama", "qwen2", "qwen3"):
        path, hf = tiny_files[family]
        got = model_args(own_config(GGUFFile(path)), name="gguf")
        want = model_args(read_config(hf, family), name="hf")
        assert got == replace(want, rms_norm_eps=np.float32(want.rms_norm_eps).item()), family
    theirs = AutoConfig.from_pretrained(str(embedded_gguf.parent), gguf_file=embedded_gguf.name)
    ours = own_config(GGUFFile(embedded_gguf))
    assert model_args(ours, name="d") == model_args(theirs.to_dict(), name="d")
