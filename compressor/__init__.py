"""Compression and deployment optimizer for pretrained NLP encoders."""

import contextlib
import logging

__version__ = "0.5.0"

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


@contextlib.contextmanager
def import_chatter_muted():
    loggers = [logging.getLogger(name) for name in IMPORT_CHATTER]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
