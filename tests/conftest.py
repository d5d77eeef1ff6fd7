"""Shared fixtures: tiny random models with the real MiniLM tokenizer, and small real tasks.

Everything expensive is session-scoped and built once: the WordNet supersense task, a
300-row user CSV drawn from it, and tiny BERT / DistilBERT classifiers (hidden 32) saved
as ordinary Hugging Face dirs. Tests that change a model load their own copy.
"""

from __future__ import annotations

import csv
import itertools
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification, DistilBertConfig,
                          DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel)

from pretrain.data import Split, TaskData, load_corpus, load_task
from pretrain.models import resolve_model_path

# Four supersenses that are frequent in WordNet and tell apart from the gloss wording.
TINY_LABELS = ("adj.all", "noun.animal", "noun.person", "noun.plant")
TINY_ROWS_PER_LABEL = 75          # 300 rows: 240 train / 30 validation / 30 test
TINY_LAYERS = 4


def tiny_bert_config(label_names, vocab_size: int, layers: int = TINY_LAYERS) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers,
                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                      num_labels=len(label_names), id2label=dict(enumerate(label_names)),
                      label2id={name: i for i, name in enumerate(label_names)})


def tiny_distilbert_config(label_names, vocab_size: int, layers: int = 3) -> DistilBertConfig:
    return DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=layers, n_heads=4, hidden_dim=64,
                            max_position_embeddings=128, num_labels=len(label_names),
                            id2label=dict(enumerate(label_names)),
                            label2id={name: i for i, name in enumerate(label_names)})


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return resolve_model_path("minilm")


@pytest.fixture(scope="session")
def tokenizer(minilm_dir):
    """The real MiniLM WordPiece tokenizer (vocab 30522), shared by every tiny model."""
    return AutoTokenizer.from_pretrained(str(minilm_dir), use_fast=True)


@pytest.fixture(scope="session")
def supersense() -> TaskData:
    return load_task("wordnet-supersense")


@pytest.fixture(scope="session")
def small_task(supersense) -> TaskData:
    """The first examples of each real supersense split (45 labels), for fast tests."""
    sizes = {"train": 2000, "validation": 200, "test": 200}
    splits = {name: Split(supersense.splits[name].texts[:n], supersense.splits[name].labels[:n])
              for name, n in sizes.items()}
    return TaskData(supersense.name, supersense.label_names, splits, spec=supersense.spec)


@pytest.fixture(scope="session")
def tiny_csv(supersense, tmp_path_factory) -> Path:
    """A user CSV (text,label) of 300 real WordNet glosses, 75 for each of 4 supersenses."""
    wanted = {supersense.label_names.index(name): name for name in TINY_LABELS}
    rows, per_label = [], Counter()
    train = supersense.split("train")
    for text, label in zip(train.texts, train.labels):
        if label in wanted and per_label[label] < TINY_ROWS_PER_LABEL:
            rows.append((text, wanted[label]))
            per_label[label] += 1
    assert len(rows) == TINY_ROWS_PER_LABEL * len(TINY_LABELS)
    random.Random(0).shuffle(rows)
    path = tmp_path_factory.mktemp("data") / "tiny.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


@pytest.fixture(scope="session")
def tiny_task(tiny_csv) -> TaskData:
    task = load_task({"path": str(tiny_csv)})
    assert task.label_names == TINY_LABELS
    for name, split in task.splits.items():
        assert set(split.labels) == set(range(len(TINY_LABELS))), f"a label is missing from {name}"
    return task


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, tokenizer, tiny_task) -> Path:
    """A randomly initialised 4-layer BERT classifier for the tiny task's labels."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_bert_config(tiny_task.label_names, len(tokenizer))).eval()
    path = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_distilbert_dir(tmp_path_factory, tokenizer, tiny_task) -> Path:
    """A randomly initialised 3-layer DistilBERT classifier for the tiny task's labels."""
    torch.manual_seed(1)
    model = DistilBertForSequenceClassification(
        tiny_distilbert_config(tiny_task.label_names, len(tokenizer))).eval()
    path = tmp_path_factory.mktemp("tiny-distilbert")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def model_dirs(tiny_bert_dir, tiny_distilbert_dir) -> dict[str, Path]:
    return {"bert": tiny_bert_dir, "distilbert": tiny_distilbert_dir}


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny GPT-2: a real HF model dir of a family the passes do not support."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    path = tmp_path_factory.mktemp("tiny-gpt2")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture
def make_tiny_bert(tokenizer):
    """Build a fresh in-memory tiny BERT classifier (seeded) for training tests."""
    def make(num_labels: int = 2, seed: int = 0, layers: int = 2) -> BertForSequenceClassification:
        torch.manual_seed(seed)
        labels = tuple(f"c{i}" for i in range(num_labels))
        return BertForSequenceClassification(tiny_bert_config(labels, len(tokenizer), layers))
    return make


