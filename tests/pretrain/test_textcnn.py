"""The 1-D CNN classifier: padding never changes a prediction, and it round-trips through disk."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from pretrain.textcnn import TextCNNConfig, TextCNNForSequenceClassification


def tiny_cnn(kernel_sizes=(2, 3)) -> TextCNNForSequenceClassification:
    torch.manual_seed(0)
    config = TextCNNConfig(vocab_size=50, embedding_dim=8, kernel_sizes=kernel_sizes, filters=4, num_labels=3)
    return TextCNNForSequenceClassification(config).eval()


@pytest.mark.parametrize("pad_row", ["zero", "copied from a teacher"])
def test_padding_does_not_change_the_logits(pad_row):
    model = tiny_cnn()
    if pad_row != "zero":           # a teacher's [PAD] vector is not zero
        with torch.no_grad():
            model.embeddings.weight[0] = torch.linspace(-1, 1, 8)
    ids = torch.tensor([[5, 9, 13, 2]])
    padded = torch.tensor([[5, 9, 13, 2, 0, 0, 0]])
    mask = (padded != 0).long()
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        in_batch = model(input_ids=padded, attention_mask=mask).logits
    torch.testing.assert_close(alone, in_batch)


def test_a_one_token_row_and_the_loss():
    model = tiny_cnn(kernel_sizes=(5,))
    out = model(input_ids=torch.tensor([[7], [8]]), labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.loss.item() > 0


def test_saves_and_loads_through_the_auto_class(tmp_path):
    model = tiny_cnn()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is TextCNNForSequenceClassification and loaded.config.kernel_sizes == [2, 3]
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
