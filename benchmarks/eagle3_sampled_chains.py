"""EAGLE-3 at temperature > 0: chains drawn from the drafter's distribution vs argmax chains.

    python benchmarks/eagle3_sampled_chains.py --num-prompts 8 --temperatures 0.7,1.0

Every prompt is answered with the same seeds twice by the same drafter, every draft
verified whole (verify policy full): once with its chain drawn from its own distribution
under the request's filters (its q handed to the verifier: what `--method eagle3` does),
once with the argmax chain (a point mass: what it did before). Both outputs have the
target's distribution; only acceptance differs. Reported per temperature: τ (accepted
drafts + 1 per step) of each rule and their ratio, and the exact expected acceptance of
each step's first draft under each rule, averaged over the steps of the sampled runs:
Σ_x min(p(x), q(x)) for a draw from q against p(argmax q) for the point mass. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "spec_bench.jsonl"
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"


def main() -> None:
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.methods.eagle3 import drafter as eagle3

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default="specgen:smollm2-135m-eagle3")
    parser.add_argument("--prompts", type=Path, default=SHARED if SHARED.is_file() else SAMPLE)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, default=None)
    args = parser.parse_args()

    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [r["turns"][0] for r in rows[:: max(1, len(rows) // args.num_prompts)]]
    prompts = prompts[: args.num_prompts]
    spec = SpecConfig(
        method="eagle3", drafter=args.drafter, verify_policy="full",
        draft_tokens=args.draft_tokens, engine="sync", trace=True,
    )  # fmt: skip
    pipe = Pipeline.load(args.model, device="cpu", dtype="float32", spec=spec)
    drafter_class = eagle3.Eagle3Drafter
    sampled_rule, propose = drafter_class._sampling, drafter_class.propose
    qs: list[torch.Tensor] = []  # each sampled draft's first q, in drafting order

    def argmax_rule(self, params, generator):
        return None  # the argmax chain whatever the temperature (what it did before)

    def recording(self, anchor, max_tokens, params=None, generator=None):
        draft = propose(self, anchor, max_tokens, params, generator)
        if draft.probs is not None and draft.length:
            qs.append(draft.probs[0, 0].clone())
        return draft

    results = {}
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        taus, odds = {"sampled": [], "argmax": []}, []
        for rule in ("sampled", "argmax"):
            drafter_class._sampling = sampled_rule if rule == "sampled" else argmax_rule
            drafter_class.propose = recording if rule == "sampled" else propose
            for prompt in prompts:
                for seed in range(args.seeds):
                    params = SamplingParams(temperature=temperature, seed=seed)
                    qs.clear()
                    out = pipe.generate(
                        prompt, sampling=params, max_new_tokens=args.max_new_tokens,
                        session=pipe.new_session(),
                    )  # fmt: skip
                    taus[rule].append(out.stats.acceptance_length)
                    if rule == "sampled":
                        odds.extend(_first_draft_odds(pipe, prompt, out, list(qs), params))
        drafter_class._sampling, drafter_class.propose = sampled_rule, propose
        sampled, argmax = statistics.mean(taus["sampled"]), statistics.mean(taus["argmax"])
        row = {
            "tau_sampled": round(sampled, 4),
            "tau_argmax": round(argmax, 4),
            "ratio": round(sampled / argmax, 4),
            "first_draft_accept_sampled": round(statistics.mean(o[0] for o in odds), 4),
            "first_draft_accept_argmax": round(statistics.mean(o[1] for o in odds), 4),
            "answers": len(taus["sampled"]),
            "steps": len(odds),
        }
        results[str(temperature)] = row
        print(f"T={temperature}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    print(json.dumps({"model": args.model, "drafter": args.drafter, "results": results}))


def _first_draft_odds(pipe, prompt, out, qs, params):
    """Each drafted step's first-draft acceptance under both rules, exactly: the target's
    p after the step's anchor (one forward over the whole answer) and the drafter's q."""
    from specgen.verify.sampling import probabilities

    ids = pipe.encode(prompt) + out.token_ids
    model = pipe.model
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), model.new_cache(len(ids) + 1)).logits[0]
    pos = len(ids) - len(out.token_ids)  # the first anchor: the prefill's token
    rows, drafted = [], iter(qs)
    for record in out.stats.trace[1:]:
        if record["draft"]:
            q = next(drafted)
            p = probabilities(logits[pos], params)  # the token after the anchor
            rows.append((float(torch.minimum(p, q).sum()), float(p[int(q.argmax())])))
        pos += len(record["committed"])
    return rows


if __name__ == "__main__":
    main()
