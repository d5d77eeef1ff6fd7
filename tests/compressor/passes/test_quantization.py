"""The `qat` and `sensitivity` passes, their fake quantization, and how the int8 export uses them."""

from __future__ import annotations

import math

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch.nn.utils import parametrize

from compressor.export.graph_map import linear_nodes
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.export.trace import write_onnx
from compressor.modeling.fake_quant import fake_quantize, linear_layers, q8bert_fake_quant
from compressor.passes import Context, apply_pass, get_pass
from compressor.pipeline.recipe import parse_step
from pretrain.errors import UserError

LOOSE = ExportSettings(optimize=True, accuracy_tolerance=1.0)


def ctx(task) -> Context:
    return Context(task=task, seed=0, show_progress=False)


def config(name: str, **values):
    return get_pass(name).config_type.model_validate(values)


def test_fake_quantize_rounds_to_255_levels_and_passes_gradients_straight_through():
    x = torch.linspace(-3, 3, 1001, requires_grad=True)
    y = fake_quantize(x, torch.tensor(2.0))
    assert len(torch.unique(y.detach())) <= 255
    assert y.detach().abs().max() == pytest.approx(2.0)           # clipped to the threshold
    assert (y.detach() - x.detach())[x.detach().abs() <= 2].abs().max() <= 1 / 127 + 1e-6
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))                   # straight-through


def test_q8bert_context_quantizes_weights_tracks_ema_ranges_and_cleans_up(make_tiny_bert):
    model = make_tiny_bert().train()
    linear = model.bert.encoder.layer[0].intermediate.dense
    trained_weight = linear.weight.detach().clone()
    first, second = torch.randint(1, 1000, (2, 6)), torch.randint(1, 1000, (2, 6))
    seen = []
    hook = linear.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().abs().max()))
    with q8bert_fake_quant(model, ema_decay=0.9) as ranges:
        assert len(torch.unique(linear.weight.detach())) <= 255
        assert linear.weight.detach().abs().max() == pytest.approx(trained_weight.abs().max())
        model(input_ids=first)
        model(input_ids=second)
    hook.remove()
    assert set(ranges) == set(linear_layers(model))
    expected = 0.9 * seen[0] + 0.1 * seen[1]
    assert float(ranges["bert.encoder.layer.0.intermediate.dense"].threshold) == pytest.approx(float(expected))
    assert not parametrize.is_parametrized(linear)
    assert torch.equal(linear.weight, trained_weight) and isinstance(linear.weight, torch.nn.Parameter)


def test_qat_refuses_mixed_precision():
    with pytest.raises(UserError, match="qat trains in fp32") as err:
        parse_step({"qat": {"precision": "bf16"}}, "variants.v[0]")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family, blocks", [("bilm", "LSTMs"), ("textcnn", "convolutions")])
def test_qat_and_sensitivity_refuse_families_without_linear_blocks_up_front(family, blocks):
    """distill-structure then qat trained only the classifier head quantized, and the export it
    set (`scope: linears`) kept the LSTMs in float: larger than plain dynamic int8. A recipe
    refuses it before any stage runs (shape_after checks the family as the steps leave it)."""
    from compressor.passes import check_pass_family
    from compressor.passes.quantization import QATConfig, SensitivityConfig
    from compressor.passes.registry import Known, Shape, shape_after
    with pytest.raises(UserError, match=rf"^qat: a '{family}' model has no Linear layers to train quantized "
                                        rf"but its classifier head \(its {blocks} would stay float.*expected "
                                        r"quantize: \{mode: dynamic-int8\}") as err:
        check_pass_family("qat", QATConfig(), family)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=rf"^sensitivity: .*its {blocks} are not scored"):
        check_pass_family("sensitivity", SensitivityConfig(), family)
    shape = Shape(family)
    with pytest.raises(UserError, match="^qat: "):
        shape_after("qat", QATConfig(), Known(model=shape, teacher=shape))
    for transformer in ("bert", "distilbert", "albert"):
        check_pass_family("qat", QATConfig(), transformer)


