"""Domain-adaptive MLM before fine-tuning (`domain_corpus`), on tiny real models and WordNet text."""

from __future__ import annotations

import copy

import pytest
import torch
import numpy as np
from transformers import AlbertConfig, AlbertForSequenceClassification, BertConfig, BertForMaskedLM

from pretrain.domain import check_domain, domain_adapt, domain_mlm_loss, masked_lm_sharing_encoder
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, finetune
from pretrain.models import load_classifier
from pretrain.objectives import get_objective
from pretrain.pretraining import PretrainConfig

QUICK = dict(epochs=1, batch_size=16, lr=1e-3, warmup_ratio=0.0)


@pytest.fixture(scope="module")
def corpus(tiny_task, tmp_path_factory):
    """In-domain text: the tiny task's glosses (no labels), one document each, blank lines between."""
    path = tmp_path_factory.mktemp("domain") / "glosses.txt"
    path.write_text("\n\n".join(tiny_task.split("train").texts) + "\n", encoding="utf-8")
    return path


def mlm_run(corpus, steps: int = 3) -> PretrainConfig:
    return PretrainConfig(objective="mlm", corpus=str(corpus), steps=steps, batch_size=8, lr=1e-3,
                          max_length=64, warmup_ratio=0.0)


def encoder_state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.base_model.state_dict().items()}


def test_domain_stage_trains_the_shared_encoder_before_a_frozen_finetune(bert_bundle, tiny_task, corpus):
    model = bert_bundle.copy_model()
    before = encoder_state(model)
    cfg = FinetuneConfig(**QUICK, strategy="frozen", domain_corpus=str(corpus), domain_steps=4, domain_lr=1e-3)
    result = finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)
    after = model.base_model.state_dict()
    # Frozen fine-tuning leaves the encoder alone: every change is the MLM stage's.
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert "embeddings.word_embeddings.weight" in moved and any(".attention." in k for k in moved)
    assert [s["task"] for s in result.stages] == [f"mlm on {corpus}", "tiny"]
    assert result.domain == result.stages[0]
    assert result.domain["steps"] == 4 and result.domain["samples"] == 4 * 16 and result.domain["head"] == "fresh"
    assert result.train.steps == 15                               # the target's steps are unchanged
    assert result.trainable_params == sum(p.numel() for n, p in model.named_parameters() if "classifier" in n)
    assert not any(n.startswith(("cls.", "lm_head")) for n, _ in model.named_parameters())  # head dropped


def test_mlm_model_shares_the_encoder_and_ties_the_projection(bert_bundle):
    model = bert_bundle.copy_model()
    mlm, head = masked_lm_sharing_encoder(model, seed=0, head_from=None)
    assert head == "fresh" and mlm.bert is model.bert
    assert mlm.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_the_checkpoint_mlm_head_is_used_when_it_has_one(tiny_task, tokenizer, tmp_path):
    torch.manual_seed(3)
    pretrained = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    with torch.no_grad():
        pretrained.cls.predictions.transform.dense.weight.normal_(0, 1.0)   # unlike any fresh init
    pretrained.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    model, _ = load_classifier(str(tmp_path), tiny_task.label_names)
    mlm, head = masked_lm_sharing_encoder(model, seed=0, head_from=tmp_path)
    assert head == "checkpoint"
    assert torch.equal(mlm.cls.predictions.transform.dense.weight, pretrained.cls.predictions.transform.dense.weight)
    assert mlm.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_distilbert_gets_its_own_mlm_head_and_loss(model_dirs, tiny_task, tokenizer, corpus):
    model, _ = load_classifier(str(model_dirs["distilbert"]), tiny_task.label_names)
    mlm, _ = masked_lm_sharing_encoder(model, seed=0, head_from=model_dirs["distilbert"])
    assert mlm.distilbert is model.distilbert
    docs = [[tokenizer(t, add_special_tokens=False)["input_ids"]] for t in tiny_task.split("train").texts[:8]]
    batch = get_objective("mlm").make_batch(docs, tokenizer, np.random.default_rng(0), 64)
    loss = domain_mlm_loss(mlm, batch)
    loss.backward()
    assert torch.isfinite(loss) and model.distilbert.transformer.layer[0].ffn.lin1.weight.grad is not None


def test_domain_mlm_loss_falls_on_repeated_text(bert_bundle, corpus):
    model = bert_bundle.copy_model()
    result = domain_adapt(model, bert_bundle.tokenizer, mlm_run(corpus, steps=30), show_progress=False)
    assert result.train.steps == 30
    assert result.train.losses[-1] < result.train.losses[0]


@pytest.mark.parametrize("problem, message", [
    ("missing-corpus", "unknown corpus"),
    ("no-mask-token", "domain MLM: tokenizer has no mask_token"),
    ("family", "model family 'albert'"),
])
def test_bad_domain_input_is_refused_before_training(bert_bundle, tiny_task, corpus, tmp_path, problem, message):
    model, tokenizer = bert_bundle.copy_model(), bert_bundle.tokenizer
    cfg = mlm_run(tmp_path / "no-such.txt" if problem == "missing-corpus" else corpus)
    if problem == "no-mask-token":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.mask_token = None
    if problem == "family":
        model = AlbertForSequenceClassification(AlbertConfig(vocab_size=len(tokenizer), embedding_size=16,
                                                             hidden_size=32, num_hidden_layers=1,
                                                             num_attention_heads=2, intermediate_size=64))
    before = encoder_state(model)
    with pytest.raises(UserError, match=message):
        check_domain(cfg, model, tokenizer)
    if problem == "missing-corpus":        # through finetune too: refused before any stage trains
        with pytest.raises(UserError, match=message):
            finetune(model, tokenizer, tiny_task,
                     FinetuneConfig(**QUICK, domain_corpus=cfg.corpus, intermediate_task=None), show_progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.base_model.state_dict().items())


def test_domain_settings_without_a_corpus_are_refused():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="without domain_corpus"):
        FinetuneConfig(domain_steps=10)
    assert FinetuneConfig(domain_corpus="wordnet").domain_config().objective == "mlm"
    dumped = FinetuneConfig().model_dump(mode="json")            # lists the default domain settings
    assert FinetuneConfig.model_validate(dumped) == FinetuneConfig()
