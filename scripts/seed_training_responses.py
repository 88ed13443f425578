"""Seed drafter-training data for the embedded default: the target's own greedy answers.

    python scripts/seed_training_responses.py [--out data/smollm2-135m/responses.jsonl]
        [--minutes 40] [--batch 32] [--prompt-tokens 128] [--new-tokens 160]

Drafters learn to predict what the target says, so the target answers the training prompts
(`../shared/data/train/*.jsonl` only — never the evaluation sets) and we keep the token
ids. Hidden states are not stored: they are recomputed from these ids by one parallel
forward at training time, which is cheap next to generating.

This uses transformers' batched `generate` in bf16 on the converted embedded model (32
prompts at a time, about 15x the tokens per minute of batch-1 fp32 decoding on this CPU);
greedy bf16 answers can differ from fp32 ones at near-ties, which is harmless for training
data and recorded in each line. Lines are appended as batches finish, and prompts already
in the file are skipped, so the script resumes where a stopped run ended.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE.parents[1] / "shared" / "data" / "train"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=HERE.parent / "data/smollm2-135m/responses.jsonl"
    )
    parser.add_argument("--minutes", type=float, default=40.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specgen.cli.common import quiet_libraries
    from specgen.hub import resolve_model

    quiet_libraries()
    model_dir = resolve_model("smollm2-135m").path
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    done = set()
    if args.out.is_file():
        for line in args.out.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            row = json.loads(line)
            done.add((row["source"], row["index"]))
    items = []
    for path in sorted(TRAIN.glob("*.jsonl")):
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n")):
            if line.strip() and (path.stem, i) not in done:
                items.append((path.stem, i, json.loads(line)["turns"][0]))
    random.Random(0).shuffle(items)  # every source represented early on
    # similar prompt lengths share a batch (less padding), chunks keep the sources mixed
    items = [
        item
        for c in range(0, len(items), 256)
        for item in sorted(items[c : c + 256], key=lambda item: len(item[2]))
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def encode(text: str) -> list[int]:
        ids = tok(text, add_special_tokens=False)["input_ids"][: args.prompt_tokens]
        cut = tok.decode(ids)
        chat = [{"role": "user", "content": cut}]
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    deadline = time.time() + args.minutes * 60
    made, start = 0, time.time()
    for b in range(0, len(items), args.batch):
        if time.time() > deadline:
            break
        group = items[b : b + args.batch]
        prompts = [encode(text) for _, _, text in group]
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        with args.out.open("a") as f:
            for (source, index, _), prompt, row in zip(group, prompts, out[:, width:], strict=True):
                response = row.tolist()
                if tok.eos_token_id in response:
                    response = response[: response.index(tok.eos_token_id) + 1]
                while response and response[-1] == pad and pad != tok.eos_token_id:
                    response.pop()
                made += len(response)
                record = {
                    "source": source,
                    "index": index,
                    "prompt_ids": prompt,
                    "response_ids": response,
                    "dtype": args.dtype,
                    "greedy": True,
                }
                f.write(json.dumps(record) + "\n")
        rate = made / (time.time() - start)
        print(f"{b + len(group)}/{len(items)} prompts, {made} tokens, {rate:.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
