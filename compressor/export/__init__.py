"""Deployable artifacts: ONNX export with a parity gate, ORT graph fusion, ORT quantization.

`onnx.export_bundle` is the entry point (`onnx.export_into` the same into a dir the caller
owns, as the pipeline's cached stages do); `optimize` and `quantize` are its optional steps.
"""
