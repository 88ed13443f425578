"""The slow oracle for DSpark's heads: teacher-forced, written out per slot from the formulas.

Given the backbone outputs of the draft slots, the anchor and a sequence of draft tokens,
it recomputes each slot's Markov-corrected logits and confidence logit from scratch with
plain float64 arithmetic (no cached state, no shared helpers). `markov_draw` (left to
right, drawing as it goes) must agree with it on the tokens it drew, and greedy drawing
must pick what this oracle's argmax picks slot by slot.
"""

from __future__ import annotations

import torch

from specgen.methods.dspark.network import DSparkNet


@torch.no_grad()
def reference_heads(
    net: DSparkNet,
    base: torch.Tensor,  # [k, V] backbone logits of the draft slots
    hidden: torch.Tensor,  # [k, H]
    anchor: int,
    tokens: list[int],  # the draft tokens (teacher forcing: slot j's previous is tokens[j-1])
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [k, V] corrected logits, [k] conf. logits
    a = net.args
    k = base.shape[0]
    prev = [anchor, *tokens[: k - 1]]
    out = base.double().clone()
    conf = torch.zeros(k, dtype=torch.float64) if a.confidence else None
    r = a.markov_rank
    state = torch.zeros(r, dtype=torch.float64)
    for j in range(k):
        h = hidden[j].double()
        emb = net.markov_w1[prev[j]].double() if r else None
        if r:
            if a.markov_kind == "vanilla":
                z = emb
            elif a.markov_kind == "gated":
                gate = net.gate_w.double() @ torch.cat([h, emb]) + net.gate_b.double()
                z = emb / (1 + torch.exp(-gate))
            else:
                joint = net.joint_w.double() @ torch.cat([state, emb, h]) + net.joint_b.double()
                g, c, o = joint[:r], joint[r : 2 * r], joint[2 * r :]
                g = 1 / (1 + torch.exp(-g))
                state = g * state + (1 - g) * torch.tanh(c)
                z = torch.tanh(o)
            out[j] += net.markov_w2.double() @ z
        if conf is not None:
            features = torch.cat([h, emb]) if a.confidence_with_markov else h
            conf[j] = net.conf_w.double()[0] @ features + net.conf_b.double()[0]
    return out, conf
