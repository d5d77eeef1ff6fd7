"""Passes, one module per family. Importing this package registers all of them."""

from compressor.passes.registry import (Context, LazyTeacher, PassConfig, PassSpec, apply_pass,
                                        check_pass_family, get_pass, pass_name_of, pass_names, register)
from compressor.passes import embedding, layers, quantization, theseus, training  # noqa: F401  (registration side effect)

__all__ = ["Context", "LazyTeacher", "PassConfig", "PassSpec", "apply_pass", "check_pass_family", "get_pass",
           "pass_name_of", "pass_names", "register"]
