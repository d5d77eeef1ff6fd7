"""Packed-bits dropout: the rate, the scaling, the gradient, the seed, and the swap in the loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pretrain.dropout import (LANES, effective_probability, keep_mask, packed_bits_dropout, packed_dropout, packs)
from pretrain.objectives import ModelSize
from pretrain.train import TrainConfig, train

TINY_DECODER = ModelSize(layers=1, hidden=32, heads=2, intermediate=64)


@pytest.fixture(scope="module")
def wordnet_docs(tokenizer):
    from pretrain.data.stream import ChunkStream
    return ChunkStream("wordnet", tokenizer, 64, buffer_size=1, seed=0).take(8)


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


def packed_out(x: torch.Tensor, p: float, train: bool = True) -> torch.Tensor:
    drop = nn.Dropout(p).train(train)
    with packed_dropout(drop):
        return drop(x)


def test_output_keeps_the_expectation_and_the_gradient_is_the_mask():
    torch.manual_seed(2)
    x = torch.ones(63, 33, 47, requires_grad=True)      # an element count not a multiple of 4
    y = packed_out(x, 0.1)
    scale = 1 / (1 - effective_probability(0.1))
    values = torch.unique(y).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())               # d(sum)/dx = keep * scale


def test_eval_mode_passes_the_input_through():
    x = torch.randn(4, 5)
    assert packed_out(x, 0.1, train=False) is x


def test_the_seed_decides_the_masks():
    x = torch.ones(1000)
    torch.manual_seed(5)
    first = packed_bits_dropout(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(packed_bits_dropout(x, 0.3), first)
    assert not torch.equal(packed_bits_dropout(x, 0.3), first)      # the generator moved on


@pytest.mark.parametrize("p", [0.0, 1e-6, 1 - 1e-6, 1.0])
def test_rates_without_a_packed_form_keep_torchs_dropout(p):
    # 1e-6 rounds to 0 in 1/65536 steps and 1 - 1e-6 to 1, whose scale would divide by zero
    assert not packs(p)
    drop = nn.Dropout(p)
    with packed_dropout(drop) as swapped:
        assert swapped == 0 and "forward" not in vars(drop)


def test_the_swap_covers_every_dropout_keeps_the_modules_and_puts_torchs_forward_back(make_tiny_bert):
    model = make_tiny_bert()
    originals = {name: m for name, m in model.named_modules() if type(m) is nn.Dropout}
    assert originals
    with pytest.raises(RuntimeError, match="inside"):
        with packed_dropout(model) as swapped:
            assert swapped == len(originals)
            assert {name: m for name, m in model.named_modules() if type(m) is nn.Dropout} == originals
            assert all("forward" in vars(m) for m in originals.values())
            raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in model.modules())


def test_hooks_on_dropout_modules_keep_running_inside(make_tiny_bert, tokenizer):
    # the adapters strategy hangs its bottlenecks on the sublayers' dropout modules as hooks
    model = make_tiny_bert().train()
    calls = []
    target = model.bert.encoder.layer[0].output.dropout
    target.register_forward_hook(lambda module, args, out: calls.append(module))
    with packed_dropout(model):
        model(**toy_batch(tokenizer))
    assert calls == [target]


def test_adapters_train_under_packed_masks(make_tiny_bert, tokenizer):
    from pretrain.batching import encode
    from pretrain.data import Split
    from pretrain.strategies import add_adapters
    model = make_tiny_bert()
    add_adapters(model, bottleneck=4)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "adapter" in n}
    assert adapters
    data = encode(tokenizer, Split(["an apple", "an engine"] * 8, [1, 0] * 8))
    train(model, data, TrainConfig(batch_size=8, lr=1e-2, dropout_masks="packed"), show_progress=False)
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[n].detach(), before) for n, before in adapters.items())


def test_train_uses_packed_masks_by_default_and_torchs_when_asked(make_tiny_bert, tokenizer):
    from pretrain.batching import encode
    from pretrain.data import Split
    data = encode(tokenizer, Split(["an apple", "an engine"] * 8, [1, 0] * 8))
    for masks, packed_inside in (("packed", True), ("torch", False)):
        model, seen = make_tiny_bert(), []

        def loss_fn(m, batch):
            seen.append({"forward" in vars(d) for d in m.modules() if type(d) is nn.Dropout})
            return torch.nn.functional.cross_entropy(m(**batch).logits, batch["labels"])
        train(model, data, TrainConfig(batch_size=8, dropout_masks=masks), loss_fn=loss_fn, show_progress=False)
        assert seen and all(s == {packed_inside} for s in seen), (masks, seen)
        assert not any("forward" in vars(d) for d in model.modules())


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


def test_a_decoders_attention_stays_causal(tokenizer, wordnet_docs):
    # SDPA makes a BERT decoder causal through is_causal when the mask is None (no padding);
    # the eager form has no such flag, so decoders keep SDPA
    import numpy as np

    from pretrain.objectives import get_objective
    objective = get_objective("clm")
    model = objective.build_model(tokenizer, TINY_DECODER, 64, seed=0).eval()
    ids = objective.make_batch(wordnet_docs, tokenizer, np.random.default_rng(0), 64)["input_ids"][:1]
    changed = ids.clone()
    changed[:, 5:] = tokenizer.mask_token_id
    with packed_dropout(model), torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    torch.testing.assert_close(before[:, :5], after[:, :5])