@pytest.fixture
def bert_bundle(tiny_bert_dir):
    """A fresh ModelBundle of the tiny BERT (a new copy per test: tests may change it)."""
    from compressor.bundle import ModelBundle
    return ModelBundle.load(tiny_bert_dir)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models train fastest on one thread, and the machine is shared: with every core
    busy elsewhere, OpenMP threads spinning on each other make tiny steps 50x slower.
    Restored after each test because the pipeline sets its own thread count."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def wordnet_corpus_file(tmp_path_factory):
    """`wordnet_corpus_file(n)`: path of a plain-text corpus (blank lines between documents)
    holding the first n WordNet documents, as a user would hand one over; written once per n."""
    made: dict[int, str] = {}

    def make(n: int) -> str:
        if n not in made:
            path = tmp_path_factory.mktemp("corpus") / f"wordnet-{n}.txt"
            docs = itertools.islice(load_corpus("wordnet"), n)
            path.write_text("".join("\n".join(doc) + "\n\n" for doc in docs))
            made[n] = str(path)
        return made[n]
    return make


@pytest.fixture
def count_calls(monkeypatch):
    """`count_calls(owner, name)`: a list that gets one entry per call of `owner.name` (which
    still runs) for the rest of the test."""
    def counting(owner, name: str) -> list[int]:
        calls: list[int] = []
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)
        return calls
    return counting


@pytest.fixture
def trained_rates(monkeypatch) -> list[float]:
    """The learning rate of every `train` call fine-tuning makes (the calls still run)."""
    import pretrain.finetune as finetune_module
    seen: list[float] = []
    real_train = finetune_module.train

    def recording_train(model, data, cfg, **kwargs):
        seen.append(cfg.lr)
        return real_train(model, data, cfg, **kwargs)
    monkeypatch.setattr(finetune_module, "train", recording_train)
    return seen


@pytest.fixture(scope="session")
def tiny_pairs_csv(tiny_csv, tmp_path_factory) -> Path:
    """The tiny CSV's rows as text pairs (text, text_pair, label): the same labels, the other
    shape of input."""
    with tiny_csv.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    path = tmp_path_factory.mktemp("pairs") / "tiny-pairs.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "text_pair", "label"])
        writer.writerows((row["text"], " ".join(reversed(row["text"].split())), row["label"]) for row in rows)
    return path


@pytest.fixture(scope="session")
def shape_tuned(tiny_bert_dir, tiny_csv, tiny_pairs_csv, tmp_path_factory) -> dict[str, Path]:
    """`compressor finetune` run on the tiny BERT for a few steps with the tiny task's single
    texts and with its text pairs: {"single": dir, "pairs": dir}, each recording its input's shape."""
    from compressor.cli.commands import main
    root = tmp_path_factory.mktemp("shape-tuned")
    for name, task in (("single", tiny_csv), ("pairs", tiny_pairs_csv)):
        assert main(["finetune", "--model", str(tiny_bert_dir), "--task", str(task), "--out", str(root / name),
                     "--epochs", "1", "--max-train-samples", "16", "--max-eval-samples", "8", "--threads", "1",
                     "--quiet"]) == 0
    return {"single": root / "single", "pairs": root / "pairs"}
