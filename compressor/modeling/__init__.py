"""Model surgery and helpers the passes share (not passes themselves).

    structure.py   prune_heads, set_intermediate_size, tie_layers; keeps the config's
                   structure record in step
    fake_quant.py  fake quantization of Linear layers for quantization-aware training
"""
