"""Running the CLI in-process (Typer's runner) and holding its errors to one line."""

from __future__ import annotations

from typer.testing import CliRunner

from specgen.cli import app

runner = CliRunner()


FAST = ["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "6"]


def run(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()  # status lines may come before the error
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Traceback" not in result.stderr
