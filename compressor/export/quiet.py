"""Silence library logging for the duration of one call.

ONNX Runtime's fusion and quantization tools log advice on the root logger (e.g. "consider
pre-processing"); on a CLI whose errors are one line, that chatter buries the message. The
previous levels are restored afterwards, so nothing global outlives the call.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any, Iterator

NOISY_LOGGERS = ("", "onnxruntime", "onnxruntime.transformers", "fusion", "onnx_model",
                 "onnx_model_bert")


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    # ORT's transformer tools create module-level loggers named after their modules.
    named = [name for name in list(logging.root.manager.loggerDict)
             if name.startswith(("onnxruntime", "fusion_", "onnx_model"))]
    with muted((*NOISY_LOGGERS, *named)):
        yield


def import_keeping_root_logging(module: str) -> Any:
    """Import `module`, undoing any logging.basicConfig it runs at import.

    onnxruntime.quantization.matmul_nbits_quantizer calls basicConfig(level=INFO) at module
    level: from then on every library's INFO lines (ORT's "Model saved to ...", our own stage
    lines, even under --quiet) reached stderr with timestamps for the rest of the process.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return importlib.import_module(module)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def muted(names) -> Iterator[None]:
    """The named loggers at ERROR within the block, their own levels back after it."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def scratch_cwd() -> Iterator[None]:
    """Run ONNX Runtime tools from a temporary working dir, restored afterwards.

    Its symbolic shape inference saves `sym_shape_infer_temp.onnx` and a weights file of
    the model's size into the *current* dir when it cannot type every tensor; without
    this, a user's working dir would collect 100 MB of debris. Callers pass absolute paths.
    """
    import os

    from pretrain.atomic import scratch_dir
    with scratch_dir("ort") as tmp:
        previous = os.getcwd()
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(previous)
