"""Compression and deployment optimizer for pretrained NLP encoders."""

__version__ = "0.6.0"

__all__ = ["Pipeline", "__version__"]


def __getattr__(name: str):
    # Lazy: `import compressor` stays light (the memory probe child imports only what its
    # runtime needs), and `from compressor import Pipeline` still works.
    if name == "Pipeline":
        with import_chatter_muted():
            from compressor.pipeline.api import Pipeline
        return Pipeline
    raise AttributeError(f"module 'compressor' has no attribute {name!r}")


# torchao (which Transformers imports when neural-compressor-pt has installed it) logs CUDA
# kernels it cannot load, and torch a deprecation for torchao's enums, once, at import: noise
# for a CPU user of the Python API. The CLI mutes them for the whole process (cli/commands.py
# `quiet_libraries`); here only while our modules import, and the levels are put back.
IMPORT_CHATTER = ("torchao", "torch.utils._pytree")


def import_chatter_muted():
    from compressor.export.quiet import muted     # a light module: logging only
    return muted(IMPORT_CHATTER)
