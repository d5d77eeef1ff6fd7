"""`compressor finetune`: under torchrun (2 gloo processes), strategies and domain MLM in
metrics.json; in this process, an interrupted run resumed from its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from compressor.bundle import ModelBundle
from compressor.cli.commands import main
from compressor.cli.finetune_command import finetune_command
from pretrain.errors import UserError
from pretrain.resume import checkpoint_dir
from tests.pretrain.test_train import Interrupt, stop_at

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


def test_an_interrupted_finetune_resumes_to_the_same_weights(tmp_path, tiny_bert_dir, tiny_csv):
    task = {"path": str(tiny_csv)}
    settings = {"epochs": 2, "batch_size": 8, "lr": 1e-3, "max_train_samples": 48}     # 12 steps, dropout on

    def run(out, **kwargs):
        return finetune_command(str(tiny_bert_dir), task, out, settings, show_progress=False,
                                checkpoint_every=2, **kwargs)
    whole = run(tmp_path / "whole")
    cut = tmp_path / "cut"
    with pytest.raises(Interrupt):
        run(cut, callbacks=(stop_at(5),))
    assert not cut.exists() and (checkpoint_dir(cut) / "checkpoint.pt").is_file()
    with pytest.raises(UserError, match="pass --resume"):                 # never silently restarted
        run(cut)
    with pytest.raises(UserError, match=r"other settings \(config\.lr differ"):   # nor continued with others
        finetune_command(str(tiny_bert_dir), task, cut, {**settings, "lr": 5e-4}, show_progress=False,
                         resume=True)
    resumed = run(cut, resume=True)
    assert resumed["steps"] == whole["steps"] == 12 and resumed["train_samples"] == whole["train_samples"]
    assert not checkpoint_dir(cut).exists() and not checkpoint_dir(tmp_path / "whole").exists()
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(cut / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert resumed["accuracy"] == whole["accuracy"]


def test_a_resume_after_the_task_file_changed_is_refused(tmp_path, tiny_bert_dir, tiny_csv):
    """Same paths, other contents: the checkpoint would continue on other data, a mix of two runs."""
    data = tmp_path / "task.csv"
    data.write_text(tiny_csv.read_text())
    settings = {"epochs": 1, "batch_size": 8, "lr": 1e-3, "max_train_samples": 48}
    cut = tmp_path / "cut"
    with pytest.raises(Interrupt):
        finetune_command(str(tiny_bert_dir), {"path": str(data)}, cut, settings, show_progress=False,
                         checkpoint_every=2, callbacks=(stop_at(3),))
    header, *rows = data.read_text().splitlines()
    data.write_text("\n".join([header, *reversed(rows)]) + "\n")
    with pytest.raises(UserError, match=r"other settings \(inputs\..*task\.csv differ"):
        finetune_command(str(tiny_bert_dir), {"path": str(data)}, cut, settings, show_progress=False, resume=True)
    assert (checkpoint_dir(cut) / "checkpoint.pt").is_file()              # kept for the user to decide


def test_a_run_killed_before_its_first_checkpoint_is_no_unfinished_run(tmp_path, tiny_bert_dir, tiny_csv):
    """kill -9 right after the settings were written: nothing to resume, so no --resume asked."""
    out = tmp_path / "out"
    checkpoint_dir(out).mkdir()
    (checkpoint_dir(out) / "finetune_settings.json").write_text("{}")
    metrics = finetune_command(str(tiny_bert_dir), {"path": str(tiny_csv)}, out,
                               {"epochs": 1, "batch_size": 16, "max_train_samples": 32}, max_eval_samples=16,
                               show_progress=False)
    assert metrics["steps"] == 2 and not checkpoint_dir(out).exists()


def test_a_run_stopped_before_its_first_checkpoint_leaves_nothing(tmp_path, tiny_bert_dir, tiny_csv):
    out = tmp_path / "out"
    with pytest.raises(Interrupt):
        finetune_command(str(tiny_bert_dir), {"path": str(tiny_csv)}, out, {"batch_size": 8}, show_progress=False,
                         checkpoint_every=4, callbacks=(stop_at(1),))
    assert not out.exists() and not checkpoint_dir(out).exists()


def test_threads_sets_torchs_threads_and_is_recorded(tmp_path, tiny_bert_dir, tiny_csv):
    before = torch.get_num_threads()
    try:
        metrics = finetune_command(str(tiny_bert_dir), {"path": str(tiny_csv)}, tmp_path / "one",
                                   {"epochs": 1, "batch_size": 16, "max_train_samples": 32}, max_eval_samples=16,
                                   show_progress=False, threads=1)
        assert metrics["environment"]["torch_threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_evaluate_scores_the_test_split_the_model_was_trained_beside(tmp_path, tiny_bert_dir, tiny_csv):
    """A model fine-tuned with --seed 1 records that seed with its task: evaluate (and export,
    bench) draw the same splits by default, so they score its test rows, not rows it trained on."""
    from compressor.evaluate import evaluate_path
    metrics = finetune_command(str(tiny_bert_dir), {"path": str(tiny_csv)}, tmp_path / "s1",
                               {"epochs": 1, "batch_size": 16, "max_train_samples": 32, "seed": 1},
                               show_progress=False)
    assert json.loads((tmp_path / "s1" / "compressor.json").read_text())["task_seed"] == 1
    again = evaluate_path(str(tmp_path / "s1"), None)
    assert (again["accuracy"], again["samples"]) == (metrics["accuracy"], metrics["samples"])
    seed0 = evaluate_path(str(tmp_path / "s1"), None, seed=0)       # asked for: another draw
    assert seed0["samples"] == again["samples"]
    named = evaluate_path(str(tmp_path / "s1"), {"path": str(tiny_csv)})   # the same task named again
    assert (named["accuracy"], named["samples"]) == (again["accuracy"], again["samples"])


def test_split_seed_keeps_the_recorded_seed_for_the_recorded_task_named_again(tmp_path, monkeypatch):
    from compressor.evaluate import split_seed
    data = tmp_path / "rows.csv"
    recorded = {"path": str(data.resolve())}
    monkeypatch.chdir(tmp_path)
    assert split_seed(None, 3, None, recorded) == 3
    assert split_seed(None, 3, {"path": "rows.csv"}, recorded) == 3          # relative, as typed
    named = {"path": "rows.csv", "text": "text", "label": "label", "split": [0.8, 0.1, 0.1], "test": None}
    assert split_seed(None, 3, named, recorded) == 3                         # the defaults, named
    assert split_seed(None, 3, {"path": "rows.csv", "text": "sentence"}, recorded) == 0   # another column
    assert split_seed(None, 3, "wordnet-supersense", "wordnet-supersense") == 3
    assert split_seed(None, 3, "wordnet-wsd", "wordnet-supersense") == 0    # another task
    assert split_seed(None, 3, {"path": "other.csv"}, recorded) == 0
    assert split_seed(5, 3, None, recorded) == 5                             # asked for
    assert split_seed(None, None, None, recorded) == 0


def test_metrics_count_the_scored_test_texts_that_train_holds(tmp_path, tiny_bert_dir, tiny_csv, tiny_task):
    """metrics.json gave a test accuracy over rows the model trained on, and said nothing."""
    train, names = tiny_task.split("train"), tiny_task.label_names      # every row of tiny_csv is train below
    held_out = {}
    for split, rows in (("test", [(train.texts[0], names[(train.labels[0] + 1) % len(names)]),   # another label
                                  ("new one", names[0]), ("new two", names[1])]),
                        ("validation", [("new three", names[2])])):
        held_out[split] = tmp_path / f"{split}.jsonl"
        held_out[split].write_text("".join(json.dumps({"text": text, "label": label}) + "\n" for text, label in rows))
    spec = {"path": str(tiny_csv), **{split: str(path) for split, path in held_out.items()}}
    settings = {"epochs": 1, "batch_size": 16, "max_train_samples": 16}
    metrics = finetune_command(str(tiny_bert_dir), spec, tmp_path / "seen", settings, show_progress=False)
    assert metrics["texts_in_train"] == {"test": {"examples": 3, "in_train": 1, "other_label": 1}}
    assert metrics["warnings"][0].startswith("1 of the 3 test examples scored have a text that the train split")
    assert json.loads((tmp_path / "seen" / "metrics.json").read_text())["texts_in_train"] == metrics["texts_in_train"]
    distinct = finetune_command(str(tiny_bert_dir), {"path": str(tiny_csv)}, tmp_path / "distinct", settings,
                                max_eval_samples=16, show_progress=False)
    assert distinct["texts_in_train"] == {"test": {"examples": 16, "in_train": 0, "other_label": 0}}
    assert "warnings" not in distinct


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "compressor finetune: argument --epochs: expected a positive number (got 0)"),
    (["--epochs", "x"], "compressor finetune: argument --epochs: expected a positive number (got 'x')"),
    (["--lr", "-1"], "compressor finetune: argument --lr: expected a positive number (got -1)"),
    (["--adapter-init-std", "2"], "compressor finetune: argument --adapter-init-std: expected a number in (0, 1] "
                                  "(got 2)"),
    (["--batch-size", "0"], "compressor finetune: argument --batch-size: expected a positive integer from 1 to "
                            "2147483647 (got 0)"),
    # a check across fields, made by the config: named by the flags too, not the fields domain_lr and
    # domain_corpus, nor by the value parsed (0.001 for 1e-3)
    (["--domain-lr", "1e-3"], "--domain-lr: set without --domain-corpus; expected a corpus to run MLM on"),
])
def test_a_number_flag_out_of_range_says_what_it_takes(flags, message, tmp_path, capsys):
    """As a recipe's finetune settings do: both bounds where there are two, not pydantic's
    "greater than 0" or argparse's "invalid float value"; the flag named, its value as typed."""
    out = tmp_path / "ft"
    assert main(["finetune", "--task", "wordnet-supersense", "--out", str(out), *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_a_setting_the_config_refuses_is_named_by_its_flag(tmp_path):
    """finetune_command's own callers get the flag too (`--epochs`), not the field (`epochs`)."""
    with pytest.raises(UserError) as err:
        finetune_command("minilm", "wordnet-supersense", tmp_path / "ft", {"epochs": 0, "lr": None})
    assert str(err.value) == "--epochs: expected a positive number (got 0)"
    assert list(tmp_path.iterdir()) == []


def test_the_model_records_whether_its_task_gave_text_pairs(shape_tuned):
    """What evaluate, export and bench check a task's shape against (compressor.json `pair_task`)."""
    assert ModelBundle.load(shape_tuned["pairs"]).pair_task is True
    assert ModelBundle.load(shape_tuned["single"]).pair_task is False