def test_qat_trains_with_the_loop_and_records_ranges_for_every_linear(bert_bundle, tiny_task):
    cfg = config("qat", epochs=1, batch_size=16, lr=1e-3, max_train_samples=48)
    out = apply_pass(bert_bundle, "qat", cfg, ctx(tiny_task))
    qat = out.deploy["qat"]
    assert qat["steps"] == 3 and qat["samples"] == 48
    assert set(qat["activation_ranges"]) == set(linear_layers(out.model))
    assert all(t > 0 for t in qat["activation_ranges"].values())
    assert out.deploy["quantize"]["mode"] == "static-int8" and out.deploy["quantize"]["per_channel"] is False
    before, after = bert_bundle.model.state_dict(), out.model.state_dict()
    assert before.keys() == after.keys()                              # a plain Transformers model again
    assert not torch.equal(before["bert.encoder.layer.1.output.dense.weight"],
                           after["bert.encoder.layer.1.output.dense.weight"])


def test_a_stopped_qat_resumes_from_its_checkpoint_with_identical_weights_and_ranges(bert_bundle, tiny_task,
                                                                                     stopped_then_resumed):
    """The pass checkpoints in the stage's work dir with its ranges' EMA state, so a stopped
    recipe resumes QAT there and ends where an uninterrupted QAT ends."""
    from compressor.passes import quantization
    cfg = config("qat", epochs=1, batch_size=16, lr=1e-3, max_train_samples=96, ema_decay=0.5)   # 6 steps
    reference = apply_pass(bert_bundle, "qat", cfg, ctx(tiny_task))
    saved, steps, resumed = stopped_then_resumed(quantization, "qat", bert_bundle, cfg, tiny_task)
    assert saved["progress"]["step"] == 4
    assert saved["model"]["bert.encoder.layer.0.intermediate.dense.input_range.observations"] == 4
    assert steps == [5, 6]
    assert resumed.deploy["qat"] == reference.deploy["qat"]           # ranges, steps, samples, loss
    a, b = reference.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def quantize_scales(graph) -> dict[str, float]:
    """Activation tensor -> the scale its QuantizeLinear uses."""
    model = onnx.load(str(graph))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[1] in inits and inits[n.input[1]].size == 1}


def test_qat_export_uses_the_learned_ranges(bert_bundle, tiny_task, tmp_path):
    cfg = config("qat", epochs=1, batch_size=16, lr=1e-3, max_train_samples=48)
    out = apply_pass(bert_bundle, "qat", cfg, ctx(tiny_task))
    record = export_bundle(out, tmp_path / "q", LOOSE, tiny_task).record
    assert record["precision"] == "static-int8" and record["qat_ranges_applied"] >= 4
    # The intermediate (FFN-in) dense of layer 2 reads a tensor only it reads: its uint8 scale
    # must be the learned symmetric range 2t/255, not a calibrated one.
    name = "bert.encoder.layer.2.intermediate.dense"
    threshold = out.deploy["qat"]["activation_ranges"][name]
    scales = quantize_scales(tmp_path / "q" / "model.onnx")
    assert any(scale == pytest.approx(2 * threshold / 255, rel=1e-4) for scale in scales.values())


def test_qat_export_computes_what_qat_simulated(bert_bundle, tiny_task, tmp_path):
    """The int8 graph's logits are the fake-quantized torch model's, not just close to fp32's:
    the export quantizes exactly the tensors QAT trained with (Linear weights and inputs, the
    word embedding) with QAT's ranges, and nothing else."""
    import numpy as np
    from compressor.evaluate import onnx_logits_fn
    from pretrain.batching import encode
    from pretrain.finetune import predict_logits
    model = bert_bundle.copy_model()
    with torch.no_grad():
        model.classifier.weight *= 100   # a random head is near uniform; make outputs respond
    cfg = config("qat", epochs=1, batch_size=16, lr=1e-3, max_train_samples=48)
    out = apply_pass(bert_bundle.replace(model=model), "qat", cfg, ctx(tiny_task))
    record = export_bundle(out, tmp_path / "q", LOOSE, tiny_task).record
    assert out.deploy["quantize"]["scope"] == "linears"
    assert record["quantized_linears"] == len(linear_layers(out.model))   # each Linear its own node
    assert record["quantized_embedding_lookups"] == 1 and record["fusions_left_out"]
    data = encode(out.tokenizer, tiny_task.split("test"))
    int8 = onnx_logits_fn(tmp_path / "q" / "model.onnx")(data)
    fp32 = predict_logits(out.model, data)
    model = out.copy_model().train()
    with q8bert_fake_quant(model, ema_decay=0.5) as ranges:
        model(input_ids=torch.randint(1, 1000, (1, 6)))   # a training forward creates the ranges
        for name, r in ranges.items():
            r.threshold = torch.tensor(out.deploy["qat"]["activation_ranges"][name])
        simulated = predict_logits(model.eval(), data)
    # Not bit-exact: float sums in a different order flip the odd rounding at a half step.
    to_simulation, to_fp32 = np.abs(int8 - simulated).mean(), np.abs(int8 - fp32).mean()
    assert to_simulation < int8_kernel_error_bound() * to_fp32, (to_simulation, to_fp32)


