"""`specgen bench`: AR and every method on one prompt suite, side by side in one process."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.common import quiet_libraries, user_errors
from specgen.cli.options import Run, run_options
from specgen.core.config import AR
from specgen.core.errors import SpecgenError
from specgen.terminal import display

if TYPE_CHECKING:
    from specgen.bench.endpoint import EndpointClient

EXAMPLES = """
Examples:

  specgen bench

  specgen bench --suite benchmarks/prompts/spec_bench.jsonl --num-prompts 12 --json

  specgen bench --model qwen3-8b --methods ar,dflash,dspark --suite mt-bench --plot bench.png

  specgen bench --endpoint http://127.0.0.1:8000/v1 --methods ar,dflash

  specgen bench --endpoint http://127.0.0.1:8000/v1 --methods none --json
"""


@run_options(
    "model", "sampling", "engine", "target", "output", "runtime",
    # its own --methods and --drafter choose what runs; it samples by --temperature
    # alone (as transformers' generate and endpoints are asked to); no live view to colour
    without=("top_p", "top_k", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "show_drafts"),
    max_new_tokens=128, seed=0,
    helps={"quiet": "No progress bar or status lines: only the table (or the --json line)."},
)  # fmt: skip
def bench(
    methods: Annotated[
        str | None,
        typer.Option(
            "--methods",
            help="Comma-separated methods (default: ar, ngram and every method with a "
            "drafter for the model); hf = transformers' generate, same checkpoint and dtype; "
            "none: no local method (endpoints only).",
        ),
    ] = None,
    suite: Annotated[
        str,
        typer.Option("--suite", help="builtin, mt-bench, gsm8k, or a Spec-Bench-style .jsonl."),
    ] = "builtin",
    turns: Annotated[
        str,
        typer.Option(
            "--turns",
            help="first: each suite line's first user turn; all: every turn, as one "
            "conversation (each turn asked with the method's own earlier answers).",
        ),
    ] = "first",
    num_prompts: Annotated[
        int | None,
        typer.Option("--num-prompts", help="Prompts in total, spread over the categories."),
    ] = None,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Runs per prompt and method; the median counts.")
    ] = 1,
    drafter: Annotated[
        list[str] | None,
        typer.Option("--drafter", help="A drafter checkpoint for its method; repeatable."),
    ] = None,
    draft_model: Annotated[
        str | None,
        typer.Option(
            "--draft-model",
            help="A smaller model of the target's tokenizer for the draft method (alias, "
            "directory, .gguf file or Hub repo).",
        ),
    ] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write a PNG of the results (needs matplotlib).")
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON line holding every number on stdout (the table "
            "goes to stderr)."
        ),
    ] = False,
    endpoint: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            help="An OpenAI-compatible server's base URL (specgen serve, vLLM, SGLang, "
            "llama-server), e.g. http://127.0.0.1:8000/v1, raced as one more method; repeatable.",
        ),
    ] = None,
    endpoint_model: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint-model",
            help="The model name requests send (default: the first of GET URL/models); "
            "once for every endpoint, or once per --endpoint.",
        ),
    ] = None,
    endpoint_method: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint-method",
            help="The method a specgen server answers with (its `specgen.method` field); "
            "once per --endpoint. Give one URL several times with different methods to "
            "race them on one server; its `ar` is then the baseline if no local AR runs.",
        ),
    ] = None,
    endpoint_name: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint-name",
            help="The endpoint's column (default: endpoint:HOST:PORT); once per --endpoint.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="OPENAI_API_KEY",
            show_envvar=False,
            help="Bearer key for the endpoints (default: $OPENAI_API_KEY).",
        ),
    ] = None,
    *,
    run: Run,
) -> None:
    """Benchmark AR and the speculative methods, and any OpenAI-compatible server
    (--endpoint), on a prompt suite (table, JSON, plot)."""
    with user_errors(run.debug):
        quiet_libraries()
        from specgen.bench.harness import run_bench
        from specgen.bench.report import acceptance_lines, pyplot, results_table, summarize
        from specgen.bench.report import plot as write_plot
        from specgen.bench.suites import load_suite

        if repeats < 1:
            raise SpecgenError(f"--repeats must be at least 1 (got {repeats})")
        if plot:  # checked before the run, not found missing after it
            pyplot()
            if not Path(plot).resolve().parent.is_dir():
                raise SpecgenError(f"--plot {plot}: no such directory to write it in")
        sampling = run.sampling()
        prompts = load_suite(suite, num_prompts, turns)
        local = methods is None or methods.strip().lower() not in ("", "none")
        if not local and not endpoint:
            raise SpecgenError("--methods none runs nothing: give --endpoint URL")
        drafters = [*(drafter or []), *([draft_model] if draft_model else [])]
        if not local and drafters:
            raise SpecgenError("--drafter given, but --methods none runs no local method")
        with ExitStack() as stack:
            # probed before any model loads: a wrong URL, key or model fails now, in one line
            clients = _endpoints(
                endpoint or [], endpoint_model or [], endpoint_name or [], api_key, run.quiet,
                endpoint_method or [],
            )  # fmt: skip
            for client in clients.values():
                stack.callback(client.close)
            pipes = _pipelines(run, methods, drafters) if local else {}
            total = sum(len(p.turns) for p in prompts) * (len(pipes) + len(clients))
            with display.progress(total, "benchmarking", disable=run.quiet) as advance:
                result = run_bench(
                    pipes,
                    prompts,
                    max_new_tokens=run.max_new_tokens,
                    sampling=sampling,
                    repeats=repeats,
                    progress=advance,
                    endpoints=clients,
                    think=run.think,
                )
        ar = pipes.get(AR)
        meta = {
            "model": ar.name if ar else ", ".join(c.endpoint.model for c in clients.values()),
            "device": str(ar.model.device) if ar else None,
            "dtype": str(ar.model.dtype).removeprefix("torch.") if ar else None,
            "suite": suite,
            "num_prompts": len(prompts),
            "turns": turns,
            "max_new_tokens": run.max_new_tokens,
            "temperature": run.temperature,
            "repeats": repeats,
            "verify_policy": run.verify_policy,
            "engine": run.engine,
            # what `engine` came to here: the compute thread, and on CUDA the resident loop
            "overlap": ar.overlaps if ar else None,
            "resident_steps": ar.resident_steps if ar else None,
            "cuda_graphs": run.cuda_graphs and ar is not None and ar.model.device.type == "cuda",
        }
        if clients:
            meta["endpoints"] = {
                name: {"url": c.endpoint.url, "model": c.endpoint.model,
                       "owned_by": c.endpoint.owned_by}
                for name, c in clients.items()
            }  # fmt: skip
        summary = summarize(result, meta)
        summary["ar_bandwidth_utilisation"] = _ar_roofline(ar, result) if ar else None
        # with --json, stdout carries the JSON alone (`| jq` works) and the table goes to stderr
        display.show(results_table(summary), err=json_out)
        for line in acceptance_lines(summary):
            display.show(line, err=json_out)
        if plot:
            write_plot(summary, plot)
            if not run.quiet:
                display.status(f"wrote {plot}")
        if json_out:
            display.write_json(summary)


bench.__doc__ = (bench.__doc__ or "") + EXAMPLES


def _ar_roofline(ar, result) -> float | None:
    """AR's share of the GPU's memory-bandwidth roofline over the bench (CUDA only)."""
    import torch

    from specgen.bench.roofline import model_bytes_per_step, peak_bandwidth, utilisation

    if ar.model.device.type != "cuda":
        return None
    peak = peak_bandwidth(torch.cuda.get_device_name(ar.model.device))
    runs = [r for r in result.runs if r.method == AR and r.stats.new_tokens > 1]
    if peak is None or not runs:
        return None
    shares = []
    for r in runs:
        step = (r.seconds - r.ttft_seconds) / (r.stats.new_tokens - 1)
        context = r.stats.prompt_tokens + r.stats.new_tokens // 2  # the mean over the answer
        shares.append(utilisation(model_bytes_per_step(ar.model, context), step, peak))
    return round(sum(shares) / len(shares), 4)


def _endpoints(
    urls: list[str],
    models: list[str],
    names: list[str],
    api_key: str | None,
    quiet: bool,
    methods: list[str] = (),
) -> dict[str, EndpointClient]:
    """Each --endpoint, probed (its models listed, a short warm-up answer), by its name."""
    from specgen.api.spec import METHODS
    from specgen.bench.endpoint import EndpointClient, base_url, default_name

    if (models or names or methods) and not urls:
        raise SpecgenError(
            "--endpoint-model, --endpoint-name and --endpoint-method need an --endpoint URL"
        )
    if methods and len(methods) != len(urls):
        raise SpecgenError(f"{len(methods)} --endpoint-method for {len(urls)} --endpoint: one each")
    if len(models) > 1 and len(models) != len(urls):
        raise SpecgenError(
            f"{len(models)} --endpoint-model for {len(urls)} --endpoint: give one, or one each"
        )
    if names and len(names) != len(urls):
        raise SpecgenError(f"{len(names)} --endpoint-name for {len(urls)} --endpoint: one each")
    asked = methods or [None] * len(urls)
    pairs = zip(urls, asked, strict=True)
    labels = names or [default_name(base_url(url)) + (f"/{m}" if m else "") for url, m in pairs]
    twice = next((n for n in labels if labels.count(n) > 1), None)
    if twice is not None:
        raise SpecgenError(f"two endpoints named {twice}: give each an --endpoint-name")
    taken = next((n for n in labels if n in (*METHODS, "hf", "none")), None)
    if taken is not None:
        raise SpecgenError(f"--endpoint-name {taken} is a local method's name: give another")
    clients: dict[str, EndpointClient] = {}
    try:
        for i, (url, label) in enumerate(zip(urls, labels, strict=True)):
            model = models[i] if len(models) > 1 else (models[0] if models else None)
            client = clients[label] = EndpointClient(
                url, name=label, model=model, api_key=api_key, method=asked[i]
            )
            if not quiet:
                served = client.endpoint
                by = f" ({served.owned_by})" if served.owned_by else ""
                display.status(f"{label}: {served.model}{by} at {served.url}")
    except BaseException:
        for client in clients.values():
            client.close()
        raise
    return clients


def _pipelines(run: Run, methods: str | None, drafters: list[str]) -> dict:
    """The AR pipeline and one per method, all on one loaded target, with the same engine
    and CUDA-graph settings (`specgen.api.method_pipelines.load_methods`); hf: transformers'
    generate."""
    from specgen.api.method_pipelines import drafters_by_kind, load_methods
    from specgen.api.spec import METHODS
    from specgen.methods import DRAFTERS
    from specgen.registry import MODELS

    by_kind = drafters_by_kind(drafters)
    tried: list[str] = []  # offered by default: left out, said why, where the target refuses
    if methods is None:
        entry = MODELS.get(run.model.lower())
        known = set(entry.drafters) if entry else set()
        # AR, the methods that need no drafter, then those whose drafter is at hand
        tried = [m for m, cls in DRAFTERS.items() if not cls.needs_drafter]
        names = [AR, *tried] + [
            m for m in DRAFTERS if DRAFTERS[m].needs_drafter and (m in by_kind or m in known)
        ]
    else:
        names = [m.strip() for m in methods.split(",") if m.strip()]
        unknown = [m for m in names if m not in (*METHODS, "hf")]
        if unknown:
            available = ", ".join((*METHODS, "hf"))
            raise SpecgenError(f"unknown method {unknown[0]!r}; available: {available}")
        names = [AR] + [m for m in names if m != AR]  # AR is always the baseline
    notify = None if run.quiet else display.status
    pipes = load_methods(
        [m for m in names if m not in ("hf", *tried)], run.load, settings=run.spec(),
        drafters=by_kind, notify=notify, measure_costs=run.measure_costs,
    )  # fmt: skip
    base = pipes[AR]  # plain AR, with the run's engine settings
    for name in tried:  # e.g. mtp, which only targets that ship an MTP head run
        spec = replace(run.spec(), method=name, drafter=None)
        try:
            pipes[name] = base.with_spec(spec, notify=notify, measure_costs=run.measure_costs)
        except SpecgenError as e:
            if notify:
                notify(f"{name} left out: {e}")
    if "hf" in names:  # transformers' generate on the same checkpoint and dtype
        from specgen.bench.transformers_baseline import TransformersBaseline

        pipes["hf"] = TransformersBaseline(
            Path(base.source), base.model.dtype, base.model.device, base.codec.stop_ids
        )
    return {name: pipes[name] for name in names if name in pipes}  # in the order asked for
