"""OpenMP's spin before its threads sleep: short for every command (a busy neighbour must
not collapse decoding), libgomp's own length for `specgen serve`, a user's choice kept,
and nothing changed once torch has loaded libgomp (core/spin.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from specgen.core import spin

CLEAN = {
    k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", spin.MARK)
}


def _python(code: str, **extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env={**CLEAN, **extra}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


SPIN = "import os; print(os.environ.get('GOMP_SPINCOUNT'))"


def test_import_shortens_the_spin_unless_asked():
    assert _python(f"import specgen; {SPIN}") == spin.DEFAULT
    assert _python(f"import specgen; {SPIN}", GOMP_SPINCOUNT="50") == "50"
    assert _python(f"import specgen; {SPIN}", OMP_WAIT_POLICY="PASSIVE") == "None"


def test_serving_takes_libgomps_own_spin_where_specgen_chose():
    serving = f"import specgen; from specgen.core import spin; print(spin.for_serving()); {SPIN}"
    assert _python(serving).split() == ["True", spin.SERVING]
    # a user's choice stays
    assert _python(serving, GOMP_SPINCOUNT="50").split() == ["False", "50"]
    assert _python(serving, OMP_WAIT_POLICY="ACTIVE").split() == ["False", "None"]
    # a value inherited from a parent that imported specgen is still specgen's choice
    inherited = {"GOMP_SPINCOUNT": spin.DEFAULT, spin.MARK: spin.DEFAULT}
    assert _python(serving, **inherited).split() == ["True", spin.SERVING]
    # once torch is loaded, libgomp has read it: nothing changes
    late = serving.replace("import specgen;", "import specgen, torch;")
    assert _python(late).split() == ["False", spin.DEFAULT]


def test_serve_command_sets_it_before_torch_loads():
    """`specgen serve` asks for the serving spin before anything imports torch: the server
    (stood in for here) starts with it in the environment, and torch loaded after."""
    code = """
import os, sys, types
seen = {}
fake = types.ModuleType("specgen.serve.server")
class ServeConfig:
    def __init__(self, **kw): pass
    def check(self): pass
def serve(*a, **kw):
    seen["spin"] = os.environ.get("GOMP_SPINCOUNT")
fake.ServeConfig, fake.serve = ServeConfig, serve
import specgen.serve
sys.modules["specgen.serve.server"] = fake
torch_before = "torch" in sys.modules
import specgen.cli.serve as cli
cli._early = lambda run, names: (None, None)
cli._loader = lambda *a, **kw: None
from typer.testing import CliRunner
from specgen.cli import app
result = CliRunner().invoke(app, ["serve", "--quiet"])
print(torch_before, result.exit_code, seen.get("spin"))
"""
    assert _python(code).split() == ["False", "0", spin.SERVING]
