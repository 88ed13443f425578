"""Generate with the public Python API: plain decoding, streaming, and a speculative method.

    python examples/generate.py
"""

from specgen import Pipeline, SamplingParams, SpecConfig

pipe = Pipeline.load()  # the embedded default (SmolLM2-135M-Instruct); works offline

answer = pipe.generate("What is the capital of France?", max_new_tokens=32)
print(answer.text)
print(answer.stats.to_dict())

sampling = SamplingParams(temperature=0.7, top_p=0.9, seed=0)
for chunk in pipe.stream("Write a haiku about the sea.", sampling=sampling, max_new_tokens=48):
    print(chunk.text, end="", flush=True)
print()

# Prompt lookup on the same loaded model: same greedy output, drafted from the prompt where
# it can be; the scheduler verifies only as many drafts as pay for themselves.
fast = pipe.with_spec(SpecConfig(method="ngram", verify_policy="cost"))
text = "Repeat after me: the quick brown fox jumps over the lazy dog."
result = fast.generate(text, max_new_tokens=32)
print(result.text, f"(τ {result.stats.acceptance_length:.2f}, incl. bonus)")
