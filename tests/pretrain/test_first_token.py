"""The last layer on the first token only: same logits and gradients, less work, refused
where the head could read more than the first token; the export traces it, fine-tuning
trains through it."""

from __future__ import annotations

import pytest
import torch
import transformers

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.modeling.cost import multiply_adds
from compressor.modeling.structure import tie_layers
from pretrain.first_token import first_token_copy, first_token_last_layer, reader_of, skip_reason
from pretrain.models import encoder_layers
from pretrain.strategies import add_scalar_mix

FAMILIES = [(transformers.BertForSequenceClassification, transformers.BertConfig, "sdpa"),
            (transformers.BertForSequenceClassification, transformers.BertConfig, "eager"),
            (transformers.RobertaForSequenceClassification, transformers.RobertaConfig, "sdpa"),
            (transformers.ElectraForSequenceClassification, transformers.ElectraConfig, "eager"),
            (transformers.DistilBertForSequenceClassification, transformers.DistilBertConfig, "sdpa"),
            (transformers.DistilBertForSequenceClassification, transformers.DistilBertConfig, "eager")]


def tiny(model_class, config_class, attention="eager", **extra):
    torch.manual_seed(0)
    if config_class is transformers.DistilBertConfig:
        config = config_class(vocab_size=100, dim=32, n_layers=3, n_heads=4, hidden_dim=40, num_labels=5,
                              pad_token_id=1, attn_implementation=attention, **extra)
    else:
        config = config_class(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=40, num_labels=5, pad_token_id=1, attn_implementation=attention,
                              **extra)
    return model_class(config).eval()


def padded_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("model_class, config_class, attention", FAMILIES)
def test_the_copy_gives_the_same_logits_and_leaves_the_model_alone(model_class, config_class, attention):
    model = tiny(model_class, config_class, attention)
    model.prune_heads({2: [0, 3], 0: [1]})      # the last layer's own head count
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert skip_reason(model) is None
    copy = first_token_copy(model).eval()
    batch = padded_batch()
    with torch.no_grad():
        for inputs in (batch, {"input_ids": batch["input_ids"]}):          # padded, and no mask at all
            torch.testing.assert_close(copy(**inputs).logits, model(**inputs).logits, atol=1e-6, rtol=0)
        # The copy's last layer returns one position per row; the model's, every position.
        assert copy.base_model(**batch).last_hidden_state.shape[1] == 1
        assert model.base_model(**batch).last_hidden_state.shape[1] == 9
    assert "forward" not in vars(encoder_layers(model)[-1])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_last_layer_does_a_fraction_of_its_work():
    model = tiny(transformers.BertForSequenceClassification, transformers.BertConfig)
    full, first = multiply_adds(model, 64), multiply_adds(first_token_copy(model), 64)
    # The last layer's query and output projections (32 x 32 each) and FFN (32 x 40 twice) run
    # on 1 token instead of 64; its keys and values still cover all 64.
    assert full - first == 63 * (2 * 32 * 32 + 2 * 32 * 40)


@pytest.mark.parametrize("change, reason", [
    ("bart", "has neither BERT's nor DistilBERT's layer layout"),
    ("scalar-mix", "reads every position of every layer"),
    ("relative", "relative position embeddings"),
    ("masked-lm", "may read more than the first token"),
])
def test_models_whose_head_may_read_more_keep_the_whole_layer(change, reason):
    if change == "bart":
        model = transformers.BartForSequenceClassification(transformers.BartConfig(
            vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40))
    elif change == "masked-lm":
        model = tiny(transformers.BertForMaskedLM, transformers.BertConfig)
    else:
        model = tiny(transformers.BertForSequenceClassification, transformers.BertConfig,
                     **({"position_embedding_type": "relative_key"} if change == "relative" else {}))
        if change == "scalar-mix":
            add_scalar_mix(model)
    assert reason in skip_reason(model)


