"""What an install needs: Triton is an extra (`dev`, `gpu`), not a dependency, so specgen must
import, decode on the CPU and skip its Triton tests cleanly where Triton is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_TRITON = 'import sys; sys.modules["triton"] = None  # as if it were not installed\n'


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECGEN_KERNELS"}
    return subprocess.run(
        [sys.executable, "-c", NO_TRITON + code, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_triton_is_an_extra_not_a_dependency():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("triton") for d in project["dependencies"])
    for extra in ("dev", "gpu"):  # dev: the tests run the kernels under TRITON_INTERPRET=1
        assert any(d.startswith("triton") for d in project["optional-dependencies"][extra])


@pytest.mark.integration  # a subprocess with Triton hidden
def test_everything_imports_and_decodes_without_triton(tiny_llama):
    code = """
import importlib, pkgutil
import specgen
from specgen.kernels import backend, triton_available
assert not triton_available() and backend() == "torch"
for module in pkgutil.walk_packages(specgen.__path__, "specgen."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
pipe = specgen.Pipeline.load(sys.argv[1], device="cpu", dtype="float32")
print(len(pipe.generate("hi", max_new_tokens=3).token_ids))
"""
    done = _python(code, str(tiny_llama))
    assert done.returncode == 0, done.stderr
    assert 1 <= int(done.stdout) <= 3  # it decoded (the tiny model may stop early)


@pytest.mark.integration  # pytest in a subprocess
def test_triton_tests_skip_cleanly_without_triton(tmp_path):
    code = f"""
import pytest

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--basetemp", {str(tmp_path / "t")!r},
                      "tests/kernels", "tests/test_kernel_dispatch.py"]))
"""
    done = _python(code)
    assert done.returncode == 0, done.stdout[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "error" not in summary and "failed" not in summary


@pytest.mark.integration
def test_a_cpu_install_resolves_no_cuda_wheels(tmp_path):
    """README's CPU install: torch's CPU build first, then specgen. Resolved for real by pip
    (`--dry-run --report`, against the index this machine has), specgen's own dependencies
    must add no CUDA wheel (nvidia-*, triton) beside a CPU torch."""
    report = tmp_path / "report.json"
    cpu_torch = f"torch=={_torch_release()}"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--report", str(report), cpu_torch, str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip(f"no index offers {cpu_torch} here")
    assert done.returncode == 0, done.stderr[-2000:]
    names = [i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]]
    assert "specgen" in names and "torch" in names
    assert not [n for n in names if n.startswith("nvidia") or n == "triton" or "cuda" in n]


def _torch_release() -> str:
    """The installed torch's version when it is a CPU build (what the test resolves beside)."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: the CPU install is checked on a CPU machine")
    return torch.__version__
