"""`compressor pretrain` / `compressor tokenizer`: outputs, exact resume, teacher validity, bad input.

Runs use SIZES["tiny"] on a 300-document slice of the WordNet corpus for a few steps: the
real stream, objectives, loop and checkpointing, at test scale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from compressor.cli.commands import main
from compressor.cli.pretrain_command import pretrain_command
from pretrain.errors import UserError
from pretrain.models import check_model_ref, load_classifier
from pretrain.objectives.dae import NoiseConfig
from pretrain.pretraining import SETTINGS_FILE, make_config, objective_options, prepare
from pretrain.resume import check_resume, checkpoint_dir


@pytest.fixture(scope="module")
def corpus(wordnet_corpus_file) -> str:
    return wordnet_corpus_file(300)


def config(corpus: str, objective: str = "mlm", **overrides):
    settings = dict(objective=objective, corpus=corpus, size="tiny", steps=6, batch_size=8,
                    max_length=32, buffer_size=64, seed=0)
    return make_config(**settings | overrides)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


# mlm: one BERT, masks drawn per step; rtd: a generator and a discriminator, replacements
# sampled with torch's RNG (which the checkpoint must carry).
@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_interrupted_run_resumes_to_the_same_weights(corpus, tmp_path, objective):
    cfg = config(corpus, objective)
    whole = tmp_path / "whole"
    pretrain_command(cfg, whole, show_progress=False, checkpoint_every=2, threads=1)

    class Interrupt(Exception):
        pass

    def stop_at_step_5(log):
        if log.step == 5:
            raise Interrupt
    cut = tmp_path / "cut"
    with pytest.raises(Interrupt):
        pretrain_command(cfg, cut, show_progress=False, checkpoint_every=2, threads=1,
                         callbacks=(stop_at_step_5,))
    assert not cut.exists() and (checkpoint_dir(cut) / "checkpoint.pt").is_file()
    with pytest.raises(UserError, match="pass --resume"):        # never silently restarted
        pretrain_command(cfg, cut, show_progress=False, checkpoint_every=2, threads=1)
    metrics = pretrain_command(cfg, cut, resume=True, show_progress=False, checkpoint_every=2, threads=1)
    assert metrics["steps"] == 6 and not checkpoint_dir(cut).exists()
    a, b = weights(whole), weights(cut)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("objective", ["mlm", "mlm-wwm", "clm", "nsp", "sop", "mlm+nsp", "mlm+sop", "span", "unilm"])
def test_pretrained_model_is_a_valid_teacher(corpus, tmp_path, objective, tiny_task):
    out = tmp_path / objective
    metrics = pretrain_command(config(corpus, objective, steps=3), out, show_progress=False, threads=1)
    for key in ("objective", "initial_loss", "final_loss", "tokens_per_second", "steps"):
        assert key in metrics
    assert metrics["objective"] == objective and metrics["steps"] == 3 and metrics["tokens_per_second"] > 0
    assert json.loads((out / "metrics.json").read_text())["final_loss"] == pytest.approx(metrics["final_loss"])
    check_model_ref(str(out))
    model, tokenizer = load_classifier(str(out), tiny_task.label_names)
    trained = weights(out)
    encoder_key = "bert.encoder.layer.0.attention.self.query.weight"
    torch.testing.assert_close(model.state_dict()[encoder_key], trained[encoder_key])
    batch = tokenizer(["a dog: a domesticated carnivore"], return_tensors="pt")
    assert model(**batch).logits.shape == (1, len(tiny_task.label_names))


def test_init_continues_a_bert_models_masked_lm_pretraining(corpus, tmp_path, tiny_bert_dir, tiny_distilbert_dir):
    """--init: the model starts as the given BERT (its encoder, its vocabulary), with an MLM head
    drawn fresh where it has none, and is delivered as a masked LM with a trained head (what
    `distill`'s augment needs)."""
    from transformers import AutoModelForMaskedLM

    from compressor.passes.distill_augment import load_masked_lm
    out = tmp_path / "continued"
    metrics = pretrain_command(config(corpus, steps=2, lr=1e-6, init=str(tiny_bert_dir)), out,
                               show_progress=False, threads=1)
    assert metrics["config"]["init"] == str(tiny_bert_dir.resolve())
    start, trained = weights(tiny_bert_dir), weights(out)
    key = "bert.encoder.layer.0.attention.self.query.weight"
    torch.testing.assert_close(trained[key], start[key], atol=1e-4, rtol=0)      # 2 steps at 1e-6 from the init
    assert trained["bert.embeddings.word_embeddings.weight"].shape == start["bert.embeddings.word_embeddings.weight"].shape
    _, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and json.loads((out / "config.json").read_text())["pretraining"]["init"]
    load_masked_lm(out)                                                          # usable as augment.mlm
    with pytest.raises(UserError, match="continues masked-LM pretraining"):
        config(corpus, "clm", init=str(tiny_bert_dir))
    with pytest.raises(UserError, match="'distilbert' model"):
        pretrain_command(config(corpus, init=str(tiny_distilbert_dir)), tmp_path / "x", show_progress=False)
    assert not (tmp_path / "x").exists()


def test_init_dirs_that_cannot_start_pretraining_are_refused_in_one_line(corpus, tmp_path, tiny_bert_dir, capsys):
    """An ONNX export, a truncated weights file, a config.json of more layers than the weights
    hold (Transformers would draw the missing layer at random), a dir that does not exist:
    each named as --init, exit 2, nothing written."""
    import shutil
    onnx_dir, truncated, mismatched = tmp_path / "onnx", tmp_path / "truncated", tmp_path / "mismatched"
    onnx_dir.mkdir()
    (onnx_dir / "model.onnx").write_bytes(b"onnx")
    shutil.copy(tiny_bert_dir / "config.json", onnx_dir / "config.json")
    for copy in (truncated, mismatched):
        shutil.copytree(tiny_bert_dir, copy)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
    cfg = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1}))
    cases = {onnx_dir: "holds an ONNX export", truncated: "truncated or corrupt",
             mismatched: "do not fit its config.json", tmp_path / "absent": "model .*absent.* not found"}
    for init, why in cases.items():
        out = tmp_path / f"out-{init.name}"
        code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--init", str(init),
                        "--steps", "2", "--batch-size", "4", "--max-length", "32", "--out", str(out), "--quiet")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert re.search(why, err) and err.startswith("error: --init: ") and "tokenizer" not in err, err
        assert not out.exists()


