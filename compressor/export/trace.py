"""Tracing a Transformers classifier to an ONNX graph: inputs, the one logits output, fix-ups.

The graph: opset 17, dynamic batch and sequence axes; inputs input_ids, attention_mask
(and token_type_ids when the model takes them), output logits.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

from compressor.export.einsum import weight_einsums_as_matmuls
from pretrain.errors import UserError
from pretrain.families import FAMILIES, SUPPORTED_FAMILIES
from pretrain.models import first_line

OPSET = 17
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def check_exportable(model: PreTrainedModel) -> None:
    family = model.config.model_type
    if family not in SUPPORTED_FAMILIES:
        raise UserError(f"cannot export model family {family!r}: the ONNX exporter supports "
                        f"{', '.join(SUPPORTED_FAMILIES)}")


def input_names(model: PreTrainedModel, tokenizer_outputs: list[str] | None = None) -> tuple[str, ...]:
    """The graph's inputs, in the order of model.forward's parameters.

    token_type_ids only when the tokenizer produces them too: a RoBERTa tokenizer does not,
    and a graph that required them would fail on what the tokenizer feeds it (the model
    then uses its own all-zero default, traced into the graph).
    """
    params = list(inspect.signature(model.forward).parameters)
    wanted = [n for n in INPUT_NAMES if n in params]
    if tokenizer_outputs is not None and "token_type_ids" not in tokenizer_outputs:
        wanted = [n for n in wanted if n != "token_type_ids"]
    return tuple(sorted(wanted, key=params.index))


def write_onnx(model: PreTrainedModel, path: Path, names: tuple[str, ...] | None = None) -> None:
    """Trace `model` to an ONNX file with dynamic batch and sequence axes.

    The TorchScript exporter (dynamo=False), because it is the one that works here: the
    dynamo exporter needs onnxscript, which is not a dependency, and torch.export
    specialises on the example's shapes unless every dimension is declared. Tracing records
    each layer's own head count and FFN width as constants, so models with per-layer head
    counts (prune_heads) or sliced FFNs export as they are.
    """
    check_exportable(model)
    names = names or input_names(model)
    example = example_inputs(names, model.config)
    axes = {name: {0: "batch", 1: "sequence"} for name in names} | {"logits": {0: "batch"}}
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the TorchScript exporter's tracer notices
            torch.onnx.export(LogitsOnly(model, names), tuple(example[n] for n in names), str(path),
                              input_names=list(names), output_names=["logits"],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    except Exception as err:  # tracing raises many types on modules it cannot follow
        raise UserError(f"ONNX export of the {model.config.model_type} model failed: {first_line(err)}") from None
    if any(isinstance(m, torch.nn.LSTM) for m in model.modules()):   # spare other graphs a reload
        lstm_weights_as_initializers(path)
    if FAMILIES[model.config.model_type].einsum_projections:
        # einsums over [hidden, heads, head_dim] weights: rewritten as MatMuls so that
        # quantization reaches them (export/einsum.py)
        weight_einsums_as_matmuls(path)


def lstm_weights_as_initializers(path: Path) -> None:
    """Turn the Constant nodes feeding LSTM weights (W, R) into initializers.

    The BiLM's recurrent weight is a product computed outside the trace
    (pretrain/bilm_model.py `lstmp`), which the exporter writes as a Constant node;
    ONNX Runtime's quantizer only quantizes LSTM weights held as initializers. Graphs
    without LSTMs are left untouched.
    """
    import onnx
    proto = onnx.load(str(path))
    producers = {out: node for node in proto.graph.node for out in node.output}
    moved = []
    for node in proto.graph.node:
        if node.op_type != "LSTM":
            continue
        for name in node.input[1:3]:
            source = producers.get(name)
            if source is not None and source.op_type == "Constant" and source not in moved:
                tensor = onnx.helper.get_attribute_value(source.attribute[0])
                tensor.name = name
                proto.graph.initializer.append(tensor)
                moved.append(source)
    if moved:
        for node in moved:
            proto.graph.node.remove(node)
        onnx.save(proto, str(path))


class LogitsOnly(torch.nn.Module):
    """The graph's one output: logits. Encoder-decoders (BART) and XLNet also return caches
    (past key values, mems) and encoder states that a classifier never needs; asking for
    none keeps them out of the graph."""

    NO_CACHE = {"use_cache": False, "use_mems": False}   # forward flags that turn caches off

    def __init__(self, model: PreTrainedModel, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names
        params = inspect.signature(model.forward).parameters
        self.flags = {k: v for k, v in self.NO_CACHE.items() if k in params}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs)), **self.flags).logits


def example_inputs(names: tuple[str, ...], config) -> dict[str, torch.Tensor]:
    """A padded batch of 2 x 8: the second row ends in padding so the mask path is traced.

    (An all-ones mask lets some attention implementations skip the mask, which tracing
    would then bake into the graph.) Families that read the end-of-sequence token (BART
    classifies from the last EOS of each row) get one EOS as each row's last real token and
    nowhere else, as a tokenized batch has.
    """
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (2, 8), generator=generator)
    mask = torch.ones((2, 8), dtype=torch.long)
    mask[1, 5:] = 0
    eos = getattr(config, "eos_token_id", None)
    if eos is not None:
        ids[ids == eos] = 1 if eos != 1 else 2
        ids[0, 7] = ids[1, 4] = eos
        ids[1, 5:] = config.pad_token_id if config.pad_token_id is not None else 0
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": torch.zeros((2, 8), dtype=torch.long)}
