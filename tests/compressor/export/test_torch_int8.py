"""Loading a torch-dynamic-int8 deployment dir: bad files are one-line errors."""

from __future__ import annotations

import shutil

import pytest
import torch

from compressor.export.torch_int8 import INT8_FILE, load_int8_model
from pretrain.errors import UserError


class Foreign:
    """Not a tensor: torch.load(weights_only=True) refuses to unpickle it."""


@pytest.mark.parametrize("write", [lambda path: path.write_bytes(b"junk"),
                                   lambda path: torch.save({"w": Foreign()}, path)], ids=["junk", "foreign"])
def test_an_unreadable_int8_file_is_one_line_naming_it(tiny_bert_dir, tmp_path, write):
    # Not a traceback (a junk file raised struct.error), nor torch's advice to load it with
    # weights_only=False (running the file's code).
    shutil.copy(tiny_bert_dir / "config.json", tmp_path / "config.json")
    write(tmp_path / INT8_FILE)
    with pytest.raises(UserError) as caught:
        load_int8_model(tmp_path)
    assert str(caught.value) == (f"cannot load the int8 PyTorch model in {tmp_path}: {tmp_path / INT8_FILE} is not "
                                 "a readable int8 state dict (truncated, or not written by this tool); expected the "
                                 "file `compressor export --quantize torch-dynamic-int8` writes")
