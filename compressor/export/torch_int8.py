"""`torch-dynamic-int8`: a PyTorch deployment with int8 Linear layers and an int8 word embedding.

torch.ao dynamic quantization replaces every nn.Linear by an int8-weight Linear that
quantizes its input per batch, and the word embedding by an 8-bit per-row embedding (the
embedding is half of MiniLM's parameters). Such a model cannot be written with
`save_pretrained` (safetensors holds no packed int8 weights), so the export dir holds:

    config.json, tokenizer files   the architecture and vocabulary, as in an HF dir
    model.int8.pt                  the quantized state dict: the only weights in the dir

and `load_int8_model` rebuilds the architecture from config.json, applies the same
quantization to the empty model and loads the state dict into it (torch.load with
weights_only=True: quantized tensors are plain data). The dir's size is the real int8 size.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from pretrain.errors import UserError
from pretrain.models import first_line

INT8_FILE = "model.int8.pt"


def word_embedding_name(model: PreTrainedModel) -> str:
    embedding = model.get_input_embeddings()
    return next(name for name, module in model.named_modules() if module is embedding)


def quantized_copy(model: PreTrainedModel) -> nn.Module:
    """An int8 copy of `model` (the input is untouched).

    Only the word embedding gets the embedding qconfig: the position and token-type
    lookups are small, and BERT feeds them expanded (non-contiguous) index tensors, which
    the quantized embedding kernel rejects.
    """
    from torch.ao.quantization import (default_dynamic_qconfig, float_qparams_weight_only_qconfig,
                                       quantize_dynamic)
    spec = {nn.Linear: default_dynamic_qconfig,
            word_embedding_name(model): float_qparams_weight_only_qconfig}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch.ao's deprecation notices
        return quantize_dynamic(copy.deepcopy(model).eval(), spec, dtype=torch.qint8)


def save_int8_model(model: nn.Module, directory: Path) -> Path:
    path = Path(directory) / INT8_FILE
    torch.save(model.state_dict(), path)
    return path


def load_int8_model(directory: Path) -> nn.Module:
    directory = Path(directory)
    try:
        config = AutoConfig.from_pretrained(str(directory))
        skeleton = AutoModelForSequenceClassification.from_config(config)
        model = quantized_copy(skeleton)
        state = read_int8_state(directory / INT8_FILE)
        model.load_state_dict(state)
    except (OSError, ValueError, RuntimeError, KeyError) as err:
        raise UserError(f"cannot load the int8 PyTorch model in {directory}: {first_line(err)}") from None
    return model.eval()


def read_int8_state(path: Path) -> dict:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True)
    except OSError:
        raise
    except Exception:   # truncated or foreign: one line (not torch's advice to load with weights_only=False)
        raise ValueError(f"{path} is not a readable int8 state dict (truncated, or not written by this tool); "
                         "expected the file `compressor export --quantize torch-dynamic-int8` writes") from None


def is_int8_dir(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / INT8_FILE).is_file()
