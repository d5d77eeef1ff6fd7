"""The 1-D CNN classifier: padding never changes a prediction, and it round-trips through disk."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from pretrain.textcnn import TextCNNConfig, TextCNNForSequenceClassification, same_padded_windows


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


@pytest.mark.parametrize("kernel_sizes", [(2, 3), (3, 4, 5), (1, 6), (4,)])
def test_the_padding_is_torchs_same_padding_without_its_warning(kernel_sizes):
    """Weights saved before the padding moved into forward give the same logits: each
    convolution equals torch's Conv1d(padding="same") with those weights."""
    model = tiny_cnn(kernel_sizes)
    x = torch.randn(3, 8, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # torch warns for padding="same" with an even kernel
        ours = [conv(w) for conv, w in zip(model.convolutions, same_padded_windows(x, list(kernel_sizes)))]
    for conv, out in zip(model.convolutions, ours):
        reference = torch.nn.Conv1d(8, 4, conv.kernel_size[0], padding="same")
        reference.load_state_dict(conv.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(out, reference(x))


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
