"""Why did the `rtd` and `span` deliverables fine-tune to a constant class? Probe saved models.

For each HF model dir (a `compressor pretrain` deliverable or an untrained one), on the first
64 wordnet-supersense train glosses, without any fine-tuning:
- `reload`: the tensors AutoModelForSequenceClassification loads vs the saved file (missing,
  unexpected, differing), and non-finite weights;
- `input_dependence`: std across examples of the last hidden states ([CLS] and text tokens;
  LayerNorm outputs, rms about 1), as in benchmarks/pretraining_objectives.py;
- `residual`: at the input of every sublayer's LayerNorm, the rms of the vector shared by all
  tokens of all examples and of what varies around it (a large shared part that LayerNorm
  divides by is what drowns the input-dependent signal);
- `attention`: per layer, [CLS]'s attention to itself, to [SEP] and to the text (uniform is
  what an untrained model does);
- `first_step_grad_norm`: gradient norms per module group of the classification loss on those
  64 examples with a fresh head (what fine-tuning starts from).

    .venv/bin/python benchmarks/collapse_probe.py DIR... --out benchmarks/results/X.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def probe(model_dir: Path, examples: int = 64) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification
    from pretrain.batching import collate, encode, usable_length
    from pretrain.data import load_task
    from pretrain.models import load_classifier
    task = load_task("wordnet-supersense")
    saved = load_file(str(model_dir / "model.safetensors"))
    # A dir that already has a head for other labels (a fine-tuned model) loads with a fresh one.
    _, info = AutoModelForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=len(task.label_names), output_loading_info=True, ignore_mismatched_sizes=True)
    model, tokenizer = load_classifier(str(model_dir), task.label_names, seed=0)
    state = model.state_dict()
    differing = [k for k, v in saved.items() if k in state and not torch.equal(state[k], v)]
    data = encode(tokenizer, task.split("train").head(examples), usable_length(model))
    batch = collate(data, np.arange(len(data)))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    mask = batch["attention_mask"].bool()
    sep = batch["input_ids"] == tokenizer.sep_token_id
    text = mask & ~torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids))
    seen: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, i[0].detach()))
             for name, module in model.base_model.named_modules() if name.endswith("output.LayerNorm")]
    model.eval()
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
    for hook in hooks:
        hook.remove()
    last = out.hidden_states[-1]
    residual = {}
    for name, x in seen.items():
        tokens = x[mask]
        shared = tokens.mean(0)
        residual[name] = {"shared_rms": round(float(shared.pow(2).mean().sqrt()), 3),
                          "varying_rms": round(float((tokens - shared).pow(2).mean().sqrt()), 3)}
    attention = []
    for layer in out.attentions:
        row = layer[:, :, 0, :]
        to_self, to_sep = float(row[:, :, 0].mean()), float((row * sep[:, None, :]).sum(-1).mean())
        attention.append({"cls_to_cls": round(to_self, 3), "cls_to_sep": round(to_sep, 3),
                          "cls_to_text": round(1 - to_self - to_sep, 3)})
    model.train()
    torch.manual_seed(0)
    model(**batch).loss.backward()
    groups: dict[str, float] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            parts = name.split(".")
            key = ".".join(parts[:4]) if ".layer." in name else ".".join(parts[:2])
            groups[key] = groups.get(key, 0.0) + float(p.grad.pow(2).sum())
    return {"config": {k: model.config.to_dict().get(k) for k in ("architectures", "max_position_embeddings",
                                                                   "pad_token_id", "layer_norm_eps")},
            "reload": {"missing": info["missing_keys"], "unexpected": info["unexpected_keys"],
                       "differing_from_file": differing,
                       "non_finite": [k for k, v in saved.items() if not torch.isfinite(v).all()]},
            "input_dependence": {"cls_std": round(float(last[:, 0].std(0).mean()), 4),
                                 "token_std": round(float(last[text].std(0).mean()), 4)},
            "residual": residual, "attention": attention,
            "first_step_grad_norm": {k: float(f"{v ** 0.5:.3g}") for k, v in groups.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--note", action="append", default=[], help="a line recorded with the results")
    args = p.parse_args()
    torch.set_num_threads(1)
    from compressor.bench.environment import environment
    from pretrain.atomic import write_json
    results = {str(m): probe(m) for m in args.models}
    write_json(args.out, {"benchmark": "collapse probe of pretrained deliverables (no fine-tuning)",
                          "script": "benchmarks/collapse_probe.py " + " ".join(sys.argv[1:]),
                          "notes": args.note, "models": results, "environment": environment()})
    for name, r in results.items():
        print(name, r["input_dependence"], r["reload"]["differing_from_file"])


if __name__ == "__main__":
    main()
