"""The `factorize-embedding` pass and the factored embedding in the export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

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
    dense = export_bundle(bert_bundle, tmp_path / "dense", LOOSE, tiny_task)
    out = factorized(bert_bundle, tiny_task, 8)
    record = export_bundle(out, tmp_path / "low", LOOSE, tiny_task)
    assert record["parity_max_abs_diff"] <= 1e-4          # the factored graph computes the torch model
    vocab, hidden = out.model.get_input_embeddings().weight.shape
    assert record["embedding_factorized"] == {"rank": 8, "parameters": (vocab + hidden) * 8,
                                              "dense_parameters": vocab * hidden}
    shapes = [tuple(t.dims) for t in onnx.load(str(tmp_path / "low" / "model.onnx")).graph.initializer]
    assert (vocab, 8) in shapes and (8, hidden) in shapes and (vocab, hidden) not in shapes
    # 30522 x 32 -> 30522 x 8 + 8 x 32: about a quarter of the embedding bytes.
    assert record["size_bytes"] < 0.5 * dense["size_bytes"]
    int8 = export_bundle(out.replace(deploy={**out.deploy, "quantize": {"mode": "dynamic-int8"}}),
                         tmp_path / "low8", LOOSE, tiny_task)
    assert int8["size_bytes"] < 0.4 * record["size_bytes"]


def test_a_rank_that_saves_nothing_is_rejected(bert_bundle, tiny_task):
    with pytest.raises(UserError, match="rank 32 saves nothing"):
        factorized(bert_bundle, tiny_task, 32)
