"""`specgen bench`: suites, the harness on a tiny model, the report, and the CLI's JSON line.
No timing is asserted."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.bench.harness import BenchRun, Divergence, PromptRun, run_bench
from specgen.bench.report import acceptance_lines, results_table, summarize
from specgen.bench.suites import BUILTIN, PUBLIC, load_suite
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import ModelNotFoundError, PromptError, SpecgenError
from specgen.core.stats import GenStats
from specgen.models.families import model_args
from support.targets import FIXTURES

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

runner = CliRunner()


def test_builtin_suite_covers_six_categories():
    prompts = load_suite(BUILTIN)
    cats = {p.category for p in prompts}
    assert len(prompts) >= 40
    assert cats == {"chat", "code", "math", "summarization", "translation", "qa"}


def test_num_prompts_spreads_over_categories():
    prompts = load_suite(BUILTIN, 12)
    assert len(prompts) == 12
    assert {p.category for p in prompts} == {
        "chat", "code", "math", "summarization", "translation", "qa"
    }  # fmt: skip
    assert [p.category for p in prompts] == sorted(
        [p.category for p in prompts], key=[p.category for p in prompts].index
    )  # grouped by category, in file order


def test_spec_bench_style_file(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {"turns": ["No category."]},
        {"prompt": "A plain prompt field.", "category": "qa"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_suite(str(path))
    assert [(p.category, p.text) for p in prompts] == [
        ("writing", "Write a poem."),
        ("default", "No category."),
        ("qa", "A plain prompt field."),
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "no prompts in it"),
        (b'{"turns": ["ok"]}\n{oops\n', "line 2 is not valid JSON"),
        (b'{"turns": []}\n', "line 1 has no prompt text"),
        (b'["a list"]\n', "line 1 is not a JSON object"),
        (b'{"turns": ["\xff"]}\n', "line 1 is not valid UTF-8"),
    ],
)
def test_bad_suite_files_fail_with_one_line(tmp_path, content, message):
    path = tmp_path / "s.jsonl"
    path.write_bytes(content)
    with pytest.raises(PromptError, match=message):
        load_suite(str(path))


def test_unknown_suite_and_bad_count(tmp_path):
    with pytest.raises(SpecgenError, match="unknown suite 'nope'"):
        load_suite("nope")
    with pytest.raises(PromptError, match="no such suite file"):
        load_suite(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SpecgenError, match="--num-prompts must be at least 1"):
        load_suite(BUILTIN, 0)


def test_public_set_offline_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE is set"):
        load_suite("mt-bench")


def test_public_set_is_fetched_with_huggingface_hub(monkeypatch, tmp_path):
    """The download is mocked (no Hub here); the file's own format is parsed."""
    questions = tmp_path / "question.jsonl"
    questions.write_text(
        json.dumps({"category": "writing", "prompt": ["Draft a travel blog post.", "Again."]})
        + "\n"
    )
    calls = []

    def fake_download(repo, filename, **kw):
        calls.append((repo, filename, kw["repo_type"]))
        return str(questions)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    prompts = load_suite("mt-bench")
    assert calls == [(PUBLIC["mt-bench"].repo, "raw/question.jsonl", "dataset")]
    assert prompts[0].text == "Draft a travel blog post." and prompts[0].category == "writing"


def _run(method, category, prompt, new, seconds, accepted=0, drafted=0):
    stats = GenStats(prompt_tokens=5)
    stats.record_step(1, 0, 0, None)
    steps = new - 1 - accepted
    for i in range(steps):
        a = accepted if i == 0 else 0
        d = drafted if i == 0 else 0
        stats.record_step(1 + a, d, a, "length" if i == steps - 1 else None)
    return PromptRun(method, category, prompt, list(range(new)), seconds, 0.1, stats)


