"""A latency model per profile: predicts a structure's ONNX Runtime latency before it exists.

The search (issue 17) must discard plans over the latency budget before anything trains, so
it needs the latency of structures it has not built. A structure is what the structural
passes produce from a teacher: which layers remain, each layer's attention heads and FFN
width, and the precision it ships in. The model is linear in analytic costs of one call on
a batch of shape [B, S] (head_dim d, hidden H, per layer l: heads h_l, FFN width f_l):

    call         1                          fixed cost of a session.run
    layers       L                          per-layer fixed cost (kernel launches, small ops)
    tokens       B*S                        embedding, LayerNorms, classifier
    layer_tokens L*B*S                      residual adds, LayerNorms, biases per layer
    projections  B*S * sum_l 4*H*h_l*d      Q, K, V and output projections (multiply-adds)
    ffn          B*S * sum_l 2*H*f_l        the two FFN matrices
    ffn_act      B*S * sum_l f_l            GELU over the FFN's inner activations
    attention    B*S^2 * sum_l 2*h_l*d      scores and context (multiply-adds)
    softmax      B*S^2 * sum_l h_l          softmax elements

When the export computes the last layer for the first token only (pretrain/first_token.py),
that layer's query, output projection, FFN, GELU and per-token work count `batch` rows
instead of B*S, and its attention one query row per sequence (B*S*2*h*d, B*S*h softmax);
its keys and values still cover every token. The model records which export it describes.

with one non-negative coefficient per cost and precision (fp32 and int8 kernels differ),
fitted by non-negative least squares on relative error over structures measured on the
target. Each measurement is the median time of one real test batch (the benchmark's inputs:
real texts, padded to the batch's longest), so one structure gives a point per batch. A
structure's p50 over a set of batches is predicted as the median of its per-batch
predictions, as the benchmark's p50 is the median of its per-call times.

The fitted model is saved with the machine and profile it was measured on
(`LatencyModel.key`); `load_or_none` returns it only for the same machine, profile (with the
batch sizes, precisions, structure counts and seed it was fitted with) and teacher shape, so
a later search on that machine with those settings reuses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.optimize import nnls
from scipy.stats import spearmanr

from pretrain.atomic import write_json

COSTS = ("call", "layers", "tokens", "layer_tokens", "projections", "ffn", "ffn_act", "attention", "softmax")
Precision = Literal["fp32", "int8"]


class TeacherShape(BaseModel):
    """What the structures share with their teacher (pruning changes none of it)."""

    model_config = ConfigDict(frozen=True)

    hidden: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    ffn: int = Field(ge=1)


class Structure(BaseModel):
    """Per kept layer: its attention heads and FFN width; and the deployed precision."""

    model_config = ConfigDict(frozen=True)

    heads: tuple[int, ...] = Field(min_length=1)
    ffn: tuple[int, ...] = Field(min_length=1)
    precision: Precision = "fp32"

    @model_validator(mode="after")
    def one_entry_per_layer(self) -> Structure:
        if len(self.heads) != len(self.ffn):
            raise ValueError(f"heads ({len(self.heads)} layers) and ffn ({len(self.ffn)} layers) must list "
                             "the same layers")
        if min(self.heads) < 1 or min(self.ffn) < 1:
            raise ValueError("every kept layer needs at least one head and one FFN neuron")
        return self

    @property
    def name(self) -> str:
        return (f"{self.precision}-L{len(self.heads)}-h{'.'.join(map(str, self.heads))}"
                f"-f{'.'.join(map(str, self.ffn))}")


def costs(structure: Structure, shape: TeacherShape, batch: int, length: int,
          first_token_last: bool = False) -> np.ndarray:
    """The analytic costs (COSTS order) of one call on a [batch, length] input; with
    `first_token_last`, of the export whose last layer computes the first token only."""
    tokens = batch * length
    heads, ffn = np.asarray(structure.heads), np.asarray(structure.ffn)
    d, hidden = shape.head_dim, shape.hidden
    # Per layer: the rows its query, attention output and FFN run on, and its queries per sequence.
    rows, queries = np.full(len(heads), float(tokens)), np.full(len(heads), float(length))
    if first_token_last:
        rows[-1], queries[-1] = batch, 1
    return np.array([1.0, len(heads), tokens, rows.sum(),
                     2 * hidden * d * (tokens * heads.sum() + (rows * heads).sum()),   # K, V; Q, output
                     2 * hidden * (rows * ffn).sum(), (rows * ffn).sum(),
                     batch * length * 2 * d * (queries * heads).sum(), batch * length * (queries * heads).sum()],
                    dtype=np.float64)


class Point(BaseModel):
    """One measurement: a structure's median time on one batch of shape [batch, length]."""

    structure: Structure
    batch: int
    length: int
    ms: float = Field(gt=0)


