"""The `quantize` pass: choose the precision a variant is deployed in.

ONNX Runtime quantization acts on the exported graph, so the pass records the request on
the bundle (`deploy["quantize"]`, saved in compressor.json) and leaves the torch weights
as they are: the torch model computes the same function (preserves_function=True), and
the exporter quantizes, then gates accuracy, when the recipe's `export:` section is on.
"""

from __future__ import annotations

from compressor.bundle import ModelBundle
from compressor.export.quantize import QuantizeConfig
from compressor.passes.registry import Context, register


@register("quantize", QuantizeConfig, preserves_function=True)
def quantize_pass(bundle: ModelBundle, cfg: QuantizeConfig, ctx: Context) -> ModelBundle:
    # A copy, not the input model: passes never hand their input on (the registry checks),
    # and later passes may train this one.
    return bundle.replace(model=bundle.copy_model(),
                          deploy={**bundle.deploy, "quantize": cfg.model_dump(mode="json")})