def test_report_on_hand_made_runs():
    run = BenchRun(
        runs=[
            _run("ar", "qa", 0, 10, 1.0),
            _run("ar", "code", 1, 10, 2.0),
            _run("ngram", "qa", 0, 10, 0.5, accepted=3, drafted=4),
            _run("ngram", "code", 1, 10, 4.0),
        ],
        divergences=[Divergence("ngram", "code", 1, 4, 0.0012)],
        compared={"ngram": 2},
        identical={"ngram": 1},
        memory_bytes={"ar": 100, "ngram": 120},
    )
    summary = summarize(run, {"model": "m", "suite": "s", "temperature": 0.0})
    qa = summary["results"]["ngram"]["qa"]
    assert qa["speedup"] == 2.0 and qa["tokens_per_second"] == 20.0
    assert qa["tau"] == pytest.approx((3 + qa["steps"]) / qa["steps"], abs=1e-3)
    assert qa["acceptance_per_position"] == [1.0, 1.0, 1.0, 0.0]
    assert qa["acceptance_histogram"] == {"1": qa["steps"] - 1, "4": 1}
    assert summary["results"]["ngram"]["all"]["speedup"] == pytest.approx(
        (20 / 4.5) / (20 / 3.0), abs=1e-3
    )
    assert summary["lossless"]["ngram"]["match_rate"] == 0.5
    assert summary["lossless"]["ngram"]["divergences"][0]["margin"] == 0.0012
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(results_table(summary))
    text = console.export_text()
    assert "τ includes the bonus token" in text and "2.00x" in text and "0/1" in text
    assert acceptance_lines(summary)[0].startswith("ngram: acceptance by position 1.00")


def test_plot_writes_a_png(tmp_path, monkeypatch):
    from specgen.bench.report import plot

    pytest.importorskip("matplotlib")
    run = BenchRun(runs=[_run("ar", "qa", 0, 10, 1.0), _run("ngram", "qa", 0, 10, 0.5, 3, 4)])
    summary = summarize(run, {"model": "m", "suite": "s"})
    plot(summary, str(tmp_path / "bench.png"))
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(SpecgenError, match="--plot needs matplotlib"):
        plot(summary, str(tmp_path / "again.png"))


def test_table_fits_80_columns_and_pipes_get_plain_text():
    from specgen.terminal.display import plain

    runs = []
    for m in ("ar", "ngram", "dflash", "dspark", "stacked"):
        for i, c in enumerate(("chat", "summarization", "translation", "qa")):
            r = _run(m, c, i, 10, 1.0 + i / 10, *((3, 4) if m != "ar" else (0, 0)))
            r.modeled = (9, 0.9 if m == "ar" else 0.8)
            runs.append(r)
    compared = {m: 4 for m in ("ngram", "dflash", "dspark", "stacked")}
    summary = summarize(
        BenchRun(runs=runs, compared=compared, identical=compared),
        {"model": "smollm2-135m", "suite": "builtin", "temperature": 0.0},
    )
    console = Console(file=io.StringIO(), width=80, record=True)
    console.print(results_table(summary))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "1.125x" in text and "summarization" in text and "4/4" in text
    piped = plain(results_table(summary))
    assert "…" not in piped and not set("─│┃━┏┡") & set(piped)
    assert piped.splitlines()[0].startswith("specgen bench · smollm2-135m")  # title: one line
    row = next(line for line in piped.splitlines() if line.startswith("stacked"))
    assert row.split() == ["stacked", "chat", "10.0", "1.00x", "1.125x", "1.43", "0.57", "0.10",
                           "1/1"]  # fmt: skip


@pytest.fixture(scope="module")
def pipes(tiny_llama):
    ar = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    return {"ar": ar, "ngram": ar.with_spec(SpecConfig(method="ngram", verify_policy="full"))}


def test_harness_on_a_tiny_model_with_two_methods(pipes):
    prompts = load_suite(BUILTIN, 3)
    labels = []
    run = run_bench(
        pipes,
        prompts,
        max_new_tokens=12,
        sampling=SamplingParams(),
        repeats=2,
        progress=labels.append,
    )
    assert len(run.runs) == 6 and len(labels) == 6
    assert run.compared == {"ngram": 3} and run.identical == {"ngram": 3}  # greedy: lossless
    assert all(r.seconds > 0 and r.stats.new_tokens == len(r.tokens) for r in run.runs)
    assert run.memory_bytes["ngram"] >= run.memory_bytes["ar"] > 0


def test_sampled_bench_skips_the_identity_check(pipes):
    run = run_bench(
        pipes, load_suite(BUILTIN, 2), max_new_tokens=6, sampling=SamplingParams(1.0, seed=3)
    )
    assert run.compared == {} and summarize(run, {})["lossless"] is None


