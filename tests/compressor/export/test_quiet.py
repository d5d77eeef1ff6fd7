import logging
import sys

from compressor.export.quiet import import_keeping_root_logging

NBITS = "onnxruntime.quantization.matmul_nbits_quantizer"


def test_a_module_that_configures_logging_at_import_leaves_the_root_logger_as_it_was(monkeypatch):
    # ORT's int4 quantizer runs logging.basicConfig(level=INFO) when first imported; after it,
    # every library's INFO lines reached stderr, even under --quiet. Import it afresh.
    monkeypatch.delitem(sys.modules, NBITS, raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])     # as in a CLI process (pytest adds its own)
    handlers, level = [], root.level
    module = import_keeping_root_logging(NBITS)
    assert hasattr(module, "MatMulNBitsQuantizer")
    assert root.handlers == handlers and root.level == level
