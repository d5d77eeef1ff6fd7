"""Deployable artifacts: ONNX export with a parity gate, ORT graph fusion, ORT quantization.

`onnx.export_bundle` is the entry point; `optimize` and `quantize` are its optional steps.
"""
