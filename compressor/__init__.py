"""Compression and deployment optimizer for pretrained NLP encoders."""

__version__ = "0.5.0"

__all__ = ["Pipeline", "__version__"]


def __getattr__(name: str):
    # Lazy: `import compressor` stays light (the memory probe child imports only what its
    # runtime needs), and `from compressor import Pipeline` still works.
    if name == "Pipeline":
        from compressor.pipeline.api import Pipeline
        return Pipeline
    raise AttributeError(f"module 'compressor' has no attribute {name!r}")