def test_loss_goes_down_with_training(corpus, tmp_path):
    metrics = pretrain_command(config(corpus, steps=40, batch_size=16, lr=3e-3), tmp_path / "m",
                               show_progress=False, threads=1)
    assert metrics["final_loss"] < metrics["initial_loss"] - 0.5


def test_resume_with_other_settings_is_refused_and_keeps_the_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    ckpt = checkpoint_dir(out)

    def interrupt(log):
        if log.step == 3:                 # after the checkpoint of step 2
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        pretrain_command(config(corpus), out, show_progress=False, checkpoint_every=2, threads=1,
                         callbacks=(interrupt,))
    before = (ckpt / "checkpoint.pt").read_bytes()
    with pytest.raises(UserError, match="other settings .*lr"):
        pretrain_command(config(corpus, lr=1e-3), out, resume=True, show_progress=False, threads=1)
    assert (ckpt / "checkpoint.pt").read_bytes() == before and not out.exists()


@pytest.mark.parametrize("settings, message", [
    ({"objective": "nope"}, "unknown objective"),
    ({"max_length": 1024}, r"--max-length: expected an integer from 8 to 512 \(got 1024\)"),
    ({"size": "huge"}, "unknown size"),
    ({"objective": "nsp", "batch_size": 1}, "batch size of at least 2"),
])
def test_bad_settings_fail_before_writing(corpus, tmp_path, settings, message):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=message):
        pretrain_command(config(corpus, **settings), out, show_progress=False, threads=1)
    assert not out.exists() and not checkpoint_dir(out).exists()