def int8_kernel_error_bound() -> float:
    """How far, relative to fp32, ORT's int8 result may stray from the exact integer product.
    With VNNI (or AMX, or on ARM) the uint8 x int8 kernel sums in 32 bits: measured 0.0015 to
    0.030 of the distance to fp32 over eight QAT models (seeds 0-3, packed and torch dropout
    masks, on AMX; the flips at a half step depend on the weights). x86 CPUs without them multiply-add pairs into 16 bits (VPMADDUBSW),
    which saturates when two large products meet, as ORT's quantization docs warn: measured
    0.13 on an AVX2 EPYC. An unquantized graph would sit at 1."""
    import platform
    from compressor.bench.environment import cpu_flags
    exact = platform.machine() not in ("x86_64", "AMD64") or cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}
    return 0.05 if exact else 0.3


def test_linear_scope_graph_runs_every_linear_as_an_integer_kernel(bert_bundle, tiny_task, tmp_path):
    """Static int8 of the Linear layers only: int8 reaches nothing but the Linears and the
    embedding lookup; residuals stay float; ORT runs each Linear as an integer matmul and
    never dequantizes the whole embedding table."""
    import onnxruntime as ort
    bundle = bert_bundle.replace(deploy={"quantize": {"mode": "static-int8", "scope": "linears",
                                                      "calibration_samples": 32}})
    record = export_bundle(bundle, tmp_path / "q", LOOSE, tiny_task).record
    assert record["fusions_left_out"] == ["Attention", "EmbedLayerNormalization", "SkipLayerNormalization"]
    assert record["fusions"]["residual Sum + LayerNormalization"] and "Attention" not in record["fusions"]
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    producers = {o: n for n in graph.node for o in n.output}
    for node in graph.node:   # only the Linears read rounded values (the looked-up rows are exact)
        rounded = [i for i in node.input if i in producers and producers[i].op_type == "DequantizeLinear"
                   and not producers[i].name.endswith("_DequantizeRows")]
        assert not rounded or node.op_type in ("MatMul", "Gemm"), (node.op_type, node.name)
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.name.endswith("word_embeddings/Gather"))
    table = next(t for t in graph.initializer if t.name == gather.input[0])
    assert table.data_type == onnx.TensorProto.INT8                     # int8 rows, dequantized after
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "runtime.onnx")
    ort.InferenceSession(str(tmp_path / "q" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    runtime = [n.op_type for n in onnx.load(str(tmp_path / "runtime.onnx")).graph.node]
    layers = bundle.model.config.num_hidden_layers
    assert runtime.count("MatMulIntegerToFloat") == 6 * layers and runtime.count("QGemm") == 2


def test_sensitivity_ranks_a_fragile_layer_first_and_records_every_score(bert_bundle, tiny_task):
    model = bert_bundle.copy_model()
    fragile = model.bert.pooler.dense
    with torch.no_grad():
        # One outlier channel in the pooler's input (as in real BERTs, only larger): its int8
        # range then rounds every other channel to zero. The float model computes the same.
        model.bert.encoder.layer[3].output.LayerNorm.weight[5] *= 1000.0
        model.bert.encoder.layer[3].output.LayerNorm.bias[5] *= 1000.0
        fragile.weight[:, 5] /= 1000.0
        model.classifier.weight *= 100   # a random head is near uniform; make outputs respond
    bundle = bert_bundle.replace(model=model)
    out = apply_pass(bundle, "sensitivity", config("sensitivity", keep_fraction=0.1, samples=64), ctx(tiny_task))
    record = out.deploy["sensitivity"]
    linears = linear_layers(model)
    assert record["keep"][0] == "bert.pooler.dense"
    assert len(record["keep"]) == math.ceil(0.1 * len(record["divergence"]))
    assert set(record["divergence"]) == set(record["loss_change"]) == set(linears)
    scores = list(record["divergence"].values())
    assert scores == sorted(scores, reverse=True) and min(scores) > -1e-6 and record["samples"] == 64
    assert torch.equal(out.model.bert.pooler.dense.weight, fragile.weight)


def test_sensitivity_needs_enough_train_examples(bert_bundle, tiny_task):
    with pytest.raises(UserError, match="samples=10000 but the train split"):
        apply_pass(bert_bundle, "sensitivity", config("sensitivity", samples=10000), ctx(tiny_task))


@pytest.mark.parametrize("mode", ["static-int8", "dynamic-int8"])
def test_int8_export_keeps_the_sensitive_layers_in_float(bert_bundle, tiny_task, tmp_path, mode):
    out = apply_pass(bert_bundle, "sensitivity", config("sensitivity", keep_fraction=0.2, samples=32), ctx(tiny_task))
    extra = {"calibration_samples": 32} if mode == "static-int8" else {}
    out = out.replace(deploy={**out.deploy, "quantize": {"mode": mode, **extra}})
    record = export_bundle(out, tmp_path / "q", LOOSE, tiny_task).record
    assert record["kept_layers"] == out.deploy["sensitivity"]["keep"] and record["kept_in_float"]
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    nodes = {n.name: n for n in graph.node}
    for kept in record["kept_in_float"]:
        assert nodes[kept].op_type in ("MatMul", "Attention", "Gemm")   # not replaced by an int8 op
        assert nodes[kept].input[1] in floats                            # its weight stays fp32


def test_dynamic_int8_keeps_kept_gemm_layers_in_float(bert_bundle, tiny_task, tmp_path):
    """The pooler and classifier export as Gemm nodes, which ORT's dynamic quantizer rewrites
    as MatMul + Add under new names before quantizing: they must still stay float."""
    keep = ["bert.pooler.dense", "classifier"]
    out = bert_bundle.replace(deploy={"sensitivity": {"keep": keep}, "quantize": {"mode": "dynamic-int8"}})
    record = export_bundle(out, tmp_path / "q", LOOSE, tiny_task).record
    assert len(record["kept_in_float"]) == 2 and all(n.endswith("Gemm") for n in record["kept_in_float"])
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    ops = {n.name: n.op_type for n in graph.node}
    for kept in record["kept_in_float"]:
        assert ops.get(kept, ops.get(f"{kept}_MatMul")) in ("Gemm", "MatMul")
    assert "MatMulInteger" in ops.values()


def test_graph_map_finds_every_encoder_linear_in_the_fused_graph(sliced_bundle_for_map, tmp_path):
    from compressor.export.optimize import fuse
    model = sliced_bundle_for_map.model
    write_onnx(model, tmp_path / "plain.onnx")
    fused = fuse(tmp_path / "plain.onnx", tmp_path / "fused.onnx").path
    for graph in (tmp_path / "plain.onnx", fused):
        found = linear_nodes(graph, model)
        encoder = [n for n in linear_layers(model) if ".encoder." in n]
        assert set(encoder) <= set(found), f"unmapped in {graph.name}: {set(encoder) - set(found)}"
    # Fusion merges query, key and value into one Attention node reading one tensor.
    attention = {found[f"bert.encoder.layer.0.attention.self.{p}"] for p in ("query", "key", "value")}
    assert len(attention) == 1


@pytest.fixture
def sliced_bundle_for_map(bert_bundle):
    model = bert_bundle.copy_model()
    model.prune_heads({0: [0], 1: [1, 2]})
    return bert_bundle.replace(model=model.eval())


def test_qat_default_lr_is_a_continuation_rate_for_full_and_the_strategys_rate_otherwise():
    from pretrain.finetune import DEFAULT_LR
    assert config("qat").lr == 2e-5
    assert config("qat", strategy="adapters").lr == DEFAULT_LR["adapters"] == 1e-3
    assert config("qat", strategy="frozen").lr == DEFAULT_LR["frozen"]
    assert config("qat", lr=1e-4).lr == 1e-4                                # the recipe's lr wins
    assert config("qat", strategy="adapters", lr=1e-4).lr == 1e-4
