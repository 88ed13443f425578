"""What `--quantize` costs in accuracy, per bit width and group size, on the embedded default.

    python benchmarks/quantize_groups.py

The embedded default's dequantized fp32 weights are quantized again (int8 and int4, groups
of 32, 64 and 128 columns). Reported: the matrices' relative error (Frobenius norm of the
difference over the norm), bits per matrix weight, and, over the Spec-Bench sample prompts
at T = 0, the mean KL divergence of next-token distributions from the fp32 model's along
the fp32 model's own answers, and how often the argmax agrees. The last line is JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    from specgen import Pipeline
    from specgen.api.loader import quantize_target
    from specgen.models.formats.weights import LinearWeight, describe_weights

    ref = Pipeline.load("smollm2-135m", device="cpu", dequantize=True)
    texts = [json.loads(line)["turns"][0] for line in
             (HERE / "prompts" / "spec_bench_sample.jsonl").read_text().splitlines()]  # fmt: skip
    seqs = []
    for text in texts:
        ids = ref.encode(text)
        seqs.append(ids + ref.generate(text, max_new_tokens=48).token_ids)

    def logits(model, ids):
        with torch.no_grad():
            return model(torch.tensor([ids]), model.new_cache(len(ids) + 1)).logits[0].float()

    base = [logits(ref.model, s) for s in seqs]
    out = {}
    for bits in ("int8", "int4"):
        for group in (32, 64, 128):
            import specgen.models.formats.packed_weight as wp
            from specgen.models.formats.weights import FORMATS

            FORMATS[bits] = wp._quantized(int(bits[-1]), group)  # this group size
            q = Pipeline.load("smollm2-135m", device="cpu", dequantize=True)
            dense = {n: m.dense().clone() for n, m in q.model.named_modules()
                     if isinstance(m, LinearWeight)}  # fmt: skip
            quantize_target(q.model, bits, "smollm2-135m")
            num = den = 0.0
            for n, m in q.model.named_modules():
                if n in dense:
                    num += (m.dense() - dense[n]).pow(2).sum().item()
                    den += dense[n].pow(2).sum().item()
            kl, agree, total = 0.0, 0, 0
            for s, b in zip(seqs, base, strict=True):
                got = logits(q.model, s)
                p, lq = b.log_softmax(-1), got.log_softmax(-1)
                kl += (p.exp() * (p - lq)).sum(-1).sum().item()
                agree += (got.argmax(-1) == b.argmax(-1)).sum().item()
                total += len(s)
            row = {
                "relative_error": round((num / den) ** 0.5, 5),
                "bits_per_weight": describe_weights(q.model)["matrix_bits_per_weight"],
                "mean_kl": round(kl / total, 5),
                "argmax_agreement": round(agree / total, 4),
            }
            out[f"{bits}-g{group}"] = row
            print(f"{bits}-g{group}: {row}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
