"""Training an EAGLE-3 drafter (`specgen train --kind eagle3`) with training-time test.

Entry p of a sequence pairs the target's fused taps at p with the token at p + 1 and
predicts the token at p + 2 (methods/eagle3/network.py). Step 0 runs every entry causally, as the
drafter's pass over committed tokens does at inference. A chain anchored at token a
(entry a - 1) then takes k - 1 more steps, each feeding the previous step's hidden output
back with the next token, and attending to the step-0 keys up to its anchor's entry and to
its own earlier steps' keys: exactly the cache a chain step sees when it drafts. The true
next token stands in for the drafted one (teacher forcing), which changes nothing while
the drafts are right, and acceptance only counts those. SpecForge and DeepSpec train so
("TTT"); here the chains are drawn at random anchors of the answer, and every step's
weighted cross-entropy is taken over the draft vocabulary (the tokens the data uses,
`trainer.Vocab`), which becomes the checkpoint's `d2t`/`t2d`.

The drafter is written in SpecForge's layout (`LlamaForCausalLMEagle3`, `midlayer.*`),
the one most Hub checkpoints use and SGLang and vLLM load; its head starts as the target's
rows of the draft vocabulary and its final norm as the target's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specgen.kernels.qk_rope import apply_rope
from specgen.kernels.rmsnorm import rms_norm
from specgen.methods.eagle3.config import Eagle3Args, entering_default
from specgen.methods.eagle3.network import Eagle3Net
from specgen.models.layers.rope import rope_tables
from specgen.models.transformer import Transformer
from specgen.training.checkpoint import text_config
from specgen.training.evaluate import walk
from specgen.training.kind import DrafterTraining
from specgen.training.losses import slot_weights
from specgen.training.trainer import Prepared, Vocab

CHAIN = 7  # chain steps trained and drafted (EAGLE's and DeepSpec's ttt_length)


def eagle3_config(target_config: dict[str, Any], taps: tuple[int, ...], draft_vocab: int) -> dict:
    """SpecForge's config for a one-midlayer drafter of the target's own shape; taps as
    SGLang's explicit ids (layer outputs)."""
    text = text_config(target_config)
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
            "max_position_embeddings", "vocab_size", "hidden_act", "bos_token_id",
            "eos_token_id", "pad_token_id")  # fmt: skip
    out = {k: text[k] for k in keep if k in text}
    out.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        draft_vocab_size=draft_vocab,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(taps)},
    )
    return out


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE's default (the states entering layers 2, L/2, L-3), as layer outputs."""
    return tuple(i - 1 for i in entering_default(num_layers))


def new_eagle3(target: Transformer, config: dict, vocab: Vocab | None, seed: int) -> Eagle3Net:
    """Random layer and fc (std 0.02, norms at 1); head and final norm from the target."""
    args = Eagle3Args.from_hf(config, num_target_layers=target.args.num_layers, name="new")
    net = Eagle3Net(args, dtype=torch.float32, device=target.device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in net.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen).to(p.device) * 0.02)
        ids = _draft_ids(target, vocab)
        net.lm_head.dense().copy_(target.lm_head.lookup(ids).float())
        net.norm.copy_(target.norm.float())
        net.to_target = ids
    return net


def _draft_ids(target: Transformer, vocab: Vocab | None) -> torch.Tensor:
    if vocab is None:
        return torch.arange(target.args.vocab_size, device=target.device)
    return vocab.ids


def trainable(net: Eagle3Net) -> list[torch.nn.Parameter]:
    params = list(net.parameters())  # the embedding is the target's, outside the net
    for p in params:
        p.requires_grad_(True)
    return params


