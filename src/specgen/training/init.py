"""Starting weights for a new drafter: random, or copied from the target's own layers.

Random: std 0.02 matrices, norms at 1, and the parts a method names `neutral` at 0 (DSpark:
its Markov head's output, so the drafter starts as its plain backbone; its confidence
head, so it starts undecided).

From the target (`init_from_target`): the drafter's layers are the target layers that
follow its top tap, so at step 0 the drafter already computes what the target computes
from there: `fc` passes the top tap's features through unchanged (small noise on the other
taps, which then learn), `hidden_norm` takes that next layer's input norm (context keys
see what the target layer would), and the final norm is the target's. The block's inputs
are token embeddings rather than layer outputs, so this is a warm start, not an equivalence
(and for a Llama target, whose layers have no q/k norms, the drafter's start at 1).
"""

from __future__ import annotations

import torch

from specgen.core.errors import SpecgenError
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.transformer import Transformer


def random_init(net: torch.nn.Module, seed: int, neutral: tuple[str, ...] = ()) -> None:
    """`neutral`: endings of the parameter names that start at 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 1:
                p.fill_(0.0 if name.endswith(neutral) else 1.0)
            elif name.endswith(neutral):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def init_from_target(backbone: DFlashNet, target: Transformer) -> None:
    """The block backbone's layers from the target's (a method's heads keep theirs)."""
    if target.family.warm_start_refusal:
        raise SpecgenError(target.family.warm_start_refusal)
    taps = backbone.args.target_layer_ids
    top = max(taps)
    last = target.args.num_layers - 1
    sources = [min(top + 1 + i, last) for i in range(len(backbone.layers))]
    h = backbone.args.layers.hidden_size
    with torch.no_grad():
        for layer, source in zip(backbone.layers, sources, strict=True):
            # a Llama target has no q/k norms: the drafter's (Qwen3-style) stay at 1
            missing, unexpected = layer.load_state_dict(
                target.layers[source].state_dict(), strict=False
            )
            assert set(missing) <= {"q_norm", "k_norm"} and not unexpected, (missing, unexpected)
        backbone.hidden_norm.copy_(target.layers[sources[0]].attn_norm)
        backbone.norm.copy_(target.norm)
        backbone.fc.mul_(0.1)  # keep the other taps' noise small next to the identity
        column = taps.index(top) * h
        backbone.fc[:, column : column + h] = torch.eye(h, dtype=backbone.fc.dtype)
