"""Statistics for the sampling tests: chi-square against an exact distribution, and the
total variation of a sampled second token."""

from __future__ import annotations

import torch

from specgen.verify.sampling import probabilities
from support.targets import TINY_VOCAB


def second_token_tv(pipe, target, text: str = "The quick brown fox", n: int = 1500):
    """(total variation between the empirical and exact distributions of the second token
    `pipe` samples at T = 1, top-k 4, over `n` seeds; the same for a random distribution)."""
    from specgen.core.config import SamplingParams
    from specgen.verify.sampling import probabilities

    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = pipe.encode(text, raw=True)
    last = target(torch.tensor([prompt]), target.new_cache(32)).logits[0, -1]
    first = probabilities(last, params)
    # one sequence per call, as the pipeline runs them (a packed CPU target: the fused pass;
    # a batch takes the eager layers, whose fp32 rounding differs, and with 8-bit
    # activations a rounding step crossed there moves a tiny model's logits visibly)
    seconds = torch.tensor([prompt + [x] for x in range(TINY_VOCAB)])
    logits = torch.cat([target(s[None], target.new_cache(32)).logits[:, -1] for s in seconds])
    exact = first @ probabilities(logits, params)  # P(x2) = sum_x1 p(x1) p(x2 | x1)
    counts = torch.zeros(TINY_VOCAB)
    session = pipe.new_session()
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=2, session=session)
        counts[out.token_ids[1]] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    far = 0.5 * (torch.distributions.Dirichlet(torch.ones(TINY_VOCAB)).sample() - exact).abs().sum()
    return tv, far


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit test of observed `counts` against `probs`: the p-value.

    Cells expected fewer than 5 times are pooled into one; the chi-square tail is the
    Wilson-Hilferty normal approximation (ample for p-values down to 1e-6)."""
    import math

    n = counts.sum().item()
    expected = probs.double() * n
    big = expected >= 5
    obs = counts.double()[big].tolist()
    exp = expected[big].tolist()
    if expected[~big].sum() > 0:
        obs.append(counts.double()[~big].sum().item())
        exp.append(expected[~big].sum().item())
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    dof = len(exp) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def exact_token_distribution(target, prompt, params, position):
    """P(token at `position` of the answer) under the target alone, by enumerating every
    path through the (top-k-limited) earlier tokens."""
    paths, weights = [list(prompt)], torch.ones(1, dtype=torch.float64)
    for _ in range(position + 1):
        logits = target(torch.tensor(paths), target.new_cache(64, batch=len(paths))).logits
        p = probabilities(logits[:, -1], params).double()  # [paths, V]
        if _ == position:
            return weights @ p
        nz = p.nonzero()
        weights = weights[nz[:, 0]] * p[nz[:, 0], nz[:, 1]]
        paths = [paths[i] + [t] for i, t in nz.tolist()]