class _Attention:
    """One layer's q/k/v and output, differentiably (methods/eagle3/network.py's forward,
    unrolled)."""

    def __init__(self, net: Eagle3Net, i: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.net, self.i, self.layer = net, i, net.layers[i]
        self.cos, self.sin = cos, sin
        la = net.args.layers
        self.nq, self.nkv, self.d, self.eps = (
            la.num_heads,
            la.num_kv_heads,
            la.head_dim,
            la.rms_norm_eps,
        )

    def qkv(self, x: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor):
        """x, emb: [T, H] at `positions` -> residual [T, H], q [nq, T, d], k, v [nkv, T, d]."""
        net, layer, eps = self.net, self.layer, self.eps
        if net.fused(self.i):
            normed = rms_norm(x, net.hidden_norms[self.i], eps)
            residual = normed if net.args.norm_before_residual and self.i == 0 else x
            h = torch.cat([rms_norm(emb, layer.attn_norm, eps), normed], dim=-1)
        else:
            residual, h = x, rms_norm(x, layer.attn_norm, eps)
        qkv = F.linear(h, layer.wqkv.dense(), layer.bqkv)
        nq, nkv, d = self.nq, self.nkv, self.d
        q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
        q, k = q.view(1, -1, nq, d), k.view(1, -1, nkv, d)
        if layer.q_norm is not None:
            q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
        cos, sin = self.cos[positions], self.sin[positions]
        q, k = (
            apply_rope(q, cos, sin)[0].transpose(0, 1),
            apply_rope(k, cos, sin)[0].transpose(0, 1),
        )
        return residual, q, k, v.view(-1, nkv, d).transpose(0, 1)

    def output(self, residual: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [nq, T, d] -> the layer's output [T, H] (o_proj, residual, MLP)."""
        layer = self.layer
        x = residual + F.linear(
            out.transpose(0, 1).reshape(out.shape[1], -1), layer.wo.dense(), layer.bo
        )
        gate, up = F.linear(rms_norm(x, layer.ffn_norm, self.eps), layer.w_gate_up.dense()).chunk(
            2, -1
        )
        return x + F.linear(F.silu(gate) * up, layer.w_down.dense())

    def expand(self, t: torch.Tensor) -> torch.Tensor:  # [nkv, ...] -> [nq, ...]
        return t.repeat_interleave(self.nq // self.nkv, dim=0)


def chain_hidden(
    target: Transformer,
    net: Eagle3Net,
    item: Prepared,
    anchors: torch.Tensor,  # [A] token positions a: the chain's entry a - 1 ends the pass
    steps: int,
) -> list[torch.Tensor]:  # per step j: [A, H] hidden outputs of entry a - 1 + j
    """The hidden outputs a chain of `steps` from each anchor computes (teacher-forced)."""
    device, ids = target.device, torch.tensor(item.seq.ids, device=target.device)
    m = ids.shape[0] - 1  # entries 0..m-1 (entry p's token is ids[p + 1])
    la = net.args.layers
    cos, sin = rope_tables(la.rope, la.head_dim, m + steps, dtype=torch.float32, device=device)
    layers = [_Attention(net, i, cos, sin) for i in range(la.num_layers)]
    with torch.no_grad():
        emb_all = target.embed.lookup(ids[1:]).float()  # [m, H]
    x = _project(net, item.features[:m].to(device, torch.float32))
    positions = torch.arange(m, device=device)
    base_keys = []  # per layer: step 0's k, v over every entry
    for layer in layers:
        residual, q, k, v = layer.qkv(x, emb_all, positions)
        base_keys.append((k, v))
        out = F.scaled_dot_product_attention(q, layer.expand(k), layer.expand(v), is_causal=True)
        x = layer.output(residual, out)
    entry = anchors - 1
    hidden = [_feed(net, x)[entry]]
    chain_keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
    visible = positions[None, :] <= entry[:, None]  # [A, m]: step 0's entries up to the anchor's
    for j in range(1, steps):
        p = (entry + j).clamp(max=m - 1)  # entries past the answer are masked out of the loss
        x = hidden[-1]
        emb = emb_all[p]
        for li, layer in enumerate(layers):
            residual, q, k, v = layer.qkv(x, emb, p)  # q [nq, A, d], k/v [nkv, A, d]
            chain_keys[li].append((k, v))
            k0, v0 = base_keys[li]
            scores0 = torch.einsum("had,hmd->ham", q, layer.expand(k0)) / layer.d**0.5
            scores0 = scores0.masked_fill(~visible[None], float("-inf"))
            own_k = torch.stack([layer.expand(ck) for ck, _ in chain_keys[li]], dim=2)
            own_v = torch.stack([layer.expand(cv) for _, cv in chain_keys[li]], dim=2)
            scores1 = torch.einsum("had,hasd->has", q, own_k) / layer.d**0.5  # [nq, A, j]
            probs = torch.cat([scores0, scores1], dim=-1).softmax(-1)
            out = probs[..., :m] @ layer.expand(v0)
            out = out + torch.einsum("has,hasd->had", probs[..., m:], own_v)
            x = layer.output(residual, out)
        hidden.append(_feed(net, x))
    return hidden


def _project(net: Eagle3Net, features: torch.Tensor) -> torch.Tensor:
    """`Eagle3Net.project`, differentiably."""
    eps = net.args.layers.rms_norm_eps
    if net.input_norm is not None:
        features = rms_norm(features, net.input_norm, eps)
    if len(net.fc_norms):
        chunks = features.chunk(len(net.fc_norms), dim=-1)
        features = torch.cat(
            [rms_norm(c, w, eps) for c, w in zip(chunks, net.fc_norms, strict=True)], -1
        )
    return F.linear(features, net.fc)


def _feed(net: Eagle3Net, x: torch.Tensor) -> torch.Tensor:
    """What a chain step feeds back (and the head reads): normed under speculators' norm_output."""
    return rms_norm(x, net.norm, net.args.layers.rms_norm_eps) if net.args.feed_normed else x


def chain_logits(target: Transformer, net: Eagle3Net, hidden: torch.Tensor) -> torch.Tensor:
    a = net.args
    normed = (
        hidden
        if a.feed_normed or not a.logits_normed
        else rms_norm(hidden, net.norm, a.layers.rms_norm_eps)
    )
    if net.lm_head is None:  # DeepSpec's layout drafts through the target's head
        return target.lm_head(normed)
    return F.linear(normed, net.lm_head.dense())


def chain_targets(item: Prepared, anchors: torch.Tensor, steps: int, device) -> torch.Tensor:
    """[A, steps] the token step j of the chain at anchor a predicts: ids[a + 1 + j] (-1 past
    the answer)."""
    ids = torch.tensor(item.seq.ids, device=device)
    positions = anchors[:, None] + 1 + torch.arange(steps, device=device)[None, :]
    return torch.where(positions < ids.shape[0], ids[positions.clamp(max=ids.shape[0] - 1)], -1)


def _draft_targets(tokens: torch.Tensor, vocab: Vocab | None) -> torch.Tensor:
    return tokens if vocab is None else vocab.targets(tokens)


def anchor_range(item: Prepared) -> tuple[int, int]:
    """Anchors a decoding step can have: the answer's tokens with one after them."""
    return item.seq.response_start, len(item.seq.ids) - 2


def eagle3_loss(
    target: Transformer,
    net: Eagle3Net,
    item: Prepared,
    *,
    anchors_per_sequence: int,
    gamma: float,
    generator: torch.Generator,
    vocab: Vocab | None,
    steps: int = CHAIN,
) -> tuple[torch.Tensor, dict[str, float]] | None:
    lo, hi = anchor_range(item)
    if hi < lo:
        return None
    count = min(anchors_per_sequence, hi - lo + 1)
    anchors = (lo + torch.randperm(hi - lo + 1, generator=generator)[:count]).sort().values
    anchors = anchors.to(target.device)
    hidden = torch.stack(chain_hidden(target, net, item, anchors, steps), dim=1)  # [A, S, H]
    targets = _draft_targets(chain_targets(item, anchors, steps, target.device), vocab)
    logits = chain_logits(target, net, hidden)
    w = slot_weights(targets, gamma)
    ce = F.cross_entropy(
        logits.flatten(0, 1), targets.clamp(min=0).flatten(), reduction="none"
    ).view_as(w)
    loss = (w * ce).sum() / w.sum().clamp(min=1e-9)
    return loss, {"ce": loss.item()}


@torch.no_grad()
def accepted_lengths(
    target: Transformer, net: Eagle3Net, item: Prepared, vocab: Vocab | None, steps: int = CHAIN
) -> tuple[int, torch.Tensor]:
    """(first anchor, drafts a greedy chain of `steps` would get accepted at each anchor)."""
    lo, hi = anchor_range(item)
    if hi < lo:
        return lo, torch.zeros(0, dtype=torch.long)
    anchors = torch.arange(lo, hi + 1, device=target.device)
    hidden = torch.stack(chain_hidden(target, net, item, anchors, steps), dim=1)
    drafts = net.to_target[chain_logits(target, net, hidden).argmax(-1)]
    targets = chain_targets(item, anchors, steps, target.device)
    match = (drafts == targets) & (targets >= 0)
    return lo, match.int().cumprod(-1).sum(-1).cpu()


def save_eagle3(
    path: Path,
    net: Eagle3Net,
    config: dict,
    extra: dict | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """config.json + model.safetensors in SpecForge's layout (`midlayer.*`, d2t, t2d)."""
    tensors = {row.key: row.read().detach().to(dtype).cpu().contiguous()
               for row in net.plan()}  # fmt: skip
    ids = net.to_target.cpu()
    tensors["d2t"] = (ids - torch.arange(ids.shape[0])).long()
    t2d = torch.zeros(config["vocab_size"], dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**config, **(extra or {})}, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"))
    return path


class Eagle3Training(DrafterTraining):
    """The training loop's hooks for EAGLE-3 (random start only: no `--init target`)."""

    def config(self, target_config: dict[str, Any], target_layers: int, cfg,
               vocab: Vocab | None) -> dict:  # fmt: skip
        rows = target_config.get("vocab_size") if vocab is None else int(vocab.ids.shape[0])
        return eagle3_config(target_config, cfg.target_layers or default_taps(target_layers), rows)

    def new(self, target: Transformer, config: dict, cfg, vocab: Vocab | None) -> Eagle3Net:
        return new_eagle3(target, config, vocab, cfg.seed)

    def trainable(self, net) -> list[torch.nn.Parameter]:
        return trainable(net)

    def reads(self, net, target: Transformer) -> tuple[tuple[int, ...], int | None]:
        return tuple(net.args.taps), None

    def loss(self, target: Transformer, net, item: Prepared, *, anchors_per_sequence: int,
             gamma: float, generator: torch.Generator, vocab: Vocab | None):  # fmt: skip
        return eagle3_loss(target, net, item, anchors_per_sequence=anchors_per_sequence,
                           gamma=gamma, generator=generator, vocab=vocab)  # fmt: skip

    def evaluate(self, target: Transformer, net, held: list[Prepared], vocab: Vocab | None):
        return walk(accepted_lengths(target, net, item, vocab) for item in held)

    def write(self, out: Path, net, config: dict, vocab: Vocab | None, record: dict) -> None:
        save_eagle3(out, net, config, extra={"specgen_training": record})
