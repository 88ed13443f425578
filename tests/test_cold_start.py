"""What a cold start pays for, checked by what it imports and builds (tests never time
it; benchmarks/cold_start.py does): commands that load no model import neither torch nor
transformers; the default model's second run imports no transformers and builds nothing
again; what the first run builds is said once, with its duration."""

from __future__ import annotations

import pytest

import specgen
from specgen.core import once, timings
from specgen.core.config import SpecConfig
from specgen.core.errors import SpecgenError
from support.cold_start import imported, run_cli

NO_MODEL = [
    (("--help",), 0),
    (("generate", "--help"), 0),
    (("serve", "--help"), 0),
    (("chat", "--help"), 0),
    (("--version",), 0),
    (("models",), 0),
    (("generate", "hi", "--temperature", "hot"), 2),  # Typer's own argument error
    (("generate", "hi", "-n", "0"), 2),  # the library's rule, said before loading
    (("generate", "hi", "--method", "nope"), 2),
]


@pytest.mark.parametrize(("args", "code"), NO_MODEL)
def test_commands_that_load_no_model_import_neither_torch_nor_transformers(tmp_path, args, code):
    done = run_cli(*args, env={"HF_HOME": str(tmp_path / "hf")})  # an empty HF cache
    assert done.returncode == code, done.stderr
    heavy = set(imported(done))
    assert not heavy & {"torch", "transformers", "triton", "huggingface_hub"}, heavy
    if args[0] == "--help" or args[-1] == "--help":
        assert "rich" not in heavy  # nothing is shown through Rich


def test_the_public_names_load_when_first_used():
    assert "Pipeline" in dir(specgen) and specgen.SpecConfig is SpecConfig
    from specgen import Pipeline  # noqa: F401  (resolves through the module's __getattr__)

    with pytest.raises(AttributeError):
        specgen.Nothing  # noqa: B018


def test_the_method_names_are_the_registered_methods():
    """`--method` is offered from the package names, without importing the packages; each
    package registers the name it is called."""
    from specgen.methods import METHODS, NAMES, registered

    assert tuple(registered()) == NAMES and METHODS == ("ar", *NAMES)


def test_the_default_eagle3_drafter_is_named_when_the_alias_pairs_none():
    from specgen.api.spec import checked_spec

    with pytest.raises(SpecgenError) as e:
        checked_spec(SpecConfig(method="eagle3"), "smollm2-135m")
    assert str(e.value) == (
        "smollm2-135m pairs no eagle3 drafter by default, but specgen ships one: pass "
        "--drafter specgen:smollm2-135m-eagle3"
    )
    with pytest.raises(SpecgenError, match="no dflash drafter is known for qwen3-14b; pass"):
        checked_spec(SpecConfig(method="dflash"), "qwen3-14b")


def test_one_off_work_is_announced_once_with_its_duration_and_not_when_it_fails():
    lines: list[str] = []
    with once.listening(lines.append):
        with once.building("the thing", "/somewhere"):
            pass
        with pytest.raises(OSError), once.building("a broken thing"):
            raise OSError("no compiler")
    assert len(lines) == 1 and lines[0].startswith("built the thing in ")
    assert lines[0].endswith(" s, once (cached in /somewhere)")
    with once.building("unheard"):  # nobody listening: nothing said, nothing raised
        pass


def test_where_the_load_went_is_one_line_of_its_phases():
    with timings.recording() as phases:
        with timings.phase("imports"):
            pass
        with timings.phase("weights"):
            pass
    with timings.phase("after"):  # not recorded
        pass
    assert [name for name, _ in phases] == ["imports", "weights"]
    line = timings.report([("imports", 1.0), ("weights", 0.5), ("tokenizer", 0.25)], 1.5)
    assert line == ("loaded in 1.50 s (some side by side): imports 1.00 s, weights 0.50 s, "
                    "tokenizer 0.25 s")  # fmt: skip


@pytest.mark.slow
def test_the_second_run_of_the_default_model_builds_nothing_and_imports_no_transformers(
    tmp_path, embedded_gguf
):
    """The first run converts the GGUF's config and tokenizer, caches the tokenizer, builds
    the CPU kernels (where pip did not) and writes the fast-start image, each said once with
    its duration; the second run says none of it, starts from the image without importing
    torch or transformers (api/quick.py), and answers the same."""
    env = {"SPECGEN_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"),
           "TRITON_INTERPRET": "0"}  # as a user runs it, not as the tests' kernels do  # fmt: skip
    args = ("generate", "Hi", "-n", "6", "--debug")
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    built = [line for line in first.stderr.splitlines() if line.startswith("built ")]
    assert any("config and tokenizer in" in line for line in built), first.stderr
    # the kernels are built on first use only where pip did not build them at install
    from specgen.kernels import cpu_build

    installed = cpu_build.prebuilt(cpu_build.candidates("native")[0]) is not None
    assert any("CPU kernels" in line for line in built) != installed, first.stderr
    assert any("fast-start image" in line for line in built), first.stderr
    assert all(" s, once (cached in " in line for line in built), built
    second = run_cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert not [line for line in second.stderr.splitlines() if line.startswith("built ")]
    assert "loaded in " in second.stderr and "tokenizer" in second.stderr  # --debug's line
    assert not {"torch", "transformers", "triton", "huggingface_hub"} & set(imported(second))
    answer = lambda done: done.stdout.strip().splitlines()[:-1]  # noqa: E731
    assert answer(first) == answer(second) and answer(first)


def test_the_command_ends_without_teardown_but_not_under_a_profiler(tmp_path):
    """`specgen` ends with os._exit once its output is flushed (the interpreter's teardown
    after torch costs half a second); its exit status and output are kept, and under a
    profiler it ends normally, so that the profile is written."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "specgen", "--version"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("specgen ")
    bad = subprocess.run([sys.executable, "-m", "specgen", "generate", "hi", "-n", "0"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--max-new-tokens must be at least 1" in bad.stderr
    profile = tmp_path / "help.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "specgen",
                    "--help"], capture_output=True, timeout=120, check=True)  # fmt: skip
    assert profile.stat().st_size > 0


@pytest.mark.integration
def test_a_served_chat_answer_needs_no_transformers(tiny_llama):
    """The server loads as `generate` does, and a plain chat request (its length check,
    the chat template, the answer's text) runs on the cached tokenizer."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from specgen.text.codec import TextCodec
    from support.cold_start import _WRAPPER

    TextCodec(tiny_llama, "tiny")  # the first run's cache, as a second run finds it
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    args = ["serve", "--model", str(tiny_llama), "--port", "0", "--device", "cpu"]
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        port = None
        for line in proc.stdout:
            if "http://" in line:
                port = int(line.split("http://")[1].split("/")[0].rsplit(":", 1)[1])
                break
        assert port is not None
        body = {
            "model": tiny_llama.name,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=300) as reply:
            assert reply.status == 200 and json.loads(reply.read())["choices"]
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    last = [line for line in rest.splitlines() if line.startswith("imported: ")][-1]
    assert "'transformers'" not in last and "'torch'" in last, last
