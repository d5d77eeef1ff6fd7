"""Model types of this tool that Transformers does not know (`bilm`, `textcnn`): a saved dir
ships their modeling file, so that it loads without this package.

Transformers' remote code: config.json's `auto_map` names the class each Auto class should
build, from a module file in the same dir, and `from_pretrained(DIR, trust_remote_code=True)`
imports it from there. So `AutoModelForSequenceClassification` loads a BiLSTM or CNN student
with plain Transformers, and Optimum's `ORTModelForSequenceClassification` and the
text-classification pipeline load its ONNX dir. Both files import only torch and
Transformers (a remote module may import nothing else of ours). Where this package is
imported it has registered the types itself, and Transformers uses those classes instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pretrain import bilm_model, textcnn

# model_type -> (module, {Auto class: class name in that module})
SHIPPED_CODE = {
    "bilm": (bilm_model, {"AutoConfig": "BiLMConfig", "AutoModel": "BiLanguageModel",
                          "AutoModelForSequenceClassification": "BiLMForSequenceClassification"}),
    "textcnn": (textcnn, {"AutoConfig": "TextCNNConfig",
                          "AutoModelForSequenceClassification": "TextCNNForSequenceClassification"}),
}


def ship_model_code(directory: Path) -> None:
    """Copy the modeling file of the model type that `directory`/config.json names, as
    `modeling_<type>.py`, and point its `auto_map` there; nothing for other model types."""
    config_file = Path(directory) / "config.json"
    config = json.loads(config_file.read_text())
    shipped = SHIPPED_CODE.get(config.get("model_type"))
    if shipped is None:
        return
    module, classes = shipped
    name = f"modeling_{config['model_type']}"
    shutil.copyfile(module.__file__, Path(directory) / f"{name}.py")
    config["auto_map"] = {**config.get("auto_map", {}), **{auto: f"{name}.{cls}" for auto, cls in classes.items()}}
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
