"""`compressor finetune` under torchrun (2 gloo processes): strategies and domain MLM in metrics.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from compressor.bundle import ModelBundle

ROOT = Path(__file__).resolve().parents[3]


def torchrun(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "compressor", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir, tiny_csv, tiny_task):
    root = tmp_path_factory.mktemp("torchrun")
    corpus = root / "glosses.txt"          # in-domain text: the task's glosses, one document each
    corpus.write_text("\n\n".join(tiny_task.split("train").texts) + "\n", encoding="utf-8")
    common = ["finetune", "--model", str(tiny_bert_dir), "--task", str(tiny_csv), "--quiet", "--lr", "1e-3"]
    jobs = {"adapters": [*common, "--out", str(root / "ok"), "--batch-size", "16", "--strategy", "adapters",
                         "--adapter-size", "8", "--adapter-init-std", "1e-2", "--domain-corpus", str(corpus), "--domain-steps", "2"],
            "too-many": [*common, "--out", str(root / "bad"), "--batch-size", "1"]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(torchrun, argv, root) for name, argv in jobs.items()}
        return root, {name: f.result() for name, f in futures.items()}


def test_torchrun_two_processes_write_one_model_with_strategy_metrics(runs, tiny_task):
    root, results = runs
    result = results["adapters"]
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((root / "ok" / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["strategy"] == "adapters"
    assert metrics["config"]["adapter_init_std"] == 1e-2                  # the CLI flag reached the config
    assert metrics["train_samples"] == len(tiny_task.split("train"))       # each example once, over both ranks
    assert 0 < metrics["trainable_params"] < metrics["total_params"]
    assert metrics["trainable_percent"] == pytest.approx(100 * metrics["trainable_params"] / metrics["total_params"],
                                                         abs=1e-3)
    assert result.stdout.count('"accuracy"') == 1                          # only rank 0 printed
    domain = metrics["domain_mlm"]                                          # MLM ran first, on both ranks
    assert domain["steps"] == 2 and domain["samples"] == 2 * 16 and domain["head"] == "fresh"
    assert domain["corpus"] == str(root / "glosses.txt") and metrics["stages"][0] == domain
    assert metrics["config"]["domain_corpus"] == domain["corpus"] and metrics["config"]["domain_steps"] == 2
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    reloaded = ModelBundle.load(root / "ok")
    assert any(".adapter." in n for n, _ in reloaded.model.named_parameters())


def test_more_processes_than_batch_examples_is_one_error_line(runs):
    root, results = runs
    result = results["too-many"]
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr                                  # said once, not per rank
    assert "--nproc_per_node=2" in errors[0] and "batch size 1" in errors[0]
    # Our ranks exit 2 with no traceback; torchrun itself then reports the failed children
    # (its own traceback and a summary naming our exit code) and exits 1: not ours to change.
    assert "exitcode  : 2" in result.stderr
    assert result.stderr.index(errors[0]) < result.stderr.index("Traceback")
    assert not (root / "bad").exists()
