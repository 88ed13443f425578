"""The layering of DESIGN.md §3, as pyproject.toml's import-linter contracts: no module
imports one from a layer above it, and no drafter imports another."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint(config: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("import-linter is not installed (it is in the dev extra)")
    return subprocess.run(
        [exe, "--no-cache", "--no-logo", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layers_hold():
    result = _lint(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_back_edge_would_fail(tmp_path):
    """The contract can fail: models sit above kernels, so kernels-over-models breaks."""
    config = tmp_path / "inverted.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "specgen"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "inverted"\ntype = "layers"\n'
        'layers = ["specgen.kernels", "specgen.models"]\n'
    )
    result = _lint(config)
    assert result.returncode != 0 and "BROKEN" in result.stdout