class LatencyModel(BaseModel):
    """Coefficients per precision (ms per unit of each cost), and where they were measured."""

    key: str
    machine: dict
    teacher: TeacherShape
    coefficients: dict[str, list[float]]      # precision -> one per COSTS entry
    scales: list[float]                       # each cost is divided by its scale before fitting
    points: int
    held_out: dict | None = None              # the error on measured structures it did not see
    first_token_last: bool = False            # fitted on exports whose last layer runs the first token only
    # Other processes' share of the CPUs while its structures were timed (compressor/bench/
    # contention.py: median, worst, measurements); None where unknown or fitted before it was recorded.
    contention: dict | None = None

    def predict_ms(self, structure: Structure, batch: int, length: int) -> float:
        coef = self.coefficients.get(structure.precision)
        if coef is None:
            raise ValueError(f"the latency model has no {structure.precision} measurements; "
                             f"it was fitted for {', '.join(self.coefficients)}")
        row = costs(structure, self.teacher, batch, length, self.first_token_last)
        return float(row / np.asarray(self.scales) @ np.asarray(coef))

    def predict_p50(self, structure: Structure, shapes: Sequence[tuple[int, int]]) -> float:
        """The p50 over calls cycling through batches of these [batch, length] shapes."""
        return float(np.median([self.predict_ms(structure, b, n) for b, n in shapes]))

    def save(self, path: Path) -> None:
        write_json(path, self.model_dump(mode="json"))


def fit(points: Sequence[Point], teacher: TeacherShape, machine: dict, key: str,
        first_token_last: bool = False) -> LatencyModel:
    """Non-negative least squares per precision, minimising the relative error of every point."""
    rows = np.array([costs(p.structure, teacher, p.batch, p.length, first_token_last) for p in points])
    scales = np.where(rows.max(0) > 0, rows.max(0), 1.0)     # conditions the solve; undone in predict
    coefficients = {}
    for precision in sorted({p.structure.precision for p in points}):
        mine = [i for i, p in enumerate(points) if p.structure.precision == precision]
        targets = np.array([points[i].ms for i in mine])
        # Dividing each row by its target turns absolute into relative residuals, so that
        # a 2 ms structure counts as much as a 40 ms one.
        solution, _ = nnls(rows[mine] / scales / targets[:, None], np.ones(len(mine)))
        coefficients[precision] = solution.tolist()
    return LatencyModel(key=key, machine=machine, teacher=teacher, coefficients=coefficients,
                        scales=scales.tolist(), points=len(points), first_token_last=first_token_last)


def p50_by_structure(points: Sequence[Point]) -> dict[tuple[Structure, int], tuple[float, list[tuple[int, int]]]]:
    """Measured p50 (median over its batches' medians) and the batch shapes, per structure and
    batch size (a benchmark reports each batch size on its own)."""
    grouped: dict[tuple[Structure, int], list[Point]] = {}
    for p in points:
        grouped.setdefault((p.structure, p.batch), []).append(p)
    return {key: (float(np.median([p.ms for p in ps])), [(p.batch, p.length) for p in ps])
            for key, ps in grouped.items()}


def held_out_error(model: LatencyModel, points: Sequence[Point]) -> dict:
    """Median absolute relative error of predicted p50s (one per structure and batch size) and
    their Spearman rank correlation."""
    rows = []
    for (structure, batch), (measured, shapes) in p50_by_structure(points).items():
        predicted = model.predict_p50(structure, shapes)
        rows.append({"structure": structure.name, "batch_size": batch, "measured_p50_ms": measured,
                     "predicted_p50_ms": predicted, "relative_error": abs(predicted - measured) / measured})
    errors = [r["relative_error"] for r in rows]
    # Ranks within one batch size: across batch sizes any model would rank batch 1 first.
    # (keys as JSON writes them, so that a saved model reads back equal)
    by_batch = {str(b): rank_correlation([r for r in rows if r["batch_size"] == b])
                for b in sorted({r["batch_size"] for r in rows})}
    known = [rho for rho in by_batch.values() if rho is not None]
    return {"structures": len({r["structure"] for r in rows}), "measurements": len(rows),
            "median_abs_relative_error": float(np.median(errors)),
            "spearman": min(known) if known else None, "spearman_by_batch_size": by_batch, "rows": rows}


def rank_correlation(rows: list[dict]) -> float | None:
    """Spearman's rho between measured and predicted p50s (None for fewer than 3 rows)."""
    if len(rows) < 3:
        return None
    rho = spearmanr([r["measured_p50_ms"] for r in rows], [r["predicted_p50_ms"] for r in rows])[0]
    return None if np.isnan(rho) else float(rho)


def model_key(machine: dict, profile: dict, teacher: TeacherShape, first_token_last: bool = False,
              residual_layernorm: str = "fused") -> str:
    """Same CPU (model and flags), cores, cgroup CPU quota, runtime versions, profile, teacher
    shape and export graph: same model."""
    cpu = machine.get("cpu", {})
    packages = machine.get("packages", {})
    identity = {"cpu": [cpu.get("model"), sorted(cpu.get("flags", [])), cpu.get("cores")],
                "onnxruntime": packages.get("onnxruntime"), "profile": profile,
                "teacher": teacher.model_dump()}
    if machine.get("cpu_quota") is not None:   # absent without one, so saved models keep their key
        identity["cpu_quota"] = machine["cpu_quota"]
    if first_token_last:   # absent otherwise, so models saved before it existed keep their key
        identity["last_layer"] = "first-token"
    if residual_layernorm != "fused":   # likewise: Sum + LayerNormalization (export skip_layernorm)
        identity["residual_layernorm"] = residual_layernorm
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def load_or_none(path: Path, key: str) -> LatencyModel | None:
    """The saved model at `path` if it was fitted for `key` (this machine, profile, teacher)."""
    if not Path(path).is_file():
        return None
    try:
        model = LatencyModel.model_validate_json(Path(path).read_text())
    except ValueError:
        return None
    return model if model.key == key else None
