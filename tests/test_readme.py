"""Every command line the README shows runs from a clone, offline, as a user would type it.

Each line of each ```bash block is split at `&&` and `;`. Setting up (a venv, `pip install`)
is what CI itself did before the tests; the test command is this suite. Everything else
runs in a shell whose working directory holds the clone's files (read-only links) so what
a command writes stays out of the repository, with the Hub forbidden (HF_HUB_OFFLINE=1):

- a command loading a model only the Hub has must fail in one line saying so (exit 2);
- every other one must succeed. Budgets are scaled down so the suite ends (`--minutes N`
  becomes `--steps 2`, prompt counts 2, answers 8 tokens): the same command, shorter.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the embedded default answers, trains and benches here

ROOT = Path(__file__).resolve().parents[1]
SETUP = ("python3 -m venv", ". .venv/bin/activate", "pip install", "python -m pytest")
# a command that loads a model only the Hub has (`export` only names it: it runs offline)
HUB_ONLY = re.compile(
    r"^specgen (generate|chat|serve|bench|train|calibrate)\b.*--model (qwen3|gemma-4|llama3\.1)"
    r"|^specgen pull (qwen3|gemma|llama)"
)
SCALED = [  # (pattern, replacement): the same command on a smaller budget
    (r"--minutes \d+", "--steps 2"),
    (r"--num-prompts \d+", "--num-prompts 2"),
    (r"(-n|--max-new-tokens) \d+", r"\1 8"),
]


def _commands(readme: str) -> list[str]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            for part in re.split(r"\s*(?:&&|;)\s*", line):
                if part and not part.startswith(SETUP):
                    out.append(part)
    return out


def _scaled(command: str) -> str:
    for pattern, replacement in SCALED:
        command = re.sub(pattern, replacement, command)
    if command.startswith(("specgen generate", "specgen chat")) and "-n " not in command:
        command += " -n 8"  # every answer short
    return command


COMMANDS = _commands((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_shows_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert any(c.startswith("specgen generate") for c in COMMANDS)
    assert "python -m pytest" in readme  # the test command: this suite itself


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The clone's files, linked into a directory of their own, and the env a user has."""
    where = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", ".venv-ci"):
            (where / entry.name).symlink_to(entry)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:"
           + os.environ.get("PATH", "")}  # fmt: skip
    env["SPECGEN_HOME"] = str(tmp_path_factory.mktemp("specgen-home"))
    return where, env


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[:60])
def test_a_readme_command_runs_offline(clone, command):
    where, env = clone
    line = _scaled(command)
    if line.startswith("specgen chat"):  # piped: one turn a line
        line = f"printf 'Hello\\n' | {line}"
    done = subprocess.run(["bash", "-c", line], cwd=where, env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip
    if HUB_ONLY.search(command):
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1, (line, done.stderr[-2000:])
        assert "Hugging Face" in errors[0] or "HF_HUB_OFFLINE" in errors[0], errors[0]
    else:
        assert done.returncode == 0, (line, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
    assert shlex.split(command)  # a line a shell can read
