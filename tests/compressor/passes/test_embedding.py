"""The word-embedding passes: `factorize-embedding` (and the factored embedding in the
export) and `trim-vocab`."""

from __future__ import annotations

import onnx
import pytest
import torch
from pydantic import ValidationError

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.passes import Context, apply_pass, get_pass
from pretrain.errors import UserError

LOOSE = ExportSettings(optimize=True, accuracy_tolerance=1.0)


def factorized(bundle, task, rank):
    cfg = get_pass("factorize-embedding").config_type.model_validate({"rank": rank})
    return apply_pass(bundle, "factorize-embedding", cfg, Context(task=task, show_progress=False))


def test_the_embedding_becomes_its_best_rank_r_approximation(bert_bundle, tiny_task):
    before = bert_bundle.model.get_input_embeddings().weight.detach().clone()
    out = factorized(bert_bundle, tiny_task, 8)
    after = out.model.get_input_embeddings().weight.detach()
    singular = torch.linalg.svdvals(after.double())
    assert singular[7] > 1e-3 * singular[0] and singular[8] < 1e-5 * singular[0]   # rank 8 in float32
    # Eckart-Young: the error is exactly the energy of the dropped singular values.
    s = torch.linalg.svdvals(before.double())
    assert torch.linalg.norm((after - before).double()) == pytest.approx(float(s[8:].norm()), rel=1e-4)
    assert out.deploy["embedding_rank"] == 8
    vocab, hidden = after.shape        # the report counts the two factors the export stores
    assert bert_bundle.params - out.params == vocab * hidden - 8 * (vocab + hidden)


def test_export_stores_the_factors_and_keeps_parity(bert_bundle, tiny_task, tmp_path):
    dense = export_bundle(bert_bundle, tmp_path / "dense", LOOSE, tiny_task).record
    out = factorized(bert_bundle, tiny_task, 8)
    record = export_bundle(out, tmp_path / "low", LOOSE, tiny_task).record
    assert record["parity_max_abs_diff"] <= 1e-4          # the factored graph computes the torch model
    vocab, hidden = out.model.get_input_embeddings().weight.shape
    assert record["embedding_factorized"] == {"rank": 8, "parameters": (vocab + hidden) * 8,
                                              "dense_parameters": vocab * hidden}
    shapes = [tuple(t.dims) for t in onnx.load(str(tmp_path / "low" / "model.onnx")).graph.initializer]
    assert (vocab, 8) in shapes and (8, hidden) in shapes and (vocab, hidden) not in shapes
    # 30522 x 32 -> 30522 x 8 + 8 x 32: about a quarter of the embedding bytes.
    assert record["size_bytes"] < 0.5 * dense["size_bytes"]
    int8 = export_bundle(out.replace(deploy={**out.deploy, "quantize": {"mode": "dynamic-int8"}}),
                         tmp_path / "low8", LOOSE, tiny_task).record
    assert int8["size_bytes"] < 0.4 * record["size_bytes"]


def test_a_rank_that_saves_nothing_is_rejected(bert_bundle, tiny_task):
    with pytest.raises(UserError, match="rank 32 saves nothing"):
        factorized(bert_bundle, tiny_task, 32)


# --- trim-vocab ---

def trimmed(bundle, task, **options):
    cfg = get_pass("trim-vocab").config_type.model_validate(options)
    return apply_pass(bundle, "trim-vocab", cfg, Context(task=task, show_progress=False))


@pytest.fixture(scope="module")
def trim(tiny_bert_dir, tiny_task):
    """(the tiny BERT, its trimmed copy), built once for the module's checks."""
    bundle = ModelBundle.load(tiny_bert_dir)
    return bundle, trimmed(bundle, tiny_task)