def test_cli_bench_json_is_stdout_alone(tiny_llama):
    args = ["bench", "--model", str(tiny_llama), "--methods", "ngram,hf", "--num-prompts", "2",
            "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    last = json.loads(result.stdout)  # stdout is the JSON alone (`| python -m json.tool`)
    assert last["methods"] == ["ar", "ngram", "hf"] and last["tau_includes_bonus"] is True
    assert set(last) >= {"model", "device", "dtype", "suite", "results", "lossless", "memory_bytes"}
    row = last["results"]["ngram"]["all"]
    for key in ("tokens_per_second", "speedup", "tau", "acceptance_per_position",
                "acceptance_histogram", "mean_verify_length", "ttft_seconds"):  # fmt: skip
        assert key in row
    assert last["lossless"]["ngram"]["match_rate"] == 1.0
    # transformers' own generate on the same checkpoint: the same greedy tokens in fp32
    assert last["lossless"]["hf"]["match_rate"] == 1.0
    assert last["results"]["hf"]["all"]["tau"] == 1.0
    assert "speedup" in result.stderr  # the table went to stderr
    table = result.stderr  # piped: plain text, nothing cut to fit 80 columns
    assert "…" not in table and not set("─│┃━┏┡") & set(table)



def test_by_default_a_method_the_target_cannot_run_is_left_out_with_why(tiny_llama):
    """Without --methods, bench runs AR, every method that needs no drafter, and those
    whose drafter is at hand; a drafter-free method the target refuses (MTP: a Llama
    target ships no MTP head) is left out with one line saying why, not the run failing."""
    args = ["bench", "--model", str(tiny_llama), "--num-prompts", "2", "--max-new-tokens",
            "6", "--device", "cpu", "--dtype", "float32", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    methods = json.loads(result.stdout)["methods"]
    assert methods[:3] == ["ar", "ngram", "suffix"] and "mtp" not in methods
    (said,) = [line for line in result.stderr.splitlines() if line.startswith("mtp left out:")]
    assert "no MTP layers" in said

def test_cli_bench_bad_input_is_one_line(tiny_llama, tmp_path):
    result = runner.invoke(app, ["bench", "--suite", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "no such suite file" in result.stderr
    result = runner.invoke(app, ["bench", "--model", str(tiny_llama), "--methods", "medusa"])
    assert result.exit_code == 2 and "unknown method 'medusa'" in result.stderr


def test_roofline_arithmetic():
    from specgen.bench.roofline import bytes_per_step, peak_bandwidth, utilisation

    args = model_args(json.loads((FIXTURES / "qwen3-8b.config.json").read_text()))
    params = 8_190_735_360 * 2  # Qwen3-8B in bf16
    emb = args.vocab_size * args.hidden_size * 2
    got = bytes_per_step(args, params, emb, 2, context=1000)
    kv = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 2 * 1000
    assert got == params - emb + args.hidden_size * 2 + kv  # untied: the table is one row
    assert (
        peak_bandwidth("NVIDIA H200") == 4.8e12
        and peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    )
    assert peak_bandwidth("Some GPU") is None
    assert utilisation(4.8e9, 0.001, 4.8e12) == pytest.approx(1.0)


def test_cpu_memory_counts_every_mounted_drafter(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    from specgen.bench.harness import _memory

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    dflash = ar.with_spec(SpecConfig(method="dflash", drafter=str(tiny_dflash)))
    dspark = ar.with_spec(SpecConfig(method="dspark", drafter=str(tiny_dspark)))
    stacked = ar.with_spec(
        SpecConfig(method="stacked", drafter=(str(tiny_dflash), str(tiny_dspark)))
    )
    base = _memory(ar)
    assert base < _memory(dflash) and base < _memory(dspark)
    # both drafters: their weights and context caches, the target's counted once
    assert _memory(stacked) == _memory(dflash) + _memory(dspark) - base


def test_a_renewed_session_behaves_as_a_new_one(tiny_qwen3_deep, tiny_dflash):
    from specgen.bench.harness import _FreshSessions

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    pipe = ar.with_spec(SpecConfig(method="dflash", drafter=str(tiny_dflash), trace=True))
    used = pipe.new_session()
    pipe.generate("one two one two one two", max_new_tokens=30, session=used)
    scheduler = used.scheduler
    renewed = pipe.renew(used)
    assert renewed is used and used.scheduler is not scheduler and not used.ids
    fresh = pipe.new_session()
    got = pipe.generate("The quick brown fox", max_new_tokens=30, session=renewed)
    want = pipe.generate("The quick brown fox", max_new_tokens=30, session=fresh)
    assert got.token_ids == want.token_ids
    assert got.stats.prefill_tokens == want.stats.prefill_tokens  # nothing reused
    # the same decisions from the same (empty) history: the steps match, drafts included
    assert [r["draft"] != [] for r in got.stats.trace] == [
        r["draft"] != [] for r in want.stats.trace
    ]
    sessions = _FreshSessions()
    assert sessions(pipe) is not sessions(pipe)  # on the CPU: a new session every run


def test_modeled_time_prices_each_step_from_the_cost_table():
    from specgen.scheduling.cost import CostTable, modeled

    prices = CostTable(
        contexts=(100, 300),
        seconds=((1.0, 1.5, 2.0), (3.0, 3.5, 4.0)),
        drafts={"dflash": (0.1, 0.25), "dspark": (0.5,)},
    )
    steps = [
        (100, None, 0, 0, 1),  # a plain decoding step: the forward over 1 token
        (200, "dflash", 2, 2, 3),  # halfway: forward over 3 tokens 3.0, 2 tokens drafted
        (200, "dflash", 1, 1, 1),  # 1 token drafted: its own, lower, draft time
        (300, "dspark", 7, 0, 1),  # drafted, its confidences verified nothing: still paid
    ]
    tokens, seconds = modeled(steps, prices)
    assert tokens == 6
    assert seconds == pytest.approx(1.0 + (3.0 + 0.25) + (2.5 + 0.1) + (3.0 + 0.5))
    assert modeled([(100, "ngram", 1, 1, 2)], prices) is None  # no price for this drafter
    assert modeled([(100, None, 0, 3, 4)], prices) is None  # longer than the table


def test_modeled_speedup_is_reported_next_to_the_measured_one():
    ar, fast = _run("ar", "qa", 0, 10, 1.0), _run("ngram", "qa", 0, 10, 1.2, 3, 4)
    ar.modeled, fast.modeled = (9, 0.9), (9, 0.6)
    summary = summarize(BenchRun(runs=[ar, fast]), {"model": "m", "suite": "s"})
    qa = summary["results"]["ngram"]["qa"]
    assert qa["modeled_tokens_per_second"] == 15.0 and qa["modeled_speedup"] == 1.5
    assert qa["speedup"] == pytest.approx(1 / 1.2, abs=1e-3)  # measured: its own column
    console = Console(file=io.StringIO(), width=140, record=True)
    console.print(results_table(summary))
    assert "1.500x" in console.export_text()
    bare = summarize(BenchRun(runs=[_run("ar", "qa", 0, 10, 1.0)]), {})
    assert bare["results"]["ar"]["qa"]["modeled_speedup"] is None  # nothing priced it


def test_each_decoding_step_is_recorded_for_pricing(tiny_llama):
    from specgen.scheduling.cost import CostTable, modeled

    ar = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    ngram = ar.with_spec(SpecConfig(method="ngram", verify_policy="full"))
    prompt = "a b c a b c a b c a b c"
    ids = ngram.encode(prompt)
    stats = ngram.generate(prompt, max_new_tokens=16, session=ngram.new_session()).stats
    shapes = stats.shapes
    assert len(shapes) == stats.steps - 1  # every step but the prefill's
    assert any(s[1] == "ngram" for s in shapes) and any(s[1] is None for s in shapes)
    assert sum(s[4] for s in shapes) == stats.new_tokens - 1
    context = len(ids)  # the anchor (the prefill's token) is not in the cache yet
    for got, drafter, drafted, verify, committed in shapes:
        assert got == context and drafter in (None, "ngram")
        assert (drafter is None) == (drafted == 0) and verify <= drafted
        context += committed
    flat = CostTable(contexts=(1,), seconds=((1.0,) * 16,), drafts={"ngram": (0.0,)})
    tokens, seconds = modeled(shapes, flat)
    assert tokens == stats.new_tokens - 1 and seconds == len(shapes)
