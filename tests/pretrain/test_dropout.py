"""Packed-bits dropout: the rate, the scaling, the gradient, the seed, and the swap in the loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pretrain.dropout import (LANES, PackedBitsDropout, effective_probability, keep_mask, packed_dropout)
from pretrain.train import TrainConfig, train


@pytest.mark.parametrize("p", [0.1, 0.5, 0.02])
def test_every_lane_keeps_at_the_rate(p):
    # each 64-bit word decides four elements; a biased bit (say the sign bit of a word drawn
    # from [0, 2^63)) would show in one lane's rate
    torch.manual_seed(0)
    mask = keep_mask(torch.Size([LANES * 100_000]), p, torch.device("cpu"))
    lanes = mask.view(-1, LANES).float().mean(0)
    assert torch.allclose(lanes, torch.full((LANES,), 1 - effective_probability(p)), atol=0.006), lanes


def test_lanes_are_independent():
    torch.manual_seed(1)
    keep = keep_mask(torch.Size([LANES * 200_000]), 0.5, torch.device("cpu")).view(-1, LANES).float()
    correlation = torch.corrcoef(keep.T)
    off_diagonal = correlation[~torch.eye(LANES, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 0.01, correlation


def test_the_threshold_gives_the_asked_rate_to_1_in_65536():
    assert effective_probability(0.1) == pytest.approx(0.1, abs=1 / 65536)
    assert effective_probability(0.0) == 0.0


def test_output_keeps_the_expectation_and_the_gradient_is_the_mask():
    torch.manual_seed(2)
    x = torch.ones(63, 33, 47, requires_grad=True)      # an element count not a multiple of 4
    y = PackedBitsDropout(0.1).train()(x)
    scale = 1 / (1 - effective_probability(0.1))
    values = torch.unique(y).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())               # d(sum)/dx = keep * scale


def test_eval_mode_and_zero_rate_pass_the_input_through():
    x = torch.randn(4, 5)
    assert PackedBitsDropout(0.1).eval()(x) is x
    assert PackedBitsDropout(0.0).train()(x) is x


def test_the_seed_decides_the_masks():
    drop, x = PackedBitsDropout(0.3).train(), torch.ones(1000)
    torch.manual_seed(5)
    first = drop(x)
    torch.manual_seed(5)
    assert torch.equal(drop(x), first)
    assert not torch.equal(drop(x), first)               # the generator moved on


def test_a_rate_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="outside"):
        PackedBitsDropout(1.0)


def test_the_swap_covers_every_dropout_and_puts_the_originals_back(make_tiny_bert):
    model = make_tiny_bert()
    originals = {name: m for name, m in model.named_modules() if type(m) is nn.Dropout}
    assert originals
    with pytest.raises(RuntimeError, match="inside"):
        with packed_dropout(model) as swapped:
            inside = {name: m for name, m in model.named_modules() if name in originals}
            assert swapped == len(originals)
            assert all(isinstance(m, PackedBitsDropout) and m.p == originals[name].p for name, m in inside.items())
            raise RuntimeError("inside")
    assert {name: m for name, m in model.named_modules() if type(m) is nn.Dropout} == originals


def test_train_uses_packed_masks_by_default_and_torchs_when_asked(make_tiny_bert, tokenizer):
    from pretrain.batching import encode
    from pretrain.data import Split
    data = encode(tokenizer, Split(["an apple", "an engine"] * 8, [1, 0] * 8))
    for masks, kind in (("packed", PackedBitsDropout), ("torch", nn.Dropout)):
        model, seen = make_tiny_bert(), []

        def loss_fn(m, batch):
            seen.append({type(d) for d in m.modules() if isinstance(d, (nn.Dropout, PackedBitsDropout))})
            return torch.nn.functional.cross_entropy(m(**batch).logits, batch["labels"])
        train(model, data, TrainConfig(batch_size=8, dropout_masks=masks), loss_fn=loss_fn, show_progress=False)
        assert seen and all(s == {kind} for s in seen), (masks, seen)
        assert {type(d) for d in model.modules() if isinstance(d, (nn.Dropout, PackedBitsDropout))} == {nn.Dropout}


class AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen ops a block runs."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def toy_batch(tokenizer) -> dict:
    batch = tokenizer(["an apple near the old road", "an engine"], padding=True, return_tensors="pt")
    return {**batch, "labels": torch.tensor([1, 0])}


def test_inside_the_block_no_mask_comes_from_torchs_dropout(make_tiny_bert, tokenizer):
    # SDPA draws its attention-probability masks inside the kernel: without the eager
    # forward, aten.bernoulli_ (or native_dropout) would still run in every layer
    model = make_tiny_bert().train()
    assert model.config._attn_implementation == "sdpa"
    batch = toy_batch(tokenizer)
    with AtenOps() as outside:
        model(**batch).loss.backward()
    assert outside.ops & {"aten.bernoulli_", "aten.native_dropout", "aten.dropout"}
    with packed_dropout(model), AtenOps() as inside:
        model(**batch).loss.backward()
    assert not inside.ops & {"aten.bernoulli_", "aten.native_dropout", "aten.dropout"}, inside.ops
    assert "aten.random_" in inside.ops


def test_the_eager_attention_gives_sdpas_logits_and_gradients_and_goes_away(make_tiny_bert, tokenizer):
    model = make_tiny_bert().eval()          # no dropout: the two forwards must agree
    batch = toy_batch(tokenizer)

    def logits_and_grads():
        model.zero_grad()
        out = model(**batch)
        out.loss.backward()
        return out.logits.detach(), [p.grad.clone() for p in model.parameters()]
    sdpa_logits, sdpa_grads = logits_and_grads()
    attention = [m for m in model.modules() if type(m).__name__ == "BertSdpaSelfAttention"]
    assert attention
    with packed_dropout(model):
        assert all("forward" in vars(m) for m in attention)
        eager_logits, eager_grads = logits_and_grads()
    assert not any("forward" in vars(m) for m in attention)
    assert torch.allclose(sdpa_logits, eager_logits, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(sdpa_grads, eager_grads))


def test_attention_whose_eager_form_takes_another_mask_keeps_sdpa(tokenizer):
    from transformers import DistilBertForSequenceClassification

    from pretrain.dropout import eager_forward
    from tests.conftest import tiny_distilbert_config
    model = DistilBertForSequenceClassification(tiny_distilbert_config(("a", "b"), len(tokenizer))).train()
    assert not any(eager_forward(m) for m in model.modules())
    batch = toy_batch(tokenizer)
    batch.pop("token_type_ids", None)
    with packed_dropout(model) as swapped:
        assert swapped and torch.isfinite(model(**batch).loss)
