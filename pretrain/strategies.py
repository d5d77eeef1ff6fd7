"""Modules that fine-tuning strategies add to a Transformers classifier, and what each trains.

- `adapters` (Houlsby et al. 2019): a bottleneck x + up(gelu(down(x))) after the attention
  output projection and after the feed-forward output of every layer, before the residual
  LayerNorm. Initialised near the identity, so the model starts as the pretrained one.
  Trained: adapters, every LayerNorm, the head.
- `scalar-mix` (ELMo, Peters et al. 2018): the encoder's output becomes
  gamma * sum_j softmax(s)_j h_j over the hidden states of all layers (embeddings
  included), so the head reads the CLS position of the mix instead of the last layer's.
  Trained: the mix weights s, gamma and the head; the encoder is frozen (feature-based use).
- `frozen`: feature extraction, only the head trains.  `full`: everything trains.

Both modules stay inside the Transformers model: they are registered submodules (their
weights save into model.safetensors) wired in with forward hooks, and config.json records
them (`compressor_adapter_size`, `compressor_scalar_mix`) so `restore_added_modules` can
rebuild them when a saved dir is loaded. Plain `from_pretrained` does not know them and
drops their weights (with Transformers' "weights not used" warning): load such dirs with
`pretrain.models.load_saved_classifier`, or export them to ONNX, which traces the hooks.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Literal

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PreTrainedModel

from pretrain.errors import UserError
from pretrain.families import FAMILIES, families_supporting

Strategy = Literal["full", "frozen", "scalar-mix", "adapters"]
STRATEGIES: tuple[str, ...] = ("full", "frozen", "scalar-mix", "adapters")
# Houlsby's near-identity init: weights drawn with std 1e-3 (the official code's
# adapter_init_scale), zero biases, so each adapter starts as (almost) the identity.
ADAPTER_INIT_STD = 1e-3

class Adapter(nn.Module):
    """Houlsby bottleneck adapter: (..., hidden) -> (..., hidden), x + up(gelu(down(x)))."""

    def __init__(self, hidden: int, bottleneck: int, init_std: float = ADAPTER_INIT_STD):
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        for linear in (self.down, self.up):
            nn.init.normal_(linear.weight, std=init_std)
            nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(nn.functional.gelu(self.down(x)))

    def after(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        """Forward hook: adapt what the hooked module returns. A bound method, so a deepcopy
        of the model hooks the copied adapter, not this one."""
        return self(output)


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(s)_j h_j over (layers + 1) hidden states, each (batch, seq, hidden)."""

    def __init__(self, states: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(states))    # uniform mix at the start
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if len(hidden_states) != len(self.weights):
            raise RuntimeError(f"scalar mix expects {len(self.weights)} hidden states, "
                               f"got {len(hidden_states)} (layers were removed after adding it)")
        w = torch.softmax(self.weights, dim=0)
        return self.gamma * sum(w[j] * h for j, h in enumerate(hidden_states))

    def ask_hidden_states(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Forward pre-hook on the base model: it must return every layer's hidden states."""
        return args, {**kwargs, "output_hidden_states": True}

    def replace_output(self, module: nn.Module, args: tuple, kwargs: dict, output):
        """Forward hook on the base model: the mix replaces the last hidden state (and the
        pooled output, for families with a pooler), so the unchanged head reads the mix."""
        mixed = self(output.hidden_states)
        output["last_hidden_state"] = mixed
        pooler = getattr(module, "pooler", None)
        if pooler is not None and output.get("pooler_output") is not None:
            output["pooler_output"] = pooler(mixed)
        return output


def add_adapters(model: PreTrainedModel, bottleneck: int = 64, init_std: float = ADAPTER_INIT_STD) -> None:
    """Insert an adapter after the attention and feed-forward sublayers of every layer."""
    from pretrain.models import encoder_layers
    family = model.config.model_type
    if family not in FAMILIES or not FAMILIES[family].supports("adapters"):
        raise UserError(f"adapters are not available for model family {family!r}; "
                        f"expected one of: {', '.join(families_supporting('adapters'))}")
    if getattr(model.config, "compressor_adapter_size", None):
        return  # already has them
    try:
        layers = encoder_layers(model)
        sites = [(submodule(layer, hooked), submodule(layer, owner))
                 for layer in layers for hooked, owner in FAMILIES[family].adapter_sites]
    except AttributeError as err:
        raise UserError(f"cannot add adapters to this {family} model: a layer lacks {err.args[0]}; "
                        f"expected standard {family} layers") from None
    hidden = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.dim
    for hooked, owner in sites:
        adapter = Adapter(hidden, bottleneck, init_std)
        owner.add_module("adapter", adapter)
        hooked.register_forward_hook(adapter.after)
    model.config.compressor_adapter_size = bottleneck


def add_scalar_mix(model: PreTrainedModel) -> None:
    """Make the head read a learned mix of all layers instead of the last one."""
    from pretrain.models import encoder_layers
    family = FAMILIES.get(model.config.model_type)
    if getattr(model.config, "compressor_scalar_mix", False) or (family and family.builtin_scalar_mix):
        return   # a BiLM classifier reads ELMo's scalar mix already (it sits beside the head)
    if family and not family.supports("scalar-mix"):
        # its classifier does not read the encoder's last hidden state
        raise UserError(f"the scalar-mix strategy is not available for model family {family.name!r}: "
                        f"{family.refusals['scalar-mix']}; expected strategy full or frozen")
    mix = ScalarMix(len(encoder_layers(model)) + 1)
    model.add_module("scalar_mix", mix)          # beside the head: trained with it
    attach_scalar_mix(model, mix)
    model.config.compressor_scalar_mix = True


def attach_scalar_mix(model: PreTrainedModel, mix: ScalarMix) -> None:
    base = model.base_model
    base.register_forward_pre_hook(mix.ask_hidden_states, with_kwargs=True)
    base.register_forward_hook(mix.replace_output, with_kwargs=True)


def submodule(root: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        root = getattr(root, name)
    return root


def prepare(model: PreTrainedModel, strategy: str, adapter_size: int = 64,
            adapter_init_std: float = ADAPTER_INIT_STD) -> None:
    """Add what the strategy needs (idempotent: a model that has it keeps it)."""
    if strategy == "adapters":
        add_adapters(model, adapter_size, adapter_init_std)
    elif strategy == "scalar-mix":
        add_scalar_mix(model)


def trains(name: str, in_encoder: bool, strategy: str) -> bool:
    """Whether parameter `name` (inside the shared encoder or not) trains under `strategy`."""
    if strategy == "full" or not in_encoder:
        return True     # the head (and the scalar mix beside it) always trains
    if strategy == "adapters":
        return ".adapter." in name or "LayerNorm" in name or "layer_norm" in name
    return False        # frozen, scalar-mix: the encoder is frozen


@contextlib.contextmanager
def trainable_for(model: nn.Module, strategy: str, encoder: nn.Module) -> Iterator[int]:
    """Freeze what the strategy does not train; yield the trainable count; restore after.

    `encoder` is the (possibly shared) base model; everything else in `model` is head.
    """
    encoder_ids = {id(p) for p in encoder.parameters()}
    params = list(model.named_parameters())
    saved = [p.requires_grad for _, p in params]
    try:
        for (name, p), was in zip(params, saved):
            p.requires_grad_(was and trains(name, id(p) in encoder_ids, strategy))
        yield sum(p.numel() for _, p in params if p.requires_grad)
    finally:
        for (_, p), was in zip(params, saved):
            p.requires_grad_(was)


def restore_added_modules(model: PreTrainedModel, directory: Path) -> None:
    """Rebuild adapters / scalar mix recorded in config.json and load their saved weights."""
    size = getattr(model.config, "compressor_adapter_size", None)
    mix = getattr(model.config, "compressor_scalar_mix", False)
    if not size and not mix:
        return
    if size:
        model.config.compressor_adapter_size = None
        add_adapters(model, int(size))
    if mix:
        model.config.compressor_scalar_mix = False
        add_scalar_mix(model)
    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        raise UserError(f"{directory} records adapters or a scalar mix but has no model.safetensors "
                        f"to load them from")
    saved = load_file(str(weights))
    wanted = {name for name, _ in model.named_parameters() if ".adapter." in name or name.startswith("scalar_mix.")}
    missing = sorted(wanted - saved.keys())
    if missing:
        raise UserError(f"{weights} lacks weights of the recorded added modules, e.g. {missing[0]}")
    model.load_state_dict({k: saved[k] for k in wanted}, strict=False)
