"""An answer's speculative statistics as the `"specgen"` extension object of a response.

vLLM's names where vLLM has the number (`mean_acceptance_length`, `num_spec_steps`,
`num_draft_tokens`, `num_accepted_draft_tokens`, `acceptance_histogram`), specgen's own
for the rest, all read from `GenStats` (the same numbers as `generate --json`). Steps
count the prefill's, as τ does (DESIGN.md §1): τ = 1 + accepted / steps.
"""

from __future__ import annotations

from typing import Any

from specgen.core.stats import GenStats


def histogram(stats: GenStats) -> list[int]:
    """Steps by how many draft tokens they accepted (index = accepted)."""
    at_least = stats.accepted_per_position  # [k]: steps that accepted more than k
    counts = [stats.steps - (at_least[0] if at_least else 0)]
    for k in range(len(at_least)):
        nxt = at_least[k + 1] if k + 1 < len(at_least) else 0
        counts.append(at_least[k] - nxt)
    return counts


def final(stats: GenStats, *, queue_seconds: float, speedup: float | None = None) -> dict[str, Any]:
    """The whole answer's statistics (a response, or the last chunks of a stream);
    `speedup`: over plain decoding, priced from the cost table on both sides
    (`scheduling.speedup.modeled_speedup`), None without a table."""
    d = stats.to_dict()
    return {
        "method": stats.method,
        "verify_policy": d["verify_policy"],
        "mean_acceptance_length": d["acceptance_length"],
        "num_spec_steps": d["steps"],
        "num_draft_tokens": d["drafted_tokens"],
        "num_accepted_draft_tokens": d["accepted_tokens"],
        "acceptance_histogram": histogram(stats),
        "mean_verify_length": d["mean_verify_length"],
        "acceptance_per_position": d["accepted_per_position"],
        "mean_confidence": d["mean_confidence"],
        "drafters": d["drafters"],
        "tokens": d["new_tokens"],
        "tokens_per_second": d["tokens_per_second"],
        "speedup_vs_ar_modeled": None if speedup is None else round(speedup, 4),
        "ttft_seconds": d["ttft_seconds"],
        "seconds": d["seconds"],
        "queue_seconds": round(queue_seconds, 4),  # waiting for the answers before it
        "prefill_tokens": d["prefill_tokens"],
        "cached_tokens": d["prompt_tokens"] - d["prefill_tokens"],
    }


def running(stats: GenStats, drafted_chars: int) -> dict[str, Any]:
    """The small object on every streamed content chunk: totals so far."""
    return {
        "drafted_chars": drafted_chars,  # leading characters of this delta from drafts
        "tokens": stats.new_tokens,
        "tau": round(stats.acceptance_length, 3),
        "tokens_per_second": round(stats.tokens_per_second, 2),
        "acceptance_per_position": stats.acceptance_per_position(),
    }


def empty(method: str, prompt_tokens: int) -> dict[str, Any]:
    """The statistics of an answer cut before its first step (the server was stopping)."""
    stats = GenStats(prompt_tokens=prompt_tokens, prefill_tokens=prompt_tokens)
    stats.method = method
    return final(stats, queue_seconds=0.0)