def test_empty_corpus_fails_before_writing(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n")
    with pytest.raises(UserError, match="no usable text"):
        pretrain_command(config(str(empty)), tmp_path / "out", show_progress=False, threads=1)
    assert not (tmp_path / "out").exists() and not checkpoint_dir(tmp_path / "out").exists()


def cli(capsys, *argv: str) -> tuple[int, str]:
    """The command in this process (the entry point's own subprocess test is in test_cli.py):
    exit code and stderr."""
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_cli_tokenizer_and_pretrain_bad_input(corpus, tmp_path, capsys):
    tok = tmp_path / "tok"
    code, err = cli(capsys, "tokenizer", "--corpus", corpus, "--kind", "bpe", "--vocab-size", "400", "--out", str(tok))
    assert code == 0, err
    assert json.loads((tok / "tokenizer_metrics.json").read_text())["unk_token_rate"] == 0.0
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", str(tmp_path / "missing.txt"),
                    "--steps", "2", "--tokenizer", str(tok), "--out", str(tmp_path / "p"))
    assert code == 2 and err.startswith("error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "p").exists()
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--steps", "2", "--tokenizer",
                    str(tok), "--warmup-ratio", "1.5", "--out", str(tmp_path / "p"))
    assert code == 2 and err == ("error: compressor pretrain: argument --warmup-ratio: expected a number in [0, 1) "
                                 "(got 1.5)\n")
    assert not (tmp_path / "p").exists()
    # Refused at the flag, as other numbers are, not later by the model's 512 positions.
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--steps", "2", "--tokenizer",
                    str(tok), "--max-length", "600", "--out", str(tmp_path / "p"))
    assert code == 2 and err == ("error: compressor pretrain: argument --max-length: expected an integer from 8 to "
                                 "512 (got 600)\n")
    assert not (tmp_path / "p").exists()
    code, err = cli(capsys, "embeddings", "--corpus", corpus, "--lr", "0", "--out", str(tmp_path / "e"))
    assert code == 2 and err == "error: compressor embeddings: argument --lr: expected a positive number (got 0)\n"
    assert not (tmp_path / "e").exists()


def test_dae_noise_options_reach_the_objective_metrics_and_model(corpus, tmp_path):
    options = objective_options("dae", "infilling,rotation", 0.4, ("poisson=3.5",))
    cfg = config(corpus, "dae", steps=2, objective_options=options)
    assert cfg.objective_options == "infill=0.4,rotate=1.0,poisson=3.5"      # canonical
    objective, _, _ = prepare(cfg)
    assert objective.noise == NoiseConfig(infill=0.4, rotate=1.0, poisson=3.5)
    metrics = pretrain_command(cfg, tmp_path / "dae", show_progress=False, threads=1)
    assert metrics["objective_options"] == cfg.objective_options
    recorded = json.loads((tmp_path / "dae" / "config.json").read_text())["pretraining"]
    assert recorded["objective_options"] == cfg.objective_options


def test_equal_options_spelled_differently_resume_alike(corpus, tmp_path):
    ckpt = tmp_path / "run.checkpoint"
    ckpt.mkdir()
    first = config(corpus, "dae", objective_options=objective_options("dae", "permutation,infilling", 0.3))
    (ckpt / SETTINGS_FILE).write_text(json.dumps(first.model_dump(mode="json")))
    (ckpt / "checkpoint.pt").write_bytes(b"state")       # a checkpoint to resume
    same = config(corpus, "dae", objective_options="infill=0.3,permute=1").model_dump(mode="json")
    check_resume(same, ckpt, resume=True, settings_file=SETTINGS_FILE)
    other = config(corpus, "dae", objective_options="infill=0.4,permute").model_dump(mode="json")
    with pytest.raises(UserError, match="objective_options"):
        check_resume(other, ckpt, resume=True, settings_file=SETTINGS_FILE)


def test_cli_dae_noise_errors_are_one_line(corpus, tmp_path, capsys):
    code, err = cli(capsys, "pretrain", "--objective", "dae", "--dae-noise", "infilling,shuffle", "--corpus", corpus,
                    "--steps", "2", "--out", str(tmp_path / "p"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error:") and "infill (text infilling)" in err   # lists the functions
    assert not (tmp_path / "p").exists() and not checkpoint_dir(tmp_path / "p").exists()
    with pytest.raises(UserError, match="configure --objective dae"):
        objective_options("mlm", mask_ratio=0.3)


@pytest.mark.parametrize("objective", ["rtd", "span"])
def test_deliverable_reloads_as_a_classifier_with_every_trained_weight(corpus, tmp_path, objective, tiny_task,
                                                                       monkeypatch):
    """What `compressor finetune` loads is exactly what pretraining trained: every tensor of
    the encoder (embeddings shared with ELECTRA's generator, or tied to SpanBERT's MLM and
    SBO softmaxes, included) and the same hidden states. Only the classification head (and
    BERT's pooler, which MLM-style objectives never train) is new."""
    import compressor.cli.pretrain_command as command
    delivered = {}

    def keep_deliverable(*args, **kwargs):
        model, metrics = run_pretraining(*args, **kwargs)
        delivered["model"] = model
        return model, metrics
    run_pretraining = command.run_pretraining
    monkeypatch.setattr(command, "run_pretraining", keep_deliverable)
    out = tmp_path / objective
    pretrain_command(config(corpus, objective, steps=3), out, show_progress=False, threads=1)
    trained = delivered["model"].base_model
    model, tokenizer = load_classifier(str(out), tiny_task.label_names)
    loaded = model.base_model.state_dict()
    expected = trained.state_dict()
    assert {k for k in loaded if not k.startswith("pooler.")} == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)
    batch = tokenizer(["a dog: a domesticated carnivore", "to run fast"], padding=True, return_tensors="pt")
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        torch.testing.assert_close(model.base_model.eval()(**batch).last_hidden_state,
                                   trained.eval()(**batch).last_hidden_state, rtol=0, atol=0)


def test_pretrain_never_replaces_a_fine_tuned_model(corpus, tmp_path, capsys):
    """A finetune output also holds config.json and metrics.json; its compressor.json marks it."""
    out = tmp_path / "my-classifier"
    out.mkdir()
    for name in ("config.json", "metrics.json", "compressor.json"):
        (out / name).write_text("{}")
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--size", "tiny", "--steps", "2",
                    "--out", str(out))
    assert code == 2 and "holds a model `compressor finetune` or `run` wrote" in err
    assert sorted(p.name for p in out.iterdir()) == ["compressor.json", "config.json", "metrics.json"]


