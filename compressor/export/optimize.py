"""ONNX Runtime transformer fusion (attention, skip-layernorm, bias-gelu, embed-layernorm).

Fusion is an optimisation, never a requirement: if ORT's optimizer raises or finds no
pattern, the caller keeps the unfused graph and records why (`Fusion.fallback`).

The residual LayerNorms may stay unfused (`SkipLayerNormalization` among `unfused`): on
onnxruntime 1.30 and later the CPU kernel of the fused SkipLayerNormalization runs several
times slower than an elementwise sum followed by LayerNormalization (benchmarks/README.md,
"Residual LayerNorms"). The residual add then becomes a two-input `Sum`: ONNX Runtime fuses
`Add` + `LayerNormalization` back into SkipLayerNormalization when a session loads the graph,
but not `Sum`, so the graph runs unfused under any session options, Optimum's included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compressor.export.quiet import quiet_logs
from pretrain.families import FAMILIES
from pretrain.models import first_line


@dataclass(frozen=True)
class Fusion:
    path: Path | None               # the fused graph; None when the unfused one is kept
    fusions: dict[str, int]         # fused operator -> count, only those that applied
    fallback: str | None = None     # why the unfused graph is kept


# Fusions a caller may leave out -> ORT's FusionOptions flag.
FUSION_FLAGS = {"Attention": "enable_attention", "EmbedLayerNormalization": "enable_embed_layer_norm",
                "SkipLayerNormalization": "enable_skip_layer_norm"}


def fuse(source: Path, target: Path, unfused: tuple[str, ...] = (), config=None) -> Fusion:
    """Fuse the graph at `source` into `target`; `config` (the model's HF config) picks
    ORT's optimizer model type (BERT-shaped when None).

    BERT-shaped: num_heads=0 and hidden_size=0 make ORT read both from each attention's
    Reshape nodes, so models whose layers have different head counts (prune_heads) fuse
    too; fixed values would be wrong for every pruned layer. BART's optimizer needs them
    given, from the config. opt_level=0 applies only the Python fusions, so the saved graph
    stays portable across CPUs (no hardware-specific ORT rewrites). `unfused` names
    fusions (FUSION_FLAGS) to leave out.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    # The BERT-shaped encoders share one ORT pattern (as in Optimum); BART has its own; a
    # family without one (pretrain/families.py) keeps its unfused graph, and the record says why.
    name = config.model_type if config is not None else "bert"
    family = FAMILIES.get(name)
    if family is None or family.ort_model_type is None:
        why = family.refusals.get("fusion") if family else None
        return Fusion(None, {}, why or f"ONNX Runtime's transformer optimizer has no fusion for model family "
                                       f"{name!r}; the unfused graph is kept")
    model_type = family.ort_model_type
    heads, hidden = ((getattr(config, family.heads_field), getattr(config, family.hidden_field))
                     if model_type == "bart" else (0, 0))
    options = FusionOptions(model_type)
    for op in unfused:
        setattr(options, FUSION_FLAGS[op], False)
    try:
        with quiet_logs():
            model = optimize_model(str(source), model_type=model_type, num_heads=heads, hidden_size=hidden,
                                   opt_level=0, optimization_options=options)
            counts = model.get_fused_operator_statistics()
    except Exception as err:  # the optimizer raises many types on graphs it cannot read
        return Fusion(None, {}, f"fusion failed: {first_line(err)}")
    applied = {op: int(n) for op, n in counts.items() if n}
    if not applied:
        return Fusion(None, {}, "no fusion pattern matched the graph")
    if "SkipLayerNormalization" in unfused:
        applied["residual Sum + LayerNormalization"] = residual_adds_as_sums(model.model.graph)
    model.save_model_to_file(str(target))
    return Fusion(target, applied)


def residual_adds_as_sums(graph) -> int:
    """Turn every Add of two computed tensors that feeds a LayerNormalization (a residual add)
    into the equivalent two-input Sum, which ONNX Runtime's session-time SkipLayerNormFusion
    does not match; bias adds (one input an initializer) stay Adds. Returns how many changed."""
    producers = {out: node for node in graph.node for out in node.output}
    changed = 0
    for norm in graph.node:
        add = producers.get(norm.input[0]) if norm.op_type == "LayerNormalization" else None
        computed = add is not None and all(name in producers and producers[name].op_type != "Constant"
                                           for name in add.input)
        if computed and add.op_type == "Add":
            add.op_type = "Sum"
            changed += 1
    return changed
