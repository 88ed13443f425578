"""DSpark's left-to-right Markov-head draw for one block, in one kernel launch.

For slots j = 1..k (vanilla Markov head, rank r; optional draft vocabulary `ids`):

    z_j    = W1[prev_j]                                  (prev_1 = the anchor)
    c_j    = conf_w . [h_j ; z_j] + conf_b               (before token j is drawn; optional)
    l_j    = base[j] + W2 z_j                            (logits over the draft vocabulary)
    x_j    = argmax_v l_j[v]                             (greedy: first index among maxima)
           | argmax_v q_j[v] / E_j[v], q_j = softmax(l_j / T)   (sampled: an exponential
             race over Exp(1) noise E drawn beforehand; q_j is written out for the verifier)
    prev_{j+1} = ids[x_j] (or x_j without a draft vocabulary)

Eager torch launches ~6 small ops per slot; the kernel keeps the whole chain in one
program, streaming W2 in tiles of `BLOCK_V` rows per slot (twice when sampling: once for
the log-sum-exp and the race, once to write q). The sampled form covers temperature alone;
top-k / top-p filtering stays in torch (a graph-captured loop), as do gated and rnn heads.
The confidence comes back as logits so the caller applies its calibration and sigmoid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.kernels import triton_available


def markov_greedy_torch(
    base: torch.Tensor,  # [k, V'] backbone logits of the draft slots (V' = len(ids) or V)
    hidden: torch.Tensor,  # [k, H]
    anchor: int | torch.Tensor,  # the id, or [1] int64 on the device
    w1: torch.Tensor,  # [V, r]
    w2: torch.Tensor,  # [V', r] (rows of the draft vocabulary when there is one)
    ids: torch.Tensor | None,  # [V'] token ids of base's columns, or None
    conf_w: torch.Tensor | None,  # [1, H + r] or [1, H]
    conf_b: torch.Tensor | None,  # [1]
    noise: torch.Tensor | None = None,  # [k, V'] Exp(1): sample instead of argmax
    temperature: float = 1.0,
) -> tuple:  # tokens [k], confidence logits [k] or None (, q [k, V'] when sampling)
    """The reference, greedy or (with `noise`) sampled at `temperature`."""
    prev = (
        anchor if isinstance(anchor, torch.Tensor) else torch.tensor([anchor], device=base.device)
    )
    tokens, conf, probs = [], [], []
    for j in range(base.shape[0]):
        z = F.embedding(prev, w1)
        if conf_w is not None:
            feats = hidden[j : j + 1]
            if conf_w.shape[1] > hidden.shape[1]:
                feats = torch.cat([feats, z], dim=-1)
            conf.append(F.linear(feats.float(), conf_w.float(), conf_b.float())[:, 0])
        logits = base[j : j + 1].float() + F.linear(z, w2).float()
        if noise is None:
            index = logits.argmax(dim=-1)
        else:
            q = (logits / temperature).softmax(dim=-1)
            index = (q / noise[j : j + 1]).argmax(dim=-1)
            probs.append(q)
        prev = index if ids is None else ids[index]
        tokens.append(prev)
    confidence = torch.cat(conf) if conf else None
    if noise is None:
        return torch.cat(tokens), confidence
    return torch.cat(tokens), confidence, torch.cat(probs)


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R: tl.constexpr):
        """base[j, rows] + W2[rows] . z in fp32; -inf past the vocabulary."""
        rk = tl.arange(0, R)
        w2 = tl.load(w2_ptr + rows[:, None] * R + rk[None, :], mask=rm[:, None], other=0.0)
        bias = tl.sum(w2.to(tl.float32) * z[None, :], axis=1)
        logit = tl.load(base_ptr + j * V + rows, mask=rm, other=0.0).to(tl.float32)
        return tl.where(rm, logit + bias, float("-inf"))

    @triton.jit
    def _markov_kernel(
        base_ptr,
        hidden_ptr,
        w1_ptr,
        w2_ptr,
        ids_ptr,
        cw_ptr,
        cb_ptr,
        tokens_ptr,
        conf_ptr,
        anchor_ptr,  # [1] int64: read on the device, so a CUDA graph replays any anchor
        noise_ptr,  # [K, V] Exp(1) (SAMPLE)
        probs_ptr,  # [K, V] out: q_j (SAMPLE)
        inv_t,
        K,
        V,
        H,
        R: tl.constexpr,
        SAMPLE: tl.constexpr,
        HAS_IDS: tl.constexpr,
        HAS_CONF: tl.constexpr,
        CONF_WITH_MARKOV: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        rk = tl.arange(0, R)
        prev = tl.load(anchor_ptr).to(tl.int64)  # one type through the loop (GPU compile)
        for j in range(K):
            z = tl.load(w1_ptr + prev * R + rk).to(tl.float32)  # [R]
            if HAS_CONF:
                acc = tl.load(cb_ptr).to(tl.float32)
                for h0 in range(0, H, BLOCK_H):
                    hc = h0 + tl.arange(0, BLOCK_H)
                    hm = hc < H
                    hv = tl.load(hidden_ptr + j * H + hc, mask=hm, other=0.0).to(tl.float32)
                    wv = tl.load(cw_ptr + hc, mask=hm, other=0.0).to(tl.float32)
                    acc += tl.sum(hv * wv, axis=0)
                if CONF_WITH_MARKOV:
                    acc += tl.sum(z * tl.load(cw_ptr + H + rk).to(tl.float32), axis=0)
                tl.store(conf_ptr + j, acc)
            best = float("-inf")
            best_idx = 0
            m = float("-inf")  # SAMPLE: running max and sum of exp(l / T)
            lsum = 0.0
            for v0 in range(0, V, BLOCK_V):
                rows = v0 + tl.arange(0, BLOCK_V)
                rm = rows < V
                logit = _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R)
                score = logit
                if SAMPLE:
                    scaled = logit * inv_t
                    m_new = tl.maximum(m, tl.max(scaled, axis=0))
                    lsum = lsum * tl.exp(m - m_new) + tl.sum(tl.exp(scaled - m_new), axis=0)
                    m = m_new
                    # the race: argmax q / E = argmax l / T - log E
                    e = tl.load(noise_ptr + j * V + rows, mask=rm, other=1.0)
                    score = tl.where(rm, scaled - tl.log(e), float("-inf"))
                tile_max = tl.max(score, axis=0)
                # first index of the tile's max: the smallest row holding it
                tile_idx = tl.min(tl.where(score == tile_max, rows, V), axis=0)
                better = tile_max > best  # strict: an earlier tile keeps ties (torch's rule)
                best_idx = tl.where(better, tile_idx, best_idx)
                best = tl.where(better, tile_max, best)
            if SAMPLE:  # the proposal the draw came from, for the verifier
                lse = m + tl.log(lsum)
                for v0 in range(0, V, BLOCK_V):
                    rows = v0 + tl.arange(0, BLOCK_V)
                    rm = rows < V
                    logit = _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R)
                    tl.store(probs_ptr + j * V + rows, tl.exp(logit * inv_t - lse), mask=rm)
            if HAS_IDS:
                prev = tl.load(ids_ptr + best_idx).to(tl.int64)
            else:
                prev = best_idx.to(tl.int64)
            tl.store(tokens_ptr + j, prev)

    def markov_greedy_triton(base, hidden, anchor, w1, w2, ids, conf_w, conf_b):
        """Tokens [k] and confidence logits [k] (or None) of the greedy draw."""
        tokens, conf, _ = _launch(base, hidden, anchor, w1, w2, ids, conf_w, conf_b, None, 1.0)
        return tokens, conf

    def markov_sample_triton(base, hidden, anchor, w1, w2, ids, conf_w, conf_b, noise, temperature):
        """Tokens [k], confidence logits [k] (or None) and q [k, V'] of a sampled draw."""
        return _launch(base, hidden, anchor, w1, w2, ids, conf_w, conf_b, noise, temperature)

    def _launch(base, hidden, anchor, w1, w2, ids, conf_w, conf_b, noise, temperature):
        k, v = base.shape
        r, h = w1.shape[1], hidden.shape[1]
        tokens = torch.empty(k, dtype=torch.long, device=base.device)
        conf = torch.empty(k, dtype=torch.float32, device=base.device)
        sample = noise is not None
        probs = torch.empty(k, v, dtype=torch.float32, device=base.device) if sample else conf
        if not isinstance(anchor, torch.Tensor):  # eager callers may pass the id itself
            anchor = torch.tensor([anchor], dtype=torch.long, device=base.device)
        _markov_kernel[(1,)](
            base.contiguous(),
            hidden.contiguous(),
            w1,
            w2.contiguous(),
            tokens if ids is None else ids,
            conf if conf_w is None else conf_w,
            conf if conf_b is None else conf_b,
            tokens,
            conf,
            anchor,
            noise.float().contiguous() if sample else conf,
            probs,
            1.0 / temperature,
            k,
            v,
            h,
            R=r,
            SAMPLE=sample,
            HAS_IDS=ids is not None,
            HAS_CONF=conf_w is not None,
            CONF_WITH_MARKOV=conf_w is not None and conf_w.shape[1] > h,
            BLOCK_V=256,
            BLOCK_H=triton.next_power_of_2(min(h, 1024)),
        )
        return tokens, (None if conf_w is None else conf), (probs if sample else None)
