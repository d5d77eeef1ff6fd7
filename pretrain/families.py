"""What each supported model family is made of and supports, in one place.

One frozen record per `config.model_type`. Passes, strategies, the exporter and the
baselines look families up here instead of keeping their own tables, so adding a family (or
a capability) is one edit. Paths are attribute paths: `layers` under the base model
(`model.base_model`), the attention and FFN paths under one layer of that list. XLNet's
attention projections are parameters, not modules (einsum weights [hidden, heads, head_dim]).

`refusals` names each capability the family lacks and why (the reason ends up in the
one-line error a user sees). Capabilities: "inc", "optimum-export", "scalar-mix",
"drop-layers", "prune-heads", "prune-ffn", "share-layers", "adapters", "domain-mlm", "fusion".

ALBERT has no per-layer modules: its `num_hidden_layers` layers apply the weights of
`num_hidden_groups` shared layer groups (one, as released), so `layers` is None and the
capabilities that act on one layer's weights are refused with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from pretrain.errors import UserError

CAPABILITIES = ("inc", "optimum-export", "scalar-mix", "drop-layers", "prune-heads", "prune-ffn",
                "share-layers", "adapters", "domain-mlm", "fusion", "student", "theseus", "prune-magnitude",
                "prune-movement", "layer-distill")


@dataclass(frozen=True)
class Attention:
    """One layer's attention projections, relative to the layer."""
    query: str
    key: str
    value: str
    output: str


@dataclass(frozen=True)
class FeedForward:
    """One layer's FFN: `inner` (hidden -> intermediate) and `outer` (intermediate -> hidden)."""
    inner: str
    outer: str


@dataclass(frozen=True)
class Family:
    name: str                                      # config.model_type
    layers: str | None                             # nn.ModuleList of layers, under the base model
    attention: Attention | None
    ffn: FeedForward | None
    layer_count_fields: tuple[str, ...] = ()       # config fields that count the layers at `layers`
    heads_field: str | None = None                 # config field: attention heads per layer
    hidden_field: str | None = None                # config field: hidden (model) width
    intermediate_field: str | None = None          # config field: FFN width of every layer
    ort_model_type: str | None = None              # ONNX Runtime transformer optimizer's model type
    # Per layer: (module whose output an adapter follows, module the adapter is registered in).
    adapter_sites: tuple[tuple[str, str], ...] = ()
    # The masked-LM model's prediction head as attribute names applied in order: (N, hidden) -> (N, vocab).
    mlm_head: tuple[str, ...] = ()
    einsum_projections: bool = False               # attention weights are einsums (export rewrites them)
    builtin_scalar_mix: bool = False               # the classifier reads a scalar mix already
    # Per layer: the modules (paths under one layer) of each sublayer that `share-layers`
    # may share alone: "attention" (with its LayerNorm) and "ffn" (with its LayerNorm).
    sublayers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # ALBERT: its shared layer groups (`layers` is None), num_hidden_groups modules that the
    # encoder applies at num_hidden_layers depths
    layer_groups: str | None = None
    refusals: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.refusals) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"family {self.name}: unknown capabilities {sorted(unknown)}")
        object.__setattr__(self, "refusals", MappingProxyType(dict(self.refusals)))
        object.__setattr__(self, "sublayers", MappingProxyType(dict(self.sublayers)))

    def supports(self, capability: str) -> bool:
        return capability not in self.refusals

    def check(self, capability: str, what: str) -> None:
        """Raise the one-line UserError `what: reason` when the family lacks `capability`."""
        if not self.supports(capability):
            raise UserError(f"{what}: {self.refusals[capability]}")


BERT_ATTENTION = Attention("attention.self.query", "attention.self.key", "attention.self.value",
                           "attention.output.dense")
BERT_FFN = FeedForward("intermediate.dense", "output.dense")
BERT_ADAPTER_SITES = (("attention.output.dropout", "attention.output"), ("output.dropout", "output"))
BERT_SUBLAYERS = {"attention": ("attention",), "ffn": ("intermediate", "output")}
NO_TRANSFORMER_LAYERS = "this family has no Transformer layers"
ALBERT_SHARED = ("ALBERT's layers are one shared layer group applied at every depth, so there are no "
                 "per-layer weights to ")


def bert_like(name: str, mlm_head: tuple[str, ...]) -> Family:
    """BERT's layer layout, shared by RoBERTa, XLM-RoBERTa and ELECTRA."""
    return Family(name, "encoder.layer", BERT_ATTENTION, BERT_FFN, ("num_hidden_layers",),
                  "num_attention_heads", "hidden_size", "intermediate_size", ort_model_type="bert",
                  adapter_sites=BERT_ADAPTER_SITES, mlm_head=mlm_head, sublayers=BERT_SUBLAYERS)


def without_layers(name: str, made_of: str, own: dict[str, str]) -> dict[str, str]:
    """The refusals every family without Transformer layers shares, plus its own."""
    layer_passes = ("drop-layers", "prune-heads", "prune-ffn", "share-layers", "adapters")
    return {"optimum-export": "Optimum's ONNX exporter does not support that family",
            **dict.fromkeys(layer_passes, NO_TRANSFORMER_LAYERS),
            "fusion": f"fusion does not apply to family {name!r}: ONNX Runtime's transformer "
                      f"optimizer fuses Transformer layers and this model is {made_of}",
            **own}


FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in (
    bert_like("bert", ("cls",)),
    bert_like("roberta", ("lm_head",)),
    bert_like("xlm-roberta", ("lm_head",)),
    bert_like("electra", ("generator_predictions", "generator_lm_head")),
    Family("distilbert", "transformer.layer",
           Attention("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
           FeedForward("ffn.lin1", "ffn.lin2"), ("n_layers",), "n_heads", "dim", "hidden_dim",
           ort_model_type="bert", adapter_sites=(("attention.out_lin", "attention"), ("ffn.dropout", "ffn")),
           mlm_head=("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
           sublayers={"attention": ("attention", "sa_layer_norm"), "ffn": ("ffn", "output_layer_norm")}),
    # BART's layers are its encoder's: the decoder stays whole (its last EOS state is what
    # BartForSequenceClassification classifies), so drop-layers shortens the part that reads
    # the whole input.
    Family("bart", "encoder.layers",
           Attention("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"),
           FeedForward("fc1", "fc2"), ("encoder_layers", "num_hidden_layers"), "encoder_attention_heads",
           "d_model", "encoder_ffn_dim", ort_model_type="bart",
           sublayers={"attention": ("self_attn", "self_attn_layer_norm"), "ffn": ("fc1", "fc2", "final_layer_norm")},
           refusals={"scalar-mix": "BART classifies from its decoder's state at the last EOS, not from a mix "
                                   "of encoder layers",
                     "prune-heads": "Transformers has no head pruning for BART",
                     "adapters": "no adapter sites are defined for BART layers",
                     "domain-mlm": "BART has no masked-LM head (it is a denoising seq2seq model)"}),
    Family("xlnet", "layer", Attention("rel_attn.q", "rel_attn.k", "rel_attn.v", "rel_attn.o"),
           FeedForward("ff.layer_1", "ff.layer_2"), ("num_hidden_layers",), "n_head", "d_model", "d_inner",
           einsum_projections=True, sublayers={"attention": ("rel_attn",), "ffn": ("ff",)},
           refusals={"optimum-export": "Optimum's ONNX exporter does not support that family",
                     "prune-heads": "Transformers has no head pruning for XLNet",
                     "adapters": "no adapter sites are defined for XLNet layers",
                     "domain-mlm": "XLNet has no masked-LM head",
                     # relative attention, which ORT's transformer optimizer has no pattern for
                     "fusion": "ONNX Runtime's transformer optimizer has no fusion for model family 'xlnet'; "
                               "the unfused graph is kept"}),
    # ALBERT: BERT's layer and its ONNX graph (ORT fuses it as 'bert'), with a factorized
    # embedding and one set of layer weights (see the module doc).
    Family("albert", None, None, None, heads_field="num_attention_heads", hidden_field="hidden_size",
           intermediate_field="intermediate_size", ort_model_type="bert", layer_groups="encoder.albert_layer_groups",
           refusals={
               "drop-layers": ALBERT_SHARED + "drop (lower num_hidden_layers in its config instead)",
               "prune-heads": ALBERT_SHARED + "prune head by head",
               "prune-ffn": ALBERT_SHARED + "prune neuron by neuron",
               "student": ALBERT_SHARED + "keep layer by layer (lower num_hidden_layers instead, or build the "
                          "student with `shape:`)",
               "theseus": ALBERT_SHARED + "replace block by block",
               "prune-magnitude": ALBERT_SHARED + "mask layer by layer",
               "prune-movement": ALBERT_SHARED + "mask layer by layer",
               "layer-distill": ALBERT_SHARED + "read layer by layer",
               "share-layers": "ALBERT's layers already share one set of weights (num_hidden_groups)",
               "scalar-mix": ALBERT_SHARED + "mix (the strategy counts layers by their modules)",
               "adapters": "no adapter sites are defined for ALBERT layers",
               "domain-mlm": "domain MLM is not wired to ALBERT's masked-LM head"}),
    # The ELMo-style BiLM pretrained here (pretrain/objectives/bilm.py): LSTMs, not
    # Transformer layers, so layer and attention passes refuse it.
    Family("bilm", None, None, None, builtin_scalar_mix=True, refusals=without_layers("bilm", "LSTMs", {
        # torch.export unrolls an LSTM over the example's length (the sequence axis cannot stay
        # dynamic), and INC's PT2E quantizer has no LSTM: it would tune only the classifier
        # head while ONNX Runtime ships int8 LSTMs it never evaluated.
        "inc": "torch.export cannot keep an LSTM's sequence length dynamic and INC's PT2E quantizer has "
               "no LSTM; expected quantize mode dynamic-int8 (int8 LSTMs) for a bilm model",
        "domain-mlm": "the BiLM has no masked-LM head"})),
    # The 1-D CNN student of `distill-structure` (pretrain/textcnn.py).
    Family("textcnn", None, None, None, refusals=without_layers("textcnn", "convolutions", {
        "inc": "Neural Compressor's tuning is set up here for Transformer and LSTM models, not for "
               "convolutions over text; expected quantize mode dynamic-int8 for a textcnn model",
        "scalar-mix": "a textcnn classifier has no layers to mix",
        "domain-mlm": "the textcnn classifier has no masked-LM head"})),
)})

SUPPORTED_FAMILIES = tuple(FAMILIES)
TRANSFORMER_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.layers is not None)


def family_of(model_type: str) -> Family:
    """The record of a supported family (one-line UserError naming the supported ones otherwise)."""
    if model_type not in FAMILIES:
        raise UserError(f"model family {model_type!r} is not supported; "
                        f"expected one of: {', '.join(SUPPORTED_FAMILIES)}")
    return FAMILIES[model_type]


def families_supporting(capability: str) -> tuple[str, ...]:
    return tuple(name for name, f in FAMILIES.items() if f.supports(capability))
