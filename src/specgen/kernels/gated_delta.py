"""The gated delta rule of Gated DeltaNet ("linear_attention") layers (Qwen3.5, Qwen3-Next).

Per batch row and value head, a state S [dk, dv] (fp32) is carried across tokens:

    S <- S * exp(g_t)                       (g_t <= 0: log decay)
    S <- S + k_t ((v_t - k_t^T S) beta_t)^T (delta rule: write the part S mispredicts)
    o_t = q_t^T S

q and k have Hk heads, v, g and beta Hv (a multiple of Hk): value head h reads q/k head
h // (Hv // Hk). The inputs arrive as the layer prepares them: q and k L2-normalised, q
scaled by dk**-0.5, everything fp32.

Two forms: the token-recurrent one for decode and verify blocks (a few tokens; it can keep
the state after every token, so a speculative decoder can roll back to any of them), and
the chunked (WY) one for prefills. The recurrent form computes each token with the same
ops whatever T is, so the state after token t does not depend on how the tokens were
batched into calls: a verified block leaves exactly the states token-by-token decoding would.
The Triton kernel keeps a [dk, BLOCK_V] tile of the state in registers for the whole
block; on CUDA, prefills use fla's chunk kernel when fla-core is installed.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from specgen.kernels import backend, triton_wanted


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[..., Hk, d] -> [..., Hv, d]: value head h reads q/k head h // (Hv // Hk)."""
    hk = x.shape[-2]
    return x if hk == hv else x.repeat_interleave(hv // hk, dim=-2)


def gated_delta_recurrent_torch(
    q: torch.Tensor,  # [B, T, Hk, dk] normalised and scaled
    k: torch.Tensor,  # [B, T, Hk, dk] normalised
    v: torch.Tensor,  # [B, T, Hv, dv]
    g: torch.Tensor,  # [B, T, Hv] log decay
    beta: torch.Tensor,  # [B, T, Hv]
    state: torch.Tensor,  # [B, Hv, dk, dv] before token 0 (read only)
    keep: torch.Tensor | None = None,  # [B, T, Hv, dk, dv] <- the state after each token
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, T, Hv, dv], final state [B, Hv, dk, dv]
    """Token by token. Every token runs the same ops on contiguous per-token tensors, so
    results do not depend on T or on `keep` (bitwise)."""
    hv = v.shape[2]
    q, k = _expand_heads(q, hv), _expand_heads(k, hv)
    out = v.new_empty(v.shape)
    s = state
    for t in range(v.shape[1]):
        qt, kt = q[:, t].contiguous(), k[:, t].contiguous()  # [B, Hv, dk]
        s = s * g[:, t].exp()[..., None, None]
        kv = (kt.unsqueeze(-2) @ s).squeeze(-2)  # [B, Hv, dv]
        delta = (v[:, t] - kv) * beta[:, t, :, None]
        update = kt.unsqueeze(-1) * delta.unsqueeze(-2)
        # written straight into `keep` when there is one: the same sum, no extra copy
        s = s + update if keep is None else torch.add(s, update, out=keep[:, t])
        out[:, t] = (qt.unsqueeze(-2) @ s).squeeze(-2)
    if keep is not None:
        return out, keep[:, -1]
    return out, s if s is not state else state.clone()


def gated_delta_chunked_torch(
    q: torch.Tensor,  # [B, T, Hk, dk] normalised and scaled
    k: torch.Tensor,  # [B, T, Hk, dk] normalised
    v: torch.Tensor,  # [B, T, Hv, dv]
    g: torch.Tensor,  # [B, T, Hv] log decay
    beta: torch.Tensor,  # [B, T, Hv]
    state: torch.Tensor,  # [B, Hv, dk, dv] before token 0 (read only)
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, T, Hv, dv], final state [B, Hv, dk, dv]
    """Chunk by chunk, in matmuls. Within a chunk, with c_i the cumulative log decay from the
    chunk start and D[i, j] = exp(c_i - c_j) for j <= i (0 above), the values written to
    the state, u = beta (v - decayed k^T S), solve the unit lower-triangular system

        (I + A) u = beta v - (beta exp(c) k) S0,   A[i, j] = beta_i D[i, j] k_i.k_j  (j < i)

    and then o = (exp(c) q) S0 + (D * q k^T) u, S = exp(c_last) S0 + (exp(c_last - c) k)^T u.
    Only [chunk, chunk] matrices are formed, one chunk at a time."""
    bsz, seq, hv, dv = v.shape
    out = v.new_empty(bsz, hv, seq, dv)
    s = state
    above = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        qc, kc = (_expand_heads(x[:, start:end], hv).transpose(1, 2) for x in (q, k))
        vc = v[:, start:end].transpose(1, 2)  # [B, Hv, c, dv]
        bc = beta[:, start:end].transpose(1, 2).unsqueeze(-1)  # [B, Hv, c, 1]
        cum = g[:, start:end].transpose(1, 2).cumsum(-1)  # [B, Hv, c]
        n = end - start
        decay = cum[..., :, None] - cum[..., None, :]  # [B, Hv, c, c]
        decay = decay.masked_fill(above[:n, :n], float("-inf")).exp()
        kb = kc * bc
        system = (kb @ kc.transpose(-1, -2)) * decay  # only its strict lower part is read
        rhs = torch.cat((vc * bc, kb * cum.exp().unsqueeze(-1)), dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u = solved[..., :dv] - solved[..., dv:] @ s  # [B, Hv, c, dv]
        attn = (qc @ kc.transpose(-1, -2)) * decay
        out[:, :, start:end] = (qc * cum.exp().unsqueeze(-1)) @ s + attn @ u
        last = cum[..., -1:]  # [B, Hv, 1]
        k_to_end = kc * (last - cum).exp().unsqueeze(-1)
        s = s * last.exp().unsqueeze(-1) + k_to_end.transpose(-1, -2) @ u
    return out.transpose(1, 2).contiguous(), s if s is not state else state.clone()


def _pow2(n: int) -> bool:
    return n >= 2 and n & (n - 1) == 0


def gated_delta_recurrent(q, k, v, g, beta, state, keep=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch: Triton on CUDA with the Triton backend, else the torch form."""
    if (
        v.is_cuda
        and backend() == "triton"
        and _pow2(k.shape[-1])
        and _pow2(v.shape[-1])
        and (keep is None or keep.is_contiguous())
    ):
        return gated_delta_recurrent_triton(q, k, v, g, beta, state, keep)
    return gated_delta_recurrent_torch(q, k, v, g, beta, state, keep)


Tape = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def gated_delta_replay(
    q: torch.Tensor,  # [B, T, Hk, dk] normalised and scaled: the block's tokens
    k: torch.Tensor,  # [B, T, Hk, dk] normalised
    v: torch.Tensor,  # [B, T, Hv, dv]
    g: torch.Tensor,  # [B, T, Hv] log decay
    beta: torch.Tensor,  # [B, T, Hv]
    state: torch.Tensor,  # [B, Hv, dk, dv] fp32 (read only): the state before the tape
    tape: Tape,  # (q, k, v, g, beta) [B, n_max, ...]: tokens between `state` and the block
    replay: int | torch.Tensor,  # tape tokens to run first: a host int, or [1] on the device
    start: torch.Tensor,  # [B, Hv, dk, dv] fp32: receives the state the block starts from
) -> torch.Tensor:  # out [B, T, Hv, dv]
    """The recurrent form over a block after first replaying `replay` tokens of a tape of
    earlier inputs: how a hybrid cache rolls back (models/cache/hybrid.py). It keeps the
    state before a step and the step's inputs; the next step replays the committed ones.
    The replayed tokens run the same ops as when they were first computed, so the state is
    bitwise the one token-by-token decoding reaches. A device-resident `replay` (CUDA
    graphs) runs the whole tape with the tokens past `replay` made identities (decay 1,
    beta 0: exactly no change), keeping every shape fixed."""
    if v.is_cuda and backend() == "triton" and _pow2(k.shape[-1]) and _pow2(v.shape[-1]):
        return gated_delta_replay_triton(q, k, v, g, beta, state, tape, replay, start)
    return gated_delta_replay_torch(q, k, v, g, beta, state, tape, replay, start)


def gated_delta_replay_torch(q, k, v, g, beta, state, tape, replay, start) -> torch.Tensor:
    """`gated_delta_replay` in torch (the reference)."""
    start.copy_(replay_tape(state, tape, replay))
    return gated_delta_recurrent_torch(q, k, v, g, beta, start)[0]


def replay_tape(state: torch.Tensor, tape: Tape, replay: int | torch.Tensor) -> torch.Tensor:
    """The state after the first `replay` tokens of `tape`, from `state` ([B, Hv, dk, dv])."""
    tq, tk, tv, tg, tb = tape
    if isinstance(replay, torch.Tensor):  # fixed shapes: the rest of the tape changes nothing
        run = torch.arange(tg.shape[1], device=tg.device)[None, :, None] < replay
        tg, tb = tg * run, tb * run  # decay exp(0) = 1 and beta 0: the state stays bitwise
        return gated_delta_recurrent_torch(tq, tk, tv, tg, tb, state)[1]
    if replay == 0:
        return state
    n = slice(0, replay)
    return gated_delta_recurrent_torch(tq[:, n], tk[:, n], tv[:, n], tg[:, n], tb[:, n], state)[1]


@functools.cache
def _fla_chunk():
    """fla's chunk_gated_delta_rule and whether it maps value heads to q/k heads itself
    (the 0.6 kernels do; older ones get q/k repeated), or None without fla-core."""
    if importlib.util.find_spec("fla") is None:
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        native_gva = tuple(int(p) for p in version("fla-core").split(".")[:2]) >= (0, 6)
    except (PackageNotFoundError, ValueError):
        native_gva = False  # repeating q/k is right for every version
    return chunk_gated_delta_rule, native_gva


def gated_delta_chunked(q, k, v, g, beta, state) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch for prefills: on CUDA, fla's chunk_gated_delta_rule when the optional
    fla-core is importable, else the torch chunked form."""
    fla = _fla_chunk() if v.is_cuda else None
    if fla is None:
        return gated_delta_chunked_torch(q, k, v, g, beta, state)
    chunk_gated_delta_rule, native_gva = fla
    if not native_gva:
        q, k = _expand_heads(q, v.shape[2]), _expand_heads(k, v.shape[2])
    return chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=1.0,  # q arrives scaled
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,  # q and k arrive normalised
    )


if triton_wanted():
    import triton
    import triton.language as tl

    # T unspecialised: T=1 and T=5 run the same compiled code, token for token
    @triton.jit(do_not_specialize=["T"])
    def _gated_delta_recurrent_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        g_ptr,
        beta_ptr,
        state_ptr,
        out_ptr,
        states_ptr,  # the state after each token (KEEP), else the final state
        T,
        HK,
        HV,
        DK: tl.constexpr,
        DV: tl.constexpr,
        BLOCK_V: tl.constexpr,
        KEEP: tl.constexpr,
    ):
        bh = tl.program_id(0).to(tl.int64)  # one (batch row, value head) per program row
        b, h = bh // HV, bh % HV
        hk = h // (HV // HK)
        offs_k = tl.arange(0, DK)
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        tile = offs_k[:, None] * DV + offs_v[None, :]  # [DK, BLOCK_V]
        s = tl.load(state_ptr + bh * DK * DV + tile).to(tl.float32)
        for t in range(T):
            row = b * T + t
            qt = tl.load(q_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            kt = tl.load(k_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            vt = tl.load(v_ptr + (row * HV + h) * DV + offs_v).to(tl.float32)
            gt = tl.load(g_ptr + row * HV + h).to(tl.float32)
            bt = tl.load(beta_ptr + row * HV + h).to(tl.float32)
            s = s * tl.exp(gt)
            kv = tl.sum(s * kt[:, None], axis=0)  # [BLOCK_V]
            delta = (vt - kv) * bt
            s = s + kt[:, None] * delta[None, :]
            tl.store(out_ptr + (row * HV + h) * DV + offs_v, tl.sum(s * qt[:, None], axis=0))
            if KEEP:
                tl.store(states_ptr + (row * HV + h) * DK * DV + tile, s)
        if not KEEP:
            tl.store(states_ptr + bh * DK * DV + tile, s)

    @triton.jit(do_not_specialize=["T", "N"])
    def _gated_delta_replay_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        g_ptr,
        beta_ptr,
        state_ptr,  # [B, HV, DK, DV]: before the tape
        tq_ptr,  # the tape: [B, N, ...] each
        tk_ptr,
        tv_ptr,
        tg_ptr,
        tb_ptr,
        replay_ptr,  # [1]: tape tokens to run
        start_ptr,  # [B, HV, DK, DV]: receives the state after them
        out_ptr,
        T,
        N,
        HK,
        HV,
        DK: tl.constexpr,
        DV: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // HV, bh % HV
        hk = h // (HV // HK)
        offs_k = tl.arange(0, DK)
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        tile = offs_k[:, None] * DV + offs_v[None, :]
        s = tl.load(state_ptr + bh * DK * DV + tile).to(tl.float32)
        replay = tl.load(replay_ptr)
        for t in range(replay):  # the committed tokens of the tape: the state only
            row = b * N + t
            kt = tl.load(tk_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            vt = tl.load(tv_ptr + (row * HV + h) * DV + offs_v).to(tl.float32)
            s = s * tl.exp(tl.load(tg_ptr + row * HV + h).to(tl.float32))
            delta = (vt - tl.sum(s * kt[:, None], axis=0)) * tl.load(tb_ptr + row * HV + h)
            s = s + kt[:, None] * delta[None, :]
        tl.store(start_ptr + bh * DK * DV + tile, s)
        for t in range(T):  # the block: outputs
            row = b * T + t
            qt = tl.load(q_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            kt = tl.load(k_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            vt = tl.load(v_ptr + (row * HV + h) * DV + offs_v).to(tl.float32)
            s = s * tl.exp(tl.load(g_ptr + row * HV + h).to(tl.float32))
            delta = (vt - tl.sum(s * kt[:, None], axis=0)) * tl.load(beta_ptr + row * HV + h)
            s = s + kt[:, None] * delta[None, :]
            tl.store(out_ptr + (row * HV + h) * DV + offs_v, tl.sum(s * qt[:, None], axis=0))

    def gated_delta_replay_triton(q, k, v, g, beta, state, tape, replay, start) -> torch.Tensor:
        """`gated_delta_replay` in one kernel: the state stays in registers through the
        replayed tape and the block; only the block's start state is written back."""
        bsz, seq, hv, dv = v.shape
        hk, dk = k.shape[2], k.shape[3]
        assert start.is_contiguous() and state.is_contiguous()
        if not isinstance(replay, torch.Tensor):
            replay = torch.full((1,), replay, dtype=torch.int64, device=v.device)
        out = v.new_empty(bsz, seq, hv, dv, dtype=torch.float32)
        tq, tk, tv, tg, tb = (x.contiguous() for x in tape)
        block_v = min(dv, 32)
        _gated_delta_replay_kernel[(bsz * hv, dv // block_v)](
            q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
            state, tq, tk, tv, tg, tb, replay, start, out, seq, tg.shape[1], hk, hv,
            DK=dk, DV=dv, BLOCK_V=block_v,
        )  # fmt: skip
        return out

    def gated_delta_recurrent_triton(
        q: torch.Tensor,  # [B, T, Hk, dk] normalised and scaled
        k: torch.Tensor,  # [B, T, Hk, dk] normalised
        v: torch.Tensor,  # [B, T, Hv, dv]
        g: torch.Tensor,  # [B, T, Hv] log decay
        beta: torch.Tensor,  # [B, T, Hv]
        state: torch.Tensor,  # [B, Hv, dk, dv] before token 0 (read only)
        keep: torch.Tensor | None = None,  # [B, T, Hv, dk, dv], contiguous
    ) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, T, Hv, dv], final state [B, Hv, dk, dv]
        bsz, seq, hv, dv = v.shape
        hk, dk = k.shape[2], k.shape[3]
        assert keep is None or keep.is_contiguous(), "keep must be contiguous"
        out = v.new_empty(bsz, seq, hv, dv, dtype=torch.float32)
        states = keep if keep is not None else v.new_empty(bsz, hv, dk, dv, dtype=torch.float32)
        block_v = min(dv, 32)
        _gated_delta_recurrent_kernel[(bsz * hv, dv // block_v)](
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            g.contiguous(),
            beta.contiguous(),
            state.contiguous(),
            out,
            states,
            seq,
            hk,
            hv,
            DK=dk,
            DV=dv,
            BLOCK_V=block_v,
            KEEP=keep is not None,
        )
        return out, states if keep is None else keep[:, -1]
