"""DSpark's left-to-right Markov-head draw for one block, in one kernel launch.

For slots j = 1..k (vanilla Markov head, rank r; optional draft vocabulary `ids`):

    z_j    = W1[prev_j]                                  (prev_1 = the anchor)
    c_j    = conf_w . [h_j ; z_j] + conf_b               (before token j is drawn; optional)
    l_j    = base[j] + W2 z_j                            (logits over the draft vocabulary)
    x_j    = argmax_v l_j[v]                             (greedy: first index among maxima)
           | argmax_v q_j[v] / E_j[v], q_j = softmax(l_j / T)   (sampled: an exponential
             race over Exp(1) noise E drawn beforehand; q_j is written out for the verifier)
    prev_{j+1} = ids[x_j] (or x_j without a draft vocabulary)

Eager torch launches ~6 small ops per slot. The kernels take two launches per slot, both
fixed-shape (so a CUDA graph replays the chain): `_partials` spreads the slot's vocabulary
over many programs, each streaming a tile of W2 rows and leaving its tile's best score
(and, sampling, its max and sum of exp(l / T)); `_pick` reduces those in one program,
writes the token (which the next slot's launch reads on the device) and the confidence.
Sampling adds one launch at the end that writes every slot's q. W2 is read once per slot
at the whole GPU's bandwidth (a one-program form would stream it through a single SM).
The sampled form covers temperature alone; top-k / top-p filtering stays in torch (a
graph-captured loop), as do gated and rnn heads. The confidence comes back as logits so
the caller applies its calibration and sigmoid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.kernels import triton_wanted


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


if triton_wanted():
    import triton
    import triton.language as tl

    # Elements of W2 per program (rows x rank): ~32 KB of bf16, enough programs to fill the
    # GPU at large vocabularies, few enough registers per program at rank 256.
    TILE_ELEMENTS = 16384

    @triton.jit
    def _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R: tl.constexpr):
        """base[j, rows] + W2[rows] . z in fp32; -inf past the vocabulary."""
        rk = tl.arange(0, R)
        w2 = tl.load(w2_ptr + rows[:, None] * R + rk[None, :], mask=rm[:, None], other=0.0)
        bias = tl.sum(w2.to(tl.float32) * z[None, :], axis=1)
        logit = tl.load(base_ptr + j * V + rows, mask=rm, other=0.0).to(tl.float32)
        return tl.where(rm, logit + bias, float("-inf"))

    @triton.jit
    def _prev_z(anchor_ptr, tokens_ptr, w1_ptr, j, R: tl.constexpr):
        """z_j = W1[prev_j]: the anchor for slot 0, else the token slot j - 1 drew (read on
        the device, so a CUDA graph replays any anchor and any draw)."""
        before = tl.load(tokens_ptr + tl.maximum(j - 1, 0))
        prev = tl.where(j == 0, tl.load(anchor_ptr), before).to(tl.int64)
        return tl.load(w1_ptr + prev * R + tl.arange(0, R)).to(tl.float32)

    @triton.jit
    def _partials(
        base_ptr,
        w1_ptr,
        w2_ptr,
        anchor_ptr,
        tokens_ptr,
        noise_ptr,  # [K, V] Exp(1) (SAMPLE)
        best_ptr,  # [T] out: the tile's best score
        index_ptr,  # [T] out: its first row holding it
        tmax_ptr,  # [T] out (SAMPLE): max of l / T over the tile
        tsum_ptr,  # [T] out (SAMPLE): sum of exp(l / T - max)
        j,
        V,
        inv_t,
        R: tl.constexpr,
        SAMPLE: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        tile = tl.program_id(0)
        z = _prev_z(anchor_ptr, tokens_ptr, w1_ptr, j, R)
        rows = tile * BLOCK_V + tl.arange(0, BLOCK_V)
        rm = rows < V
        score = _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R)
        if SAMPLE:
            scaled = score * inv_t
            top = tl.max(scaled, axis=0)
            tl.store(tmax_ptr + tile, top)
            tl.store(tsum_ptr + tile, tl.sum(tl.exp(scaled - top), axis=0))
            # the race: argmax q / E = argmax l / T - log E
            e = tl.load(noise_ptr + j * V + rows, mask=rm, other=1.0)
            score = tl.where(rm, scaled - tl.log(e), float("-inf"))
        best = tl.max(score, axis=0)
        tl.store(best_ptr + tile, best)
        # first index of the tile's best: the smallest row holding it (torch's rule)
        tl.store(index_ptr + tile, tl.min(tl.where(score == best, rows, V), axis=0))

    @triton.jit
    def _pick(
        hidden_ptr,
        w1_ptr,
        ids_ptr,
        cw_ptr,
        cb_ptr,
        anchor_ptr,
        tokens_ptr,  # [K] out: slot j's token
        conf_ptr,  # [K] out: slot j's confidence logit
        lse_ptr,  # [K] out (SAMPLE): log-sum-exp of l / T
        best_ptr,
        index_ptr,
        tmax_ptr,
        tsum_ptr,
        j,
        T,
        V,
        H,
        R: tl.constexpr,
        SAMPLE: tl.constexpr,
        HAS_IDS: tl.constexpr,
        HAS_CONF: tl.constexpr,
        CONF_WITH_MARKOV: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        z = _prev_z(anchor_ptr, tokens_ptr, w1_ptr, j, R)
        if HAS_CONF:  # c_j: before token j is drawn
            acc = tl.load(cb_ptr).to(tl.float32)
            for h0 in range(0, H, BLOCK_H):
                hc = h0 + tl.arange(0, BLOCK_H)
                hm = hc < H
                hv = tl.load(hidden_ptr + j * H + hc, mask=hm, other=0.0).to(tl.float32)
                wv = tl.load(cw_ptr + hc, mask=hm, other=0.0).to(tl.float32)
                acc += tl.sum(hv * wv, axis=0)
            if CONF_WITH_MARKOV:
                acc += tl.sum(z * tl.load(cw_ptr + H + tl.arange(0, R)).to(tl.float32), axis=0)
            tl.store(conf_ptr + j, acc)
        best = float("-inf")
        best_idx = V
        m = float("-inf")
        lsum = 0.0
        for t0 in range(0, T, BLOCK_T):
            tt = t0 + tl.arange(0, BLOCK_T)
            tm = tt < T
            score = tl.load(best_ptr + tt, mask=tm, other=float("-inf"))
            chunk_best = tl.max(score, axis=0)
            index = tl.load(index_ptr + tt, mask=tm, other=V)
            chunk_idx = tl.min(tl.where(score == chunk_best, index, V), axis=0)
            better = chunk_best > best  # strict: an earlier tile keeps ties
            best_idx = tl.where(better, chunk_idx, best_idx)
            best = tl.where(better, chunk_best, best)
            if SAMPLE:
                tops = tl.load(tmax_ptr + tt, mask=tm, other=float("-inf"))
                sums = tl.load(tsum_ptr + tt, mask=tm, other=0.0)
                m_new = tl.maximum(m, tl.max(tops, axis=0))
                lsum = lsum * tl.exp(m - m_new) + tl.sum(sums * tl.exp(tops - m_new), axis=0)
                m = m_new
        if SAMPLE:
            tl.store(lse_ptr + j, m + tl.log(lsum))
        if HAS_IDS:
            token = tl.load(ids_ptr + best_idx).to(tl.int64)
        else:
            token = best_idx.to(tl.int64)
        tl.store(tokens_ptr + j, token)

    @triton.jit
    def _probs(
        base_ptr,
        w1_ptr,
        w2_ptr,
        anchor_ptr,
        tokens_ptr,
        lse_ptr,
        probs_ptr,  # [K, V] out: q_j, the proposal each draw came from (for the verifier)
        V,
        inv_t,
        R: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        j = tl.program_id(0)
        tile = tl.program_id(1)
        z = _prev_z(anchor_ptr, tokens_ptr, w1_ptr, j, R)
        rows = tile * BLOCK_V + tl.arange(0, BLOCK_V)
        rm = rows < V
        logit = _slot_logits(base_ptr, w2_ptr, z, j, rows, rm, V, R)
        lse = tl.load(lse_ptr + j)
        tl.store(probs_ptr + j * V + rows, tl.exp(logit * inv_t - lse), mask=rm)

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
        device = base.device
        block_v = max(16, min(1024, triton.next_power_of_2(max(TILE_ELEMENTS // r, 1))))
        tiles = triton.cdiv(v, block_v)
        tokens = torch.empty(k, dtype=torch.long, device=device)
        conf = torch.empty(k, dtype=torch.float32, device=device)
        best = torch.empty(tiles, dtype=torch.float32, device=device)
        index = torch.empty(tiles, dtype=torch.int32, device=device)
        sample = noise is not None
        tmax = torch.empty(tiles, dtype=torch.float32, device=device) if sample else best
        tsum = torch.empty(tiles, dtype=torch.float32, device=device) if sample else best
        lse = torch.empty(k, dtype=torch.float32, device=device) if sample else conf
        if not isinstance(anchor, torch.Tensor):  # eager callers may pass the id itself
            anchor = torch.tensor([anchor], dtype=torch.long, device=device)
        base, hidden, w2 = base.contiguous(), hidden.contiguous(), w2.contiguous()
        noise = noise.float().contiguous() if sample else conf
        inv_t = 1.0 / temperature
        for j in range(k):  # the chain: slot j's launches read slot j - 1's token
            _partials[(tiles,)](
                base, w1, w2, anchor, tokens, noise, best, index, tmax, tsum, j, v, inv_t,
                R=r, SAMPLE=sample, BLOCK_V=block_v,
            )  # fmt: skip
            _pick[(1,)](
                hidden,
                w1,
                tokens if ids is None else ids,
                conf if conf_w is None else conf_w,
                conf if conf_b is None else conf_b,
                anchor,
                tokens,
                conf,
                lse,
                best,
                index,
                tmax,
                tsum,
                j,
                tiles,
                v,
                h,
                R=r,
                SAMPLE=sample,
                HAS_IDS=ids is not None,
                HAS_CONF=conf_w is not None,
                CONF_WITH_MARKOV=conf_w is not None and conf_w.shape[1] > h,
                BLOCK_T=min(1024, triton.next_power_of_2(tiles)),
                BLOCK_H=triton.next_power_of_2(min(h, 1024)),
            )
        probs = None
        if sample:
            probs = torch.empty(k, v, dtype=torch.float32, device=device)
            _probs[(k, tiles)](
                base, w1, w2, anchor, tokens, lse, probs, v, inv_t, R=r, BLOCK_V=block_v
            )
        return tokens, (None if conf_w is None else conf), probs
