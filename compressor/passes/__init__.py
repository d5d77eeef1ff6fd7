"""Passes, one module per family. Importing this package registers all of them."""

from compressor.passes.registry import (Context, LazyTeacher, PassConfig, PassSpec, apply_pass,
                                        check_pass_family, config_as_written, config_type_problem, get_pass,
                                        pass_name_of, pass_names, register)
# Importing each family's module registers its passes.
from compressor.passes import (distillation, embedding, layers, pruning, quantization,  # noqa: F401
                               shallow_students, sharing, sparsity, theseus, training)
from compressor.passes.plugins import load_plugins

load_plugins()      # passes other packages declare (entry point group encoder_compressor.passes)

__all__ = ["Context", "LazyTeacher", "PassConfig", "PassSpec", "apply_pass", "check_pass_family",
           "config_as_written", "config_type_problem", "get_pass", "pass_name_of", "pass_names", "register"]