def test_reader_of_copies_where_it_can_and_copies_on_request_where_it_cannot():
    model = tiny(transformers.BertForSequenceClassification, transformers.BertConfig)
    reader = reader_of(model)
    assert reader is not model and "forward" in vars(encoder_layers(reader)[-1])   # the first-token twin
    relative = tiny(transformers.BertForSequenceClassification, transformers.BertConfig,
                    position_embedding_type="relative_key")
    assert reader_of(relative) is relative                       # not allowed: the model itself
    copied = reader_of(relative, always_copy=True)
    assert copied is not relative
    with torch.no_grad():
        torch.testing.assert_close(copied(**padded_batch()).logits, relative(**padded_batch()).logits)
        next(relative.parameters()).add_(1.0)                    # later changes do not reach the copy
        assert not torch.equal(next(copied.parameters()), next(relative.parameters()))


def test_export_records_it_and_the_gate_checks_it(tiny_bert_dir, tiny_task, tmp_path):
    bundle = ModelBundle.load(tiny_bert_dir).replace(task=tiny_task.spec)
    on = export_bundle(bundle, tmp_path / "on", ExportSettings(optimize=False), tiny_task).record
    assert on["cls_only_last_layer"] is True and on["cls_only_last_layer_skipped"] is None
    assert on["parity_max_abs_diff"] <= 1e-4
    off = export_bundle(bundle, tmp_path / "off", ExportSettings(optimize=False, cls_only_last_layer=False),
                        tiny_task).record
    assert off["cls_only_last_layer"] is False and "not asked" in off["cls_only_last_layer_skipped"]
    assert on["accuracy"] == off["accuracy"]


def test_a_scalar_mix_model_exports_whole(tiny_bert_dir, tiny_task, tmp_path):
    bundle = ModelBundle.load(tiny_bert_dir).replace(task=tiny_task.spec)
    model = bundle.copy_model()
    add_scalar_mix(model)
    record = export_bundle(bundle.replace(model=model), tmp_path / "out", ExportSettings(optimize=False),
                           tiny_task).record
    assert record["cls_only_last_layer"] is False and "scalar-mix" in record["cls_only_last_layer_skipped"]
    assert record["parity_max_abs_diff"] <= 1e-4


def gradients(model, batch, labels) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(**batch, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_class, config_class, attention", FAMILIES)
def test_training_through_it_gives_the_whole_layers_gradients(model_class, config_class, attention):
    dropout_off = ({"dropout": 0.0, "attention_dropout": 0.0, "seq_classif_dropout": 0.0} if config_class is transformers.DistilBertConfig
                   else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    model = tiny(model_class, config_class, attention, **dropout_off).train()
    model.prune_heads({2: [1]})
    batch, labels = padded_batch(), torch.tensor([0, 3, 4])
    whole = gradients(model, batch, labels)
    with first_token_last_layer(model):
        assert "forward" in vars(encoder_layers(model)[-1])
        first = gradients(model, batch, labels)
    assert first.keys() == whole.keys()        # every weight of the last layer still learns
    for name in whole:
        torch.testing.assert_close(first[name], whole[name], atol=1e-6, rtol=1e-4)
    assert "forward" not in vars(encoder_layers(model)[-1])     # the model's own layer is back


def test_attention_dropout_still_acts_in_training():
    model = tiny(transformers.BertForSequenceClassification, transformers.BertConfig,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5).train()
    batch = padded_batch()
    with first_token_last_layer(model), torch.no_grad():
        runs = [model(**batch).logits for _ in range(2)]
    assert not torch.equal(*runs)
    model.eval()
    with first_token_last_layer(model), torch.no_grad():
        assert torch.equal(model(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("sharing", ["parameters", "module"])
def test_a_layer_shared_with_the_last_keeps_its_whole_forward_elsewhere_and_is_restored_after_errors(sharing):
    model = tiny(transformers.BertForSequenceClassification, transformers.BertConfig,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    layers = encoder_layers(model)
    if sharing == "parameters":
        tie_layers(model, [[1, 2]])                 # share-layers: own modules, one set of tensors
    else:
        layers[2] = layers[1]                       # one module object at two positions
    original = layers[2]
    batch = padded_batch()
    with torch.no_grad():
        expected = model(**batch).logits
        with first_token_last_layer(model):
            assert "forward" not in vars(layers[1]) and "forward" in vars(layers[2])
            assert layers[2].attention.self.query.weight is original.attention.self.query.weight
            torch.testing.assert_close(model(**batch).logits, expected, atol=1e-6, rtol=0)
    with pytest.raises(RuntimeError), first_token_last_layer(model):
        raise RuntimeError("interrupted")
    assert layers[2] is original and "forward" not in vars(layers[2])