def test_training_texts_tokenize_to_the_same_tokens(trim, tiny_task):
    bundle, out = trim
    train = tiny_task.split("train").texts
    old = bundle.tokenizer(train)["input_ids"]
    new = out.tokenizer(train)["input_ids"]
    kept = bundle.tokenizer.convert_tokens_to_ids(out.tokenizer.convert_ids_to_tokens(range(len(out.tokenizer))))
    renumber = {old_id: new_id for new_id, old_id in enumerate(kept)}
    assert new == [[renumber[i] for i in row] for row in old]
    used = {i for row in old for i in row}
    assert set(kept) == used | set(bundle.tokenizer.all_special_ids)   # nothing else kept
    assert len(out.tokenizer) == out.model.config.vocab_size == len(kept) < 0.2 * len(bundle.tokenizer)
    # The kept rows are the original rows, in order.
    assert torch.equal(out.model.get_input_embeddings().weight,
                       bundle.model.get_input_embeddings().weight[kept])
    assert out.params == bundle.params - (len(bundle.tokenizer) - len(kept)) * 32


def test_unseen_pieces_become_unk_and_the_bundle_reloads(trim, tmp_path):
    bundle, out = trim
    text = "λόγος"                             # pieces of the full vocab, none in the tiny train split
    assert bundle.tokenizer.unk_token_id not in bundle.tokenizer(text)["input_ids"]
    assert out.tokenizer.convert_ids_to_tokens(out.tokenizer(text)["input_ids"]) == ["[CLS]", "[UNK]", "[SEP]"]
    loaded = ModelBundle.load(out.save(tmp_path / "trimmed"))
    probe = ["a plant: λόγος of the genus", "noun.person: someone who runs"]
    assert loaded.tokenizer(probe)["input_ids"] == out.tokenizer(probe)["input_ids"]
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)


def test_trimmed_model_exports_and_quantizes_smaller(trim, tiny_task, tmp_path):
    bundle, out = trim
    fp32 = export_bundle(out, tmp_path / "fp32", LOOSE, tiny_task).record
    assert fp32["parity_max_abs_diff"] <= 1e-4
    int8 = export_bundle(out.replace(deploy={"quantize": {"mode": "dynamic-int8"}}), tmp_path / "int8", LOOSE, tiny_task).record
    # The untrimmed tiny BERT is ~1M fp32 weights, all but 40k of them embedding rows.
    assert fp32["size_bytes"] < 0.2 * 4 * bundle.params and int8["size_bytes"] < 0.5 * fp32["size_bytes"]


def test_min_count_and_the_validation_split(trim, tiny_task):
    bundle, out = trim
    rare = trimmed(bundle, tiny_task, min_count=3)
    wider = trimmed(bundle, tiny_task, splits=["train", "validation"])
    assert len(rare.tokenizer) < len(out.tokenizer) < len(wider.tokenizer)


@pytest.mark.parametrize("options, why", [({"splits": ["test"]}, "train"), ({"splits": ["train", "train"]}, "distinct"),
                                          ({"min_count": 0}, "greater than or equal to 1")])
def test_trim_vocab_config_validation(options, why):
    with pytest.raises(ValidationError, match=why):
        get_pass("trim-vocab").config_type.model_validate(options)



def test_a_benchmark_feeds_the_trimmed_model_the_teachers_batches_renumbered(trim, tiny_task, tmp_path):
    from compressor.bench.profiles import load_profile
    from compressor.bench.runners import Deployable, id_translation, input_batches, load_runner
    bundle, out = trim
    model = Deployable("trimmed", "torch", out.save(tmp_path / "trimmed"), "fp32")
    ids = id_translation(model, bundle.tokenizer)
    assert id_translation(Deployable("same", "torch", bundle.save(tmp_path / "same"), "fp32"), bundle.tokenizer) is None
    train = tiny_task.split("train").head(8)
    batch, = input_batches(bundle.tokenizer, train, 8, "real")   # the teacher's ids, as a benchmark feeds them
    own = out.tokenizer(train.texts, padding=True, return_tensors="np")["input_ids"]
    assert (ids[batch["input_ids"]] == own).all()
    runner = load_runner(model, load_profile("cpu"), ids)
    assert runner.run(runner.prepare(batch)).shape == (8, len(tiny_task.label_names))
