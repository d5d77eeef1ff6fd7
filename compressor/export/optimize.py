"""ONNX Runtime transformer fusion (attention, skip-layernorm, bias-gelu, embed-layernorm).

Fusion is an optimisation, never a requirement: if ORT's optimizer raises or finds no
pattern, the caller keeps the unfused graph and records why (`Fusion.fallback`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compressor.export.quiet import quiet_logs
from pretrain.models import first_line


@dataclass(frozen=True)
class Fusion:
    path: Path | None               # the fused graph; None when the unfused one is kept
    fusions: dict[str, int]         # fused operator -> count, only those that applied
    fallback: str | None = None     # why the unfused graph is kept


# Fusions a caller may leave out -> ORT's FusionOptions flag.
FUSION_FLAGS = {"Attention": "enable_attention", "EmbedLayerNormalization": "enable_embed_layer_norm"}


# model_type -> ONNX Runtime optimizer's model type. The BERT-shaped encoders share one
# pattern (as in Optimum); BART has its own. Families absent here (xlnet: relative attention
# ORT has no fusion for; bilm: LSTMs) keep their unfused graph, and the record says why.
ORT_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "electra": "bert",
                   "distilbert": "bert", "bart": "bart"}
NOT_FUSABLE = {"bilm": "fusion does not apply to family 'bilm': ONNX Runtime's transformer "
                       "optimizer fuses Transformer layers and this model is LSTMs"}


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
    family = config.model_type if config is not None else "bert"
    if family not in ORT_MODEL_TYPES:
        return Fusion(None, {}, NOT_FUSABLE.get(family, f"ONNX Runtime's transformer optimizer has no fusion "
                                                        f"for model family {family!r}; the unfused graph is kept"))
    model_type = ORT_MODEL_TYPES[family]
    heads, hidden = (config.encoder_attention_heads, config.d_model) if model_type == "bart" else (0, 0)
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
    model.save_model_to_file(str(target))
    return Fusion(target, applied)
