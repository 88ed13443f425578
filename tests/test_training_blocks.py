"""Training blocks are the inference blocks: layout, targets, and the batched forward."""

from __future__ import annotations

import torch

from specgen.methods.dspark.network import load_dspark
from specgen.models.drafters.dflash import load_dflash
from specgen.models.loading import load_target
from specgen.training.blocks import block_forward, make_blocks

MASK = 99


def test_dflash_and_dspark_layouts():
    ids = torch.arange(10, 20)  # positions 0..9 hold tokens 10..19
    dflash = make_blocks(ids, torch.tensor([2, 7]), block_size=4, mask_token_id=MASK,
                         anchor_first=False)  # fmt: skip
    assert dflash.inputs.tolist() == [[12, MASK, MASK, MASK], [17, MASK, MASK, MASK]]
    assert dflash.targets.tolist() == [[13, 14, 15], [18, 19, -1]]  # slot k -> anchor + k
    dspark = make_blocks(ids, torch.tensor([2, 7]), block_size=3, mask_token_id=MASK,
                         anchor_first=True)  # fmt: skip
    assert dspark.targets.tolist() == [[13, 14, 15], [18, 19, -1]]  # slot k -> anchor + k + 1
    assert dspark.first_slot == 0 and dflash.first_slot == 1


def test_batched_training_forward_equals_the_cached_inference_path(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark
):
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    for net in (
        load_dflash(tiny_dflash, target=target, target_name="t", name="d"),
        load_dspark(tiny_dspark, target=target, target_name="t", name="s").backbone,
    ):
        gen = torch.Generator().manual_seed(0)
        n, b = 20, net.args.block_size
        features = torch.randn(n, 128, generator=gen)
        ids = torch.randint(0, 300, (n,), generator=gen)
        anchors = torch.tensor([3, 9, 15])
        blocks = make_blocks(ids, anchors, block_size=b, mask_token_id=319,
                             anchor_first=False)  # fmt: skip
        embeds = target.embed_tokens(blocks.inputs)
        got = block_forward(net, features, embeds, anchors)
        for i, a in enumerate(anchors.tolist()):
            cache = net.new_cache(32)
            net.extend(cache, features[None, :a])
            want = net.block_hidden(cache, embeds[i : i + 1])[0]
            torch.testing.assert_close(got[i], want, atol=3e-5, rtol=1e-5)


def test_training_forward_has_gradients(tiny_qwen3_deep, tiny_dflash):
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    net = load_dflash(tiny_dflash, target=target, target_name="t", name="d")
    for p in net.parameters():
        p.requires_grad_(True)
    features = torch.randn(12, 128)
    embeds = torch.randn(2, net.args.block_size, 64)
    out = block_forward(net, features, embeds, torch.tensor([4, 8]))
    out.square().mean().backward()
    assert net.fc.grad is not None and net.fc.grad.abs().sum() > 0
    assert all(p.grad is not None for p in net.layers[0].parameters())


def test_sliding_window_layers_match_the_inference_path(tiny_qwen3_deep, tmp_path):
    from support.drafters import save_tiny_dflash

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    path = save_tiny_dflash(tmp_path / "w", target_layer_ids=[1, 3], sliding_window=6,
                            layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    net = load_dflash(path, target=target, target_name="t", name="w")
    features = torch.randn(20, 128, generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([4, 13])
    blocks = make_blocks(torch.arange(20), anchors, block_size=8, mask_token_id=319,
                         anchor_first=False)  # fmt: skip
    embeds = target.embed_tokens(blocks.inputs)
    got = block_forward(net, features, embeds, anchors)
    for i, a in enumerate(anchors.tolist()):
        cache = net.new_cache(32)
        net.extend(cache, features[None, :a])
        want = net.block_hidden(cache, embeds[i : i + 1])[0]
        torch.testing.assert_close(got[i], want, atol=3e-5, rtol=1e-5)
