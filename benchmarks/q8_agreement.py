"""How far 8-bit activations move the embedded default's predictions from fp32 activations.

    python benchmarks/q8_agreement.py [--prompts 48] [--answer 128]
    PYTHONPATH=<llama-cpp-python> python benchmarks/q8_agreement.py --llamacpp   # and llama.cpp

SPECGEN_CPU_ACT=q8 quantizes each product's input rows to 8 bits per block of 32 (as
llama.cpp does) instead of multiplying fp32 activations: a different function of the same
weights. This measures how different, on Spec-Bench (data/spec_bench.jsonl, the same number
of prompts from each category), teacher forced, so both paths predict each position from
the same context:

- held-out text: the prompts themselves (articles, documents, questions: text neither path
  wrote), the chat template's tokens left out; perplexity and top-1 agreement;
- answers: the fp32 path's greedy answer to each prompt (--answer tokens): how often q8's
  top-1 differs on it (fp32 agrees with itself by construction, so its perplexity here
  flatters fp32), and how many of the prompts' greedy answers come out identical.

With --llamacpp, llama-cpp-python's logits for the same token ids (its CPU backend also
rounds activations to 8 bits) join as a third column. Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[1] / "data" / "spec_bench.jsonl"
SHARED = Path("/work/shared/data/spec_bench.jsonl")


def questions(n: int) -> list[str]:
    path = DATA if DATA.is_file() else SHARED
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r["turns"][0])
    cats = sorted(by)
    out = [by[c][i] for i in range(n) for c in cats if i < len(by[c])]
    return out[:n]


def logits_of(model, ids: list[int], act: str) -> torch.Tensor:  # [T, V] fp64
    os.environ["SPECGEN_CPU_ACT"] = act
    with torch.inference_mode():
        out = model(torch.tensor([ids]), model.new_cache(len(ids) + 1)).logits[0]
    return out.double()


class Scores:
    """Per position: the path's log-probability of the next token and its top-1."""

    def __init__(self) -> None:
        self.nll: list[float] = []
        self.top: list[int] = []

    def add(self, logits: torch.Tensor, ids: list[int], first: int) -> None:
        lp = torch.log_softmax(logits[first:-1], -1)
        nxt = torch.tensor(ids[first + 1 :])
        self.nll += (-lp.gather(1, nxt[:, None])[:, 0]).tolist()
        self.top += lp.argmax(-1).tolist()

    def ppl(self) -> float:
        return math.exp(sum(self.nll) / len(self.nll))


def agree(a: Scores, b: Scores) -> float:
    return sum(x == y for x, y in zip(a.top, b.top, strict=True)) / len(a.top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--answer", type=int, default=128, help="greedy answer tokens per prompt")
    ap.add_argument("--llamacpp", action="store_true", help="add llama-cpp-python's logits")
    args = ap.parse_args()

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.kernels.packed import kernel_isa

    quiet_libraries()
    pipe = Pipeline.load("smollm2-135m", device="cpu", dtype="float32")
    model = pipe.model
    llm = None
    if args.llamacpp:
        from llama_cpp import Llama

        from specgen.hub import embedded_gguf
        from specgen.registry import DEFAULT_ALIAS, MODELS

        gguf = embedded_gguf(MODELS[DEFAULT_ALIAS])
        llm = Llama(model_path=str(gguf), n_ctx=4096, logits_all=True,
                    n_threads=torch.get_num_threads(), verbose=False)  # fmt: skip
    names = ["fp32", "q8"] + (["llama.cpp"] if llm else [])
    text = {n: Scores() for n in names}
    answer = {n: Scores() for n in names}
    same_answers, common = 0, []
    qs = questions(args.prompts)
    for i, q in enumerate(qs):
        prompt = pipe.encode(q)
        raw = pipe.codec.encode_raw(q)  # the question's own tokens sit at the prompt's end part
        first = max(len(prompt) - len(raw) - 8, 1)  # held-out text: skip the template's head
        # fresh sessions: a session would reuse the prompt's K/V from the other path's run
        os.environ["SPECGEN_CPU_ACT"] = "fp32"
        want = pipe.generate(q, max_new_tokens=args.answer, session=pipe.new_session()).token_ids
        os.environ["SPECGEN_CPU_ACT"] = "q8"
        got = pipe.generate(q, max_new_tokens=args.answer, session=pipe.new_session()).token_ids
        same_answers += list(want) == list(got)
        pairs = enumerate(zip(want, got, strict=False))
        common.append(next((j for j, (a, b) in pairs if a != b), min(len(want), len(got))))
        ids = prompt + list(want)
        for n in names:
            if n == "llama.cpp":
                llm.reset()
                llm.eval(ids)
                lg = torch.from_numpy(llm.scores[: len(ids)]).double()
            else:
                lg = logits_of(model, ids, n)
            text[n].add(lg[: len(prompt)], prompt, first)
            answer[n].add(lg, ids, len(prompt) - 1)
        print(f"  {i + 1}/{len(qs)}: answers identical for {common[-1]} tokens", flush=True)
    print(f"smollm2-135m (Q4_1 GGUF), {kernel_isa()}, {len(qs)} Spec-Bench prompts")
    out = {"isa": kernel_isa(), "prompts": len(qs)}
    for part, scores in (("held-out text", text), ("fp32's greedy answers", answer)):
        print(f"  {part} ({len(scores['fp32'].top)} tokens): perplexity; top-1 = each path's")
        rows = {}
        for n in names:
            rows[n] = {"ppl": round(scores[n].ppl(), 4)}
            rows[n].update({f"top1={o}": round(agree(scores[n], scores[o]), 5) for o in names})
            same = "  ".join(f"{o} {rows[n][f'top1={o}']:.4f}" for o in names if o != n)
            print(f"    {n:9s} {rows[n]['ppl']:8.3f}   {same}")
        out[part] = rows
    print(
        f"  q8's greedy answer identical to fp32's: {same_answers}/{len(qs)}; "
        f"tokens before the first difference: median {sorted(common)[len(common) // 2]}"
    )
    out["identical_answers"], out["first_difference"] = same_answers, common
    print(json.dumps(out))


if __name__ == "__main__":
    main()
