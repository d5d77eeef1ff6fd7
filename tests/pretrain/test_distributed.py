"""The loop under torchrun: 2 CPU processes (gloo) against one process on the same global batches.

The test launches this file with `torchrun --standalone --nproc_per_node=2`; each rank
trains the same tiny BERT (dropout off, so both runs compute the same function) and
saves its weights and losses. Batches of 7 split 4 + 3, and the last batch of each epoch
has a single example, so one rank runs with an empty share: the weighting must still give
the gradient of the global mean.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from pretrain.batching import encode
from pretrain.data import Split
from pretrain.models import resolve_model_path
from pretrain.train import TrainConfig, train

CFG = TrainConfig(epochs=2, batch_size=7, lr=2e-3, warmup_ratio=0.1, embedding_updates="sparse")
WORDS = ("the", "a", "small", "green", "house", "river", "walks", "near", "old", "blue")


def setup():
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path("minilm")), use_fast=True)
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 5)) + (" apple" if i % 2 else " engine")
             for i in range(50)]
    data = encode(tokenizer, Split(texts, [i % 2 for i in range(50)]))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config), data


def worker(out: Path) -> None:
    torch.set_num_threads(1)
    model, data = setup()
    result = train(model, data, CFG, show_progress=False)
    rank = int(os.environ["RANK"])
    torch.save({"state": model.state_dict(), "losses": result.losses, "samples": result.samples},
               out / f"rank{rank}.pt")


def torchrun(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_two_processes_match_one_process(tmp_path):
    run = torchrun(__file__, str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    # DDP keeps the replicas identical: same all-reduced gradients, same optimizer steps.
    for key, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][key]), key
    assert ranks[0]["losses"] == ranks[1]["losses"]

    model, data = setup()
    single = train(model, data, CFG, show_progress=False)
    assert ranks[0]["samples"] == single.samples == 100
    assert len(ranks[0]["losses"]) == len(single.losses) == 16
    assert torch.allclose(torch.tensor(ranks[0]["losses"]), torch.tensor(single.losses), atol=1e-5)
    for key, value in model.state_dict().items():
        assert torch.allclose(value, ranks[0]["state"][key], atol=1e-5), key
    # and training did move the weights (the comparison is not between two untouched models)
    first, _ = setup()
    assert not torch.allclose(first.classifier.weight, model.classifier.weight)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))


def test_threads_are_split_over_this_nodes_processes_not_the_world(monkeypatch):
    from pretrain.distributed import launched_size, local_size
    monkeypatch.setenv("WORLD_SIZE", "8")           # torchrun --nnodes=2 --nproc_per_node=4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (launched_size(), local_size()) == (8, 4)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert (launched_size(), local_size()) == (1, 1)