def test_init_without_tokenizer_reads_the_init_models_own(corpus, tmp_path, capsys):
    """--init DIR continues that model with its own tokenizer (its embedding rows are its ids),
    not the default 'minilm', which another vocabulary would refuse."""
    tok, first = tmp_path / "tok", tmp_path / "first"
    code, err = cli(capsys, "tokenizer", "--corpus", corpus, "--kind", "wordpiece", "--vocab-size", "300",
                    "--out", str(tok))
    assert code == 0, err
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--size", "tiny", "--steps", "2",
                    "--batch-size", "4", "--max-length", "32", "--tokenizer", str(tok), "--out", str(first))
    assert code == 0, err
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", corpus, "--init", str(first), "--steps", "2",
                    "--batch-size", "4", "--max-length", "32", "--out", str(tmp_path / "again"))
    assert code == 0, err
    assert json.loads((tmp_path / "again" / "metrics.json").read_text())["config"]["tokenizer"] == str(first)


def test_a_bad_byte_late_in_the_corpus_is_refused_before_anything_is_written(corpus, tmp_path, capsys):
    """The stream would reach it only when training got there (after checkpoints), or never."""
    late = tmp_path / "late.txt"
    text = Path(corpus).read_text(encoding="utf-8")
    late.write_bytes(text.encode("utf-8") + b"\n\nbad \xff byte\n")
    line = text.count("\n") + 3
    code, err = cli(capsys, "pretrain", "--objective", "mlm", "--corpus", str(late), "--size", "tiny", "--steps", "2",
                    "--batch-size", "4", "--max-length", "32", "--out", str(tmp_path / "p"))
    assert code == 2 and f"late.txt: line {line}: corpus file is not UTF-8 text" in err
    assert not (tmp_path / "p").exists() and not checkpoint_dir(tmp_path / "p").exists()


def test_a_setting_the_config_refuses_is_named_by_the_flag_that_sets_it(tmp_path):
    """The commands' own callers (and the checks argparse cannot make) get the flag the user
    would type, as export's and search's errors name theirs; not the config field `vocab_size`."""
    from compressor.cli.pretrain_command import embeddings_command, tokenizer_command
    with pytest.raises(UserError) as err:
        tokenizer_command("wordnet", "wordpiece", 0, tmp_path / "t")
    assert str(err.value) == "--vocab-size: expected a positive integer (got 0)"
    with pytest.raises(UserError) as err:
        embeddings_command("wordnet", tmp_path / "e", {"dim": 1, "lr": None})
    assert str(err.value) == "--dim: expected an integer >= 2 (got 1)"
    with pytest.raises(UserError) as err:
        make_config(objective="mlm", corpus="wordnet", steps=2, warmup_ratio=1.5)
    assert str(err.value) == "--warmup-ratio: expected a number in [0, 1) (got 1.5)"
    # Checks across flags name every flag they concern, not `vocabulary size` or `objective 'clm'`.
    with pytest.raises(UserError) as err:
        tokenizer_command("wordnet", "bpe", 10, tmp_path / "t")
    assert str(err.value) == ("--vocab-size 10 is too small for --kind bpe; expected at least 261 (special tokens "
                              "plus the 256 bytes)")
    with pytest.raises(UserError) as err:
        make_config(objective="clm", corpus="wordnet", steps=2, init="minilm")
    assert str(err.value) == ("--init continues masked-LM pretraining; --objective clm builds its own model: "
                              "expected --objective mlm or mlm-wwm, or no --init")
    assert list(tmp_path.iterdir()) == []
