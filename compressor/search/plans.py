"""The compression plans the search chooses among, written as recipe steps.

A plan says how many of the teacher's layers stay (evenly spaced, the first always kept:
[0, 2, 4] of 6 for three), what share of the attention heads and of the FFN neurons goes
(taylor importance, ranked across layers), how the smaller model recovers (`finetune` on the
labels, `distill` from the teacher on soft targets and labels, or `theseus` module
replacing, which replaces blocks of layers and so prunes nothing), and the precision it
ships in. `plan_steps` turns it into the passes a recipe variant lists, so a plan is
trained, exported and benchmarked by the same pipeline as a hand-written variant, and the
chosen plan is handed back as a recipe.
"""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from compressor.search.latency import Precision, Structure, TeacherShape

Recovery = Literal["finetune", "distill", "theseus"]
RECOVERIES: tuple[Recovery, ...] = ("finetune", "distill", "theseus")
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8")
INT8_STEP = {"quantize": {"mode": "dynamic-int8", "per_channel": True}}
DISTILL_LOSSES = {"losses": ["soft", "hard"], "temperature": 2.0}   # DistilBERT's pair, weights 1
SCORING_SAMPLES = 512         # the pruning passes' own default
PROXY_LR_GAIN_CAP = 10.0      # a proxy's rate is at most this multiple of its pass's default
MAX_HEADS_REMOVED = 0.75      # the search space's bounds (steps of REMOVED_STEP)
MAX_FFN_REMOVED = 0.9
REMOVED_STEP = 0.05


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    layers: int = Field(ge=1)
    heads_removed: float = Field(0.0, ge=0, lt=1)     # share of the kept layers' heads
    ffn_removed: float = Field(0.0, ge=0, lt=1)       # share of the kept layers' FFN neurons
    recovery: Recovery = "finetune"
    precision: Precision = "fp32"

    @model_validator(mode="after")
    def theseus_replaces_only(self) -> Plan:
        if self.recovery == "theseus" and (self.heads_removed or self.ffn_removed):
            raise ValueError("a theseus plan replaces blocks of layers; it removes no heads or FFN neurons")
        return self

    @property
    def training_key(self) -> str:
        """What the training depends on (not the precision): plans equal in it train the same."""
        return f"L{self.layers}-h{self.heads_removed:.2f}-f{self.ffn_removed:.2f}-{self.recovery}"

    @property
    def name(self) -> str:
        return f"{self.training_key}-{self.precision}"


def check_plan(plan: Plan, depth: int) -> None:
    """A plan the teacher's depth allows (theseus: each successor replaces equally many layers)."""
    if plan.layers > depth:
        raise ValueError(f"plan {plan.name} keeps {plan.layers} layers; the teacher has {depth}")
    if plan.recovery == "theseus" and (plan.layers == depth or depth % plan.layers):
        raise ValueError(f"a theseus plan needs successor layers that divide the teacher's {depth} "
                         f"layers into blocks of two or more; got {plan.layers}")


