"""Importance scores: the head gate is Michel et al.'s head_mask gradient; selection keeps floors."""

from __future__ import annotations

import torch

from compressor.modeling.importance import (attention_outputs, batches, encode_for_model, head_dim, lowest,
                                            taylor_scores, train_rows)
from pretrain.families import FAMILIES
from pretrain.models import encoder_layers


def test_taylor_head_scores_equal_the_head_mask_gradient(bert_bundle, tiny_task):
    """|dL/dxi| per batch with Transformers' own head_mask (the definition in Michel et al.),
    summed and divided by tokens, is what the gate on the output projection's input gives."""
    model = bert_bundle.model.eval()
    data = encode_for_model(model, bert_bundle.tokenizer, tiny_task, train_rows(tiny_task, 0, 24, "test"))
    family = FAMILIES["bert"]
    ours = taylor_scores(model, data, attention_outputs(model, family, encoder_layers(model)),
                         head_dim(model, family), batch_size=8)

    expected, tokens = torch.zeros(4, 4), 0
    for batch in batches(model, data, 8):
        mask = torch.ones(4, 4, requires_grad=True)
        loss = model(**batch, head_mask=mask).loss * len(batch["labels"])
        expected += torch.autograd.grad(loss, mask)[0].abs()
        tokens += int(batch["attention_mask"].sum())
    torch.testing.assert_close(torch.stack(ours), expected / tokens, rtol=1e-4, atol=1e-9)
    assert all(p.requires_grad for p in model.parameters())   # flags restored


def test_lowest_takes_global_minima_but_keeps_the_floor():
    scores = [torch.tensor([0.1, 0.2, 0.9]), torch.tensor([0.05, 0.8]), torch.tensor([0.3])]
    assert lowest(scores, 2, keep_per_layer=1) == {0: [0], 1: [0]}
    # layer 1 and 2 may give only what leaves one unit: the next lowest come from layer 0
    assert lowest(scores, 3, keep_per_layer=1) == {0: [0, 1], 1: [0]}
    assert lowest(scores, 4, keep_per_layer=0) == {0: [0, 1], 1: [0], 2: [0]}


def test_lowest_counts_a_unit_of_shared_layers_once_per_layer():
    """Row 0 stands for 2 layers sharing one set of weights: one of its units counts 2, and a
    unit that would go past the count is passed over for one of a single layer."""
    scores = [torch.tensor([0.1, 0.2, 0.9]), torch.tensor([0.15, 0.8])]
    assert lowest(scores, 5, keep_per_layer=1, sizes=[2, 1]) == {0: [0, 1], 1: [0]}
    assert lowest(scores, 4, keep_per_layer=1, sizes=[2, 1]) == {0: [0], 1: [0]}     # 3: row 0's next is 2
    assert lowest(scores, 1, keep_per_layer=1, sizes=[2, 1]) == {1: [0]}
