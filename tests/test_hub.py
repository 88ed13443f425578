"""Model resolution: paths, aliases, the HF cache, the embedded GGUF and download errors.

No test reaches the network: the cache is a temporary directory laid out exactly as
huggingface_hub lays it out, and download failures are simulated at snapshot_download.
"""

from __future__ import annotations

import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

from specgen import hub
from specgen.core.errors import ModelNotFoundError
from specgen.registry import MODELS


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _cache_repo(cache, repo, files=("config.json", "model.safetensors")):
    """Lay out a repo snapshot the way huggingface_hub stores it."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("a" * 40)
    for f in files:
        (snapshot / f).write_text("{}")
    return snapshot


def _hub_error(cls, message="nope"):
    err = cls.__new__(cls)  # these need an HTTP response to construct; the message is enough
    Exception.__init__(err, message)
    return err


def test_local_directory(tiny_llama):
    resolved = hub.resolve_model(str(tiny_llama))
    assert resolved.path == tiny_llama and resolved.source == "local"


def test_gguf_file_and_directory_with_one_gguf(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(hub, "ensure_converted", lambda path, notify=None: tmp_path / "conv")
    assert hub.resolve_model(str(gguf)).source == "gguf"
    assert hub.resolve_model(str(tmp_path)).path == tmp_path / "conv"


def test_directory_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelNotFoundError, match="not a model"):
        hub.resolve_model(str(tmp_path))


def test_missing_path_and_unknown_alias():
    with pytest.raises(ModelNotFoundError, match="no such file or directory"):
        hub.resolve_model("./does/not/exist")
    with pytest.raises(ModelNotFoundError, match="unknown model 'gpt-9'.*smollm2-135m"):
        hub.resolve_model("gpt-9")


def test_alias_prefers_the_hf_cache(hf_cache):
    snapshot = _cache_repo(hf_cache, "Qwen/Qwen3-4B")
    resolved = hub.resolve_model("qwen3-4b")
    assert resolved.path == snapshot and resolved.source == "hub-cache"


def test_incomplete_cache_entry_is_not_used(hf_cache, monkeypatch):
    _cache_repo(hf_cache, "Qwen/Qwen3-4B", files=("config.json",))  # no weights
    assert hub.cached_snapshot("Qwen/Qwen3-4B") is None


def test_default_alias_falls_back_to_the_embedded_gguf(hf_cache, monkeypatch, tmp_path):
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(hub, "embedded_gguf", lambda entry: gguf)
    monkeypatch.setattr(hub, "ensure_converted", lambda path, notify=None: tmp_path / "conv")
    resolved = hub.resolve_model("smollm2-135m")
    assert resolved.source == "embedded" and resolved.path == tmp_path / "conv"


def test_embedded_gguf_is_found_without_importing_the_package(monkeypatch):
    entry = MODELS["smollm2-135m"]
    path = hub.embedded_gguf(entry)
    if path is not None:  # installed here (CI installs it): it must be the real file
        assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 1e7
    assert hub.embedded_gguf(MODELS["qwen3-4b"]) is None


def test_offline_and_uncached_fails_with_one_line_naming_the_repo(hf_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        hub.resolve_model("qwen3-8b")
    message = str(info.value)
    assert "Qwen/Qwen3-8B" in message and "HF_HUB_OFFLINE" in message and "\n" not in message


def test_download_asks_only_for_config_tokenizer_and_safetensors(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    calls = []

    def fake(repo, allow_patterns, local_files_only):
        calls.append((repo, allow_patterns, local_files_only))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert hub.download("org/model") == tmp_path
    repo, patterns, local_only = calls[0]
    assert repo == "org/model" and local_only is False
    assert "*.safetensors" in patterns and "config.json" in patterns
    assert not any(p.endswith((".bin", ".pt", ".pth", ".py")) for p in patterns)


def test_repo_id_is_downloaded(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "download", lambda repo, alias=None: tmp_path)
    resolved = hub.resolve_model("someone/their-model")
    assert resolved.source == "download" and resolved.path == tmp_path


@pytest.mark.parametrize(
    "error, message",
    [
        (LocalEntryNotFoundError("x"), "cannot be reached"),
        (_hub_error(GatedRepoError), "gated"),
        (_hub_error(RepositoryNotFoundError), "no such repository"),
        (OSError("disk full"), "download failed"),
    ],
)
def test_download_errors_become_one_line(monkeypatch, error, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ModelNotFoundError, match=message):
        hub.download("org/model")


def test_a_missing_packaged_drafter_says_to_reinstall():
    with pytest.raises(ModelNotFoundError, match="should ship with specgen.*reinstall"):
        hub.resolve_drafter("specgen:no-such-drafter")