def kept_layers(depth: int, layers: int) -> list[int]:
    """Evenly spaced, first layer always: 3 of 6 -> [0, 2, 4] (the demo's three-layers)."""
    return [i * depth // layers for i in range(layers)]


def plan_steps(plan: Plan, depth: int, samples: int, epochs: float = 1.0,
               scoring_samples: int = SCORING_SAMPLES, lr: float | None = None) -> list[dict]:
    """The recipe steps of a plan; its training runs `epochs` over the first `samples` train
    rows (at `lr`, default: the recovery pass's own), and pruning scores importance on the
    first `scoring_samples`."""
    check_plan(plan, depth)
    training = {"epochs": epochs, "max_train_samples": samples, **({"lr": lr} if lr is not None else {})}
    scoring = {} if scoring_samples == SCORING_SAMPLES else {"samples": scoring_samples}
    if plan.recovery == "theseus":
        steps: list[dict] = [{"theseus": {"successor_layers": plan.layers, **training}}]
    else:
        steps = [{"drop-layers": {"keep": kept_layers(depth, plan.layers)}}] if plan.layers < depth else []
        if plan.heads_removed:
            steps.append({"prune-heads": {"fraction": plan.heads_removed, **scoring}})
        if plan.ffn_removed:
            steps.append({"prune-ffn": {"fraction": plan.ffn_removed, **scoring}})
        steps.append({"distill": {**DISTILL_LOSSES, **training}} if plan.recovery == "distill"
                     else {"finetune": training})
    return steps + ([INT8_STEP] if plan.precision == "int8" else [])


def proxy_lr(plan: Plan, depth: int) -> float:
    """A proxy's learning rate: its recovery pass's default, scaled by depth / layers kept (at
    most PROXY_LR_GAIN_CAP times). A proxy is ~60 steps. Measured on the demo teacher (2,000
    examples): the whole 6-layer model scores 0.822 at 1e-4 but 0.659 at 1e-3 (too large a
    step undoes fine-tuning), while 1- and 2-layer students are still at the majority class at
    1e-4 (0.11, 0.24) and reach 0.31 and 0.62 at 1e-3: the fewer layers kept, the further the
    head sits from its new inputs and the more a short run must move. At the scaled rates the
    proxies rank by depth as the finals do: 1 layer 0.31 (6e-4), 2 layers 0.51 (3e-4), 3 layers
    about 0.69, 6 layers 0.822."""
    from compressor.passes import get_pass
    base = get_pass(plan.recovery).config_type.default_lr["full"]
    return base * min(depth / plan.layers, PROXY_LR_GAIN_CAP)


def plan_structure(plan: Plan, shape: TeacherShape) -> Structure:
    """The shape a plan deploys, for the latency model. Pruning ranks heads and neurons across
    layers, so which layer loses what is known only after scoring; the latency model is
    linear in the totals (costs in compressor/search/latency.py), so spreading the kept heads
    and neurons evenly predicts the same time."""
    heads = max(plan.layers, plan.layers * shape.heads - round(plan.heads_removed * plan.layers * shape.heads))
    ffn = max(plan.layers, plan.layers * shape.ffn - round(plan.ffn_removed * plan.layers * shape.ffn))
    return Structure(heads=spread(heads, plan.layers), ffn=spread(ffn, plan.layers), precision=plan.precision)


def spread(total: int, parts: int) -> tuple[int, ...]:
    return tuple(total // parts + (1 if i < total % parts else 0) for i in range(parts))


def suggest_plan(trial, depth: int, recoveries: Sequence[Recovery], precisions: Sequence[Precision]) -> Plan:
    """One plan from an Optuna trial (define-by-run: a theseus plan has no pruning parameters)."""
    recovery = trial.suggest_categorical(*categorical("recovery", usable_recoveries(depth, recoveries),
                                                      usable_recoveries(depth, RECOVERIES)))
    if recovery == "theseus":
        layers, heads, ffn = trial.suggest_categorical("successor_layers", theseus_depths(depth)), 0.0, 0.0
    else:
        layers = trial.suggest_int("layers", 1, depth)
        heads = trial.suggest_float("heads_removed", 0.0, MAX_HEADS_REMOVED, step=REMOVED_STEP)
        ffn = trial.suggest_float("ffn_removed", 0.0, MAX_FFN_REMOVED, step=REMOVED_STEP)
    precision = trial.suggest_categorical(*categorical("precision", precisions, PRECISIONS))
    return Plan(layers=layers, heads_removed=round(heads, 2), ffn_removed=round(ffn, 2), recovery=recovery,
                precision=precision)


def plan_params(plan: Plan, depth: int, recoveries: Sequence[Recovery], precisions: Sequence[Precision]) -> dict:
    """The trial parameters from which `suggest_plan` proposes `plan` (for `enqueue_trial`)."""
    recovery, _ = categorical("recovery", usable_recoveries(depth, recoveries), usable_recoveries(depth, RECOVERIES))
    precision, _ = categorical("precision", precisions, PRECISIONS)
    shape = {"successor_layers": plan.layers} if plan.recovery == "theseus" else \
        {"layers": plan.layers, "heads_removed": plan.heads_removed, "ffn_removed": plan.ffn_removed}
    return {recovery: plan.recovery, **shape, precision: plan.precision}


def categorical(name: str, choices: Sequence[str], domain: Sequence[str]) -> tuple[str, list[str]]:
    """A categorical parameter's name and choices. Optuna refuses a categorical whose choices
    change within a study, and a resumed search may narrow --precisions or --recoveries: a
    list other than the whole domain is a parameter of its own (`precision:int8`), so no study
    holds two lists under one name. Plans are read from the trials' `plan` records, never from
    these names."""
    key = name if list(choices) == list(domain) else f"{name}:{'/'.join(choices)}"
    return key, list(choices)


def usable_recoveries(depth: int, recoveries: Sequence[Recovery]) -> list[Recovery]:
    """`recoveries` less theseus where the teacher has no blocks of layers to replace."""
    return [r for r in recoveries if r != "theseus" or theseus_depths(depth)]


def theseus_depths(depth: int) -> list[int]:
    """Successor counts that split the teacher's layers into equal blocks of two or more."""
    return [n for n in range(1, depth) if depth % n == 0]


def smallest_plans(depth: int, recoveries: Sequence[Recovery], precisions: Sequence[Precision]) -> list[Plan]:
    """The smallest plan of each recovery and precision the search may use: one layer with the
    most pruning (theseus: its fewest successor layers). The latency model says which is fastest
    (int8 kernels are not faster everywhere)."""
    return [Plan(layers=theseus_depths(depth)[0], recovery=r, precision=p) if r == "theseus" else
            Plan(layers=1, heads_removed=MAX_HEADS_REMOVED, ffn_removed=MAX_FFN_REMOVED, recovery=r, precision=p)
            for r in usable_recoveries(depth, recoveries) for p in precisions]


def largest_plans(depth: int, recoveries: Sequence[Recovery], precisions: Sequence[Precision]) -> list[Plan]:
    """The largest plan of each recovery and precision: every layer, nothing pruned. Theseus
    replaces blocks of two or more layers, so its largest plan (the most successor layers,
    half the teacher's at most) is smaller than the teacher: it is listed only where theseus is
    the one recovery, else the accuracy end of the space would be a half-depth model."""
    whole = [r for r in usable_recoveries(depth, recoveries) if r != "theseus"]
    if not whole:
        return [Plan(layers=theseus_depths(depth)[-1], recovery="theseus", precision=p) for p in precisions]
    return [Plan(layers=depth, recovery=r, precision=p) for r in whole for p in precisions]


def search_space(depth: int, recoveries: Sequence[Recovery], precisions: Sequence[Precision]) -> dict:
    """What `suggest_plan` draws from for this teacher, as the report records it: the ranges
    (inclusive) of the pruning plans, theseus' successor depths, recoveries and precisions."""
    usable = usable_recoveries(depth, recoveries)
    pruning = [r for r in usable if r != "theseus"]
    return {"recoveries": usable, "precisions": list(precisions),
            "layers": [1, depth] if pruning else None,
            "heads_removed": [0.0, MAX_HEADS_REMOVED] if pruning else None,
            "ffn_removed": [0.0, MAX_FFN_REMOVED] if pruning else None, "removed_step": REMOVED_STEP,
            "theseus_successor_layers": theseus_depths(depth) if "theseus" in usable else None}
