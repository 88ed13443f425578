"""Our decoder against transformers' own model: logits and tapped hidden states, fp32."""

from __future__ import annotations

import pytest
import torch

from specgen.models.loading import load_target
from support.targets import FAMILIES, TINY_VOCAB, save_tiny


def _reference(hf_model, ids):
    with torch.no_grad():
        out = hf_model(ids, output_hidden_states=True)
    return out.logits, out.hidden_states


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_decode_and_verify_block_match_transformers(tmp_path, family):
    hf = save_tiny(tmp_path, family, seed=1)
    ours = load_target(tmp_path, dtype=torch.float32, device="cpu")
    ids = torch.randint(0, TINY_VOCAB, (1, 13), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_hidden = _reference(hf, ids)

    cache = ours.new_cache(64)
    prefill = ours(ids[:, :7], cache, taps=(0, 1))  # empty cache: plain causal
    decode = ours(ids[:, 7:8], cache)  # one token: sees everything cached
    block = ours(ids[:, 8:13], cache, taps=(0,))  # a verify block: offset causal mask
    logits = torch.cat([prefill.logits, decode.logits, block.logits], dim=1)

    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-5)
    # taps are the outputs of decoder layers: HF hidden_states[id + 1]
    torch.testing.assert_close(prefill.taps[0], ref_hidden[1][:, :7], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(block.taps[0], ref_hidden[1][:, 8:13], atol=2e-5, rtol=1e-5)
    assert cache.length == 13


def test_tied_embeddings_and_llama3_rope(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    hf = save_tiny(tmp_path, "llama", seed=2, tie_word_embeddings=True, rope_parameters=rope)
    ids = torch.randint(0, TINY_VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    ref_logits, _ = _reference(hf, ids)
    ours = load_target(tmp_path, dtype=torch.float32, device="cpu")
    torch.testing.assert_close(
        ours(ids, ours.new_cache(64)).logits, ref_logits, atol=2e-5, rtol=1e-5
    )


def test_num_logits_returns_the_last_positions(tiny_llama):
    ours = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    ids = torch.arange(10).view(1, 10)
    full = ours(ids, ours.new_cache(16)).logits
    last = ours(ids, ours.new_cache(16), num_logits=1).logits
    torch.testing.assert_close(last, full[:, -1:])


def test_batch_of_two_matches_two_single_runs(tiny_llama):
    ours = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    ids = torch.randint(0, TINY_VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    both = ours(ids, ours.new_cache(16, batch=2)).logits
    for row in range(2):
        single = ours(ids[row : row + 1], ours.new_cache(16)).logits
        torch.testing.assert_close(both[row : row + 1], single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_tracks_transformers(tmp_path, family, dtype):
    """In bf16/fp16 we differ from transformers by no more than its own rounding does."""
    hf = save_tiny(tmp_path, family, seed=0)
    ids = torch.randint(0, TINY_VOCAB, (1, 11), generator=torch.Generator().manual_seed(4))
    exact, _ = _reference(hf, ids)
    hf_half, _ = _reference(hf.to(dtype), ids)
    ours = load_target(tmp_path, dtype=dtype, device="cpu")
    got = ours(ids, ours.new_cache(16)).logits.float()
    rounding = (hf_half.float() - exact).abs().max()
    assert (got - hf_half.float()).abs().max() <= 1.5 * rounding + 1e-3
