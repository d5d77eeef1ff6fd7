"""The model stages of a run: the teacher, each variant, and each model's ONNX export.

Variants that begin with the same passes share them: after a pass that trains, the
intermediate model is kept under DIR/prefixes/<key>/ and a later variant with the same
prefix starts from it instead of training again.

Passes get a Context with the teacher stage's model (loaded only if a pass asks for it) and,
per step, a work dir DIR/.work/<key>/ for checkpoints (same key as the step's prefix, so a
rerun resumes there); the work dirs of a variant go once its stage is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel

from compressor.bundle import PROVENANCE_FILE, ModelBundle, read_provenance, recorded_length
from compressor.evaluate import load_predictor, predict_classes
from compressor.export.gate import GateFailure
from compressor.export.graph_cache import Fp32Graphs
from compressor.export.onnx import GRAPH_VERSION, ExportSettings, export_into, skip_layernorm_choice
from compressor.export.quantize import QuantizeConfig, quantize_config_from_record
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from compressor.pipeline.cache import (FINGERPRINTED, STAGE_FILE, cached, content_key, file_digest, fingerprint,
                                      fingerprint_file, key_fields, log, stage_record, task_fingerprint)
from compressor.pipeline.outdir import disk_errors, read_json
from compressor.pipeline.recipe import PREFIXES_DIR, WORK_DIR, Recipe, Step, export_dir_name
from pretrain.atomic import remove_dir, write_json
from pretrain.batching import MAX_LENGTH
from pretrain.data import BUILTIN_CORPORA, TaskData, task_files
from pretrain.errors import UserError
from pretrain.finetune import evaluate, finetune, with_run_defaults
from pretrain.models import load_classifier
from pretrain.train import Checkpointing

EVAL_LIMIT = "eval_limit"    # stage.json: the test-sample limit its metrics were measured with
SCORED_MODEL = "scored_model"   # stage.json: the content key of what its metrics scored (`scored_model`)
ATTEMPTS_SUFFIX = ".attempts.json"   # DIR/.work/<key>.attempts.json: the seconds of a model stage's stopped builds


@dataclass(frozen=True)
class Stage:
    """A finished model stage: where it lives, its cache key and its test metrics."""

    name: str
    path: Path
    key: str
    metrics: dict[str, Any]
    predictions: np.ndarray
    params: int
    history: list[dict]
    # What the scores were measured on (`scored_model`): a later stage whose saved model is the
    # same takes them over instead of scoring it again (a variant that only quantizes).
    scored_model: str | None = None


def teacher_stage(recipe: Recipe, ref: str, path: Path, task: TaskData, split_seed: int, out_dir: Path,
                  show_progress: bool) -> Stage:
    """The teacher, fine-tuned if the recipe says so, recorded with the seed `task`'s splits
    were drawn with (`split_seed`: the recipe's, or the one a teacher used as is records)."""
    finetune_cfg = teacher_finetune(recipe)
    key = teacher_key(recipe, path, task)

    def build() -> ModelBundle:
        model, tokenizer = load_classifier(ref, task.label_names, seed=recipe.seed)
        if finetune_cfg is not None:
            # The longest stage of most recipes: a killed run resumes it from its last
            # checkpoint (same key, same work dir), not from the first step.
            finetune(model, tokenizer, task, finetune_cfg, desc="teacher finetune", show_progress=show_progress,
                     checkpoint=Checkpointing(directory=out_dir / WORK_DIR / key))
        return ModelBundle(model=model, tokenizer=tokenizer, task=task.spec, task_seed=split_seed,
                           max_length=teacher_length(finetune_cfg, path), pair_task=task.is_pair_task)
    stage = model_stage("teacher", key, build, task, recipe, out_dir)
    remove_work_dirs(out_dir, [key])
    return stage


def teacher_length(finetune_cfg, path: Path) -> int:
    """The length the teacher is fine-tuned at here, else the one its dir records."""
    if finetune_cfg is not None:
        return finetune_cfg.max_length
    return recorded_length(read_provenance(path), path)


def teacher_finetune(recipe: Recipe):
    """The teacher's fine-tuning settings as they run (None: the teacher as it is)."""
    if recipe.teacher.finetune is None:
        return None
    # data.max_train_samples caps the passes, not the teacher: its fine-tuning sets its own.
    return with_run_defaults(recipe.teacher.finetune, recipe.seed, max_train_samples=None)


def teacher_key(recipe: Recipe, path: Path, task: TaskData) -> str:
    finetune_cfg = teacher_finetune(recipe)
    # Not the test-sample limit: it changes what is measured, not the weights (model_stage
    # re-evaluates a stage whose limit differs; the exports' and benchmark's keys hold it).
    fields = {"model": fingerprint(path), "task": task_fingerprint(task),
              "finetune": data_keyed_fields(finetune_cfg) if finetune_cfg else None}
    if finetune_cfg is not None and finetune_cfg.max_length != MAX_LENGTH:
        # A teacher written before its length was recorded says the default; this key
        # rebuilds it (and what reads it) so that it records and is scored at its own length.
        fields["length_recorded"] = True
    return content_key(fields)


def variant_key(teacher_key: str, recipe: Recipe, steps: list[Step]) -> str:
    """The key of the model a variant's first len(steps) steps make (the whole variant, or a prefix)."""
    return content_key({"input": teacher_key, "seed": recipe.seed,
                        "max_train_samples": recipe.data.max_train_samples,
                        "steps": [step_key(s) for s in steps]})


def pass_context(recipe: Recipe, task: TaskData, teacher: Stage, show_progress: bool) -> Context:
    """What every variant's passes share; the teacher loads only if a pass asks for it."""
    return Context(task=task, seed=recipe.seed, max_train_samples=recipe.data.max_train_samples,
                   show_progress=show_progress, teacher_source=LazyTeacher.from_dir(teacher.path))


def variant_stage(name: str, steps: list[Step], teacher: Stage, earlier: list[Stage], recipe: Recipe,
                  task: TaskData, out_dir: Path, ctx: Context, source: str = "") -> Stage:
    """The variant's model, built step by step (`source`: the recipe file, which a step's
    refusal names, as the checks before the run do)."""
    file = f"{source}: " if source else ""

    def key_of(prefix: list[Step]) -> str:
        return variant_key(teacher.key, recipe, prefix)

    def build() -> ModelBundle:
        known = {stage.key: stage.path for stage in earlier}
        done, start = longest_finished_prefix(steps, key_of, known, out_dir)
        bundle = ModelBundle.load(start or teacher.path)
        for i in range(done, len(steps)):
            # Keyed like the prefix it produces: a rerun of this step finds its checkpoints.
            step_ctx = dataclasses.replace(ctx, work_dir=out_dir / WORK_DIR / key_of(steps[:i + 1]))
            try:
                bundle = apply_pass(bundle, steps[i].name, steps[i].config, step_ctx)
            except UserError as err:      # found only now: say where, as the checks before the run do
                raise type(err)(f"{file}variants.{name}[{i}]: {err}") from None
            if get_pass(steps[i].name).trains and i + 1 < len(steps):
                keep_prefix(bundle, out_dir / PREFIXES_DIR / key_of(steps[:i + 1]))
        return bundle
    stage = model_stage(name, key_of(steps), build, task, recipe, out_dir, scored_before=[teacher, *earlier])
    remove_work_dirs(out_dir, [key_of(steps[:n]) for n in range(1, len(steps) + 1)])
    return stage


def step_key(step: Step) -> list:
    """A step as it enters a cache key: its name and config, plus the content of every dir the
    config names as an input (`input_paths()`, e.g. distill's `teacher: PATH`) and of every data
    file it reads (`data_files()`), so that a teacher retrained in place or an edited corpus is
    a new key. Steps without such inputs keep their old key."""
    paths = step.config.input_paths() if hasattr(step.config, "input_paths") else {}
    key = [step.name, data_keyed_fields(step.config)]
    return key + [{name: fingerprint_file(path) for name, path in paths.items()}] if paths else key


def config_inputs(config: BaseModel) -> list[str | Path]:
    """Every file or dir a pass config (or the teacher's fine-tuning settings) reads besides
    the input model: dirs it names (`input_paths()`) and its data files (`data_files()`)."""
    paths: list[str | Path] = list(config.input_paths().values()) if hasattr(config, "input_paths") else []
    return paths + data_files(config)


def data_files(config: BaseModel) -> list[str]:
    """The data files of fine-tuning settings: intermediate and extra tasks' files and a domain
    corpus file (a built-in corpus, such as `wordnet`, is a name, not a file)."""
    files = [f for spec in (getattr(config, "intermediate_task", None), *getattr(config, "tasks", ()))
             for f in task_files(spec)]
    corpus = getattr(config, "domain_corpus", None)
    return files + ([corpus] if corpus and corpus not in BUILTIN_CORPORA else [])


def data_keyed_fields(config: BaseModel) -> dict:
    """`key_fields`, each data file named by its content instead of its path: an edited file is
    a new key; the same file moved with its project, or its path written another way, is not."""
    fields = key_fields(config)
    by_content = {str(f): {"content": fingerprint_file(Path(f))} for f in data_files(config)}
    if not by_content:
        return fields

    def keyed(value):
        if isinstance(value, dict):
            return {k: keyed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [keyed(v) for v in value]
        return by_content.get(value, value) if isinstance(value, str) else value
    return {k: keyed(v) if k in DATA_FIELDS else v for k, v in fields.items()}


DATA_FIELDS = ("intermediate_task", "tasks", "domain_corpus")   # fine-tuning settings that name data files


def remove_work_dirs(out_dir: Path, keys: list[str]) -> None:
    """Checkpoints of steps whose output is now written (a kept prefix or the stage itself)."""
    for key in keys:
        shutil.rmtree(out_dir / WORK_DIR / key, ignore_errors=True)
    with contextlib.suppress(OSError):   # still holding another variant's work, or never made
        (out_dir / WORK_DIR).rmdir()


def longest_finished_prefix(steps: list[Step], key_of: Callable[[list[Step]], str],
                            known: dict[str, Path], out_dir: Path) -> tuple[int, Path | None]:
    """(number of steps already done, dir of that model) for the longest finished prefix."""
    for n in range(len(steps), 0, -1):
        key = key_of(steps[:n])
        if key in known:
            return n, known[key]
        kept = out_dir / PREFIXES_DIR / key
        if stage_record(kept).get("key") == key:
            return n, kept
    return 0, None


def keep_prefix(bundle: ModelBundle, path: Path) -> None:
    def write(tmp: Path) -> dict:
        bundle.save_into(tmp)
        return {"history": list(bundle.history)}
    cached(path, path.name, write)


def model_stage(name: str, key: str, build: Callable[[], ModelBundle], task: TaskData, recipe: Recipe,
                out_dir: Path, scored_before: list[Stage] = ()) -> Stage:
    """Reuse out_dir/name if its key matches (re-evaluated if it was measured on another number
    of test examples); otherwise build, evaluate and write it. A built model that is one of
    `scored_before` (the same saved weights, config, tokenizer and length) takes over that
    stage's scores: every stage of a run is scored on the recipe's test examples."""
    limit = recipe.data.max_eval_samples

    def scored(bundle: ModelBundle) -> dict:
        metrics, predictions = evaluate(bundle.model, bundle.tokenizer, task.split("test").head(limit),
                                        max_length=bundle.max_length)
        return {"metrics": metrics, "predictions": predictions.tolist(), EVAL_LIMIT: limit}

    def write(tmp: Path) -> dict:
        bundle = build()
        bundle.save_into(tmp)
        model = scored_model(tmp, bundle)
        same = next((stage for stage in scored_before if stage.scored_model == model), None)
        if same is None:
            scores = scored(bundle)
        else:
            log.info("stage %s: the same model as %s; its test scores taken over", name, same.name)
            scores = {"metrics": same.metrics, "predictions": same.predictions.tolist(), EVAL_LIMIT: limit}
        return {"params": bundle.params, "history": list(bundle.history), SCORED_MODEL: model, **scores}
    path = out_dir / name
    if read_json(path / STAGE_FILE).get("key") not in (None, key):
        retire_what_reads(out_dir, name)
    # Rebuilding a teacher or variant resumes a stopped build's checkpoints and prefixes: its
    # build time counts theirs too (noted beside the work dirs, cleared with them).
    record = cached(path, key, write, attempts=out_dir / WORK_DIR / f"{key}{ATTEMPTS_SUFFIX}")
    if scored_on_other_examples(record, limit):
        log.info("stage %s: cached; evaluating it on the recipe's test examples", name)
        retire_reports(out_dir)      # they show the metrics of the other limit
        record = {**record, **scored(ModelBundle.load(path))}
        with disk_errors(out_dir):
            write_json(path / STAGE_FILE, record)
    return stage_of(name, path, record)


def scored_model(directory: Path, bundle: ModelBundle) -> str:
    """What a saved stage's test scores depend on: its weights, config and tokenizer files
    (not compressor.json, whose pass history and deploy settings differ between a model and
    its quantized variant) and the length and text pairing it is scored with."""
    files = {file.name: scored_file_digest(file) for file in sorted(directory.iterdir())
             if file.is_file() and file.suffix in FINGERPRINTED and file.name not in (PROVENANCE_FILE, STAGE_FILE)}
    return content_key({"files": files, "max_length": bundle.max_length, "pair_task": bundle.pair_task})


def scored_file_digest(file: Path) -> str:
    """A file's digest; tokenizer.json's without the truncation and padding of its last call,
    which a saved tokenizer keeps and scoring sets anew (pretrain/batching.py `encode`)."""
    if file.name != "tokenizer.json":
        return file_digest(file)
    spec = json.loads(file.read_text())
    return content_key({key: value for key, value in spec.items() if key not in ("truncation", "padding")})


def scored_on_other_examples(record: dict, limit: int | None) -> bool:
    """Whether a model stage's metrics were measured with another test-sample limit than
    `limit` (or before stage.json recorded one): a run reusing it evaluates it again
    (`model_stage`), and `compressor run --plan` says so."""
    return record.get(EVAL_LIMIT, "unrecorded") != limit


REPORT_FILES = ("report.json", "report.md", "report.html", "pareto.png")


def retire_what_reads(out_dir: Path, name: str) -> None:
    """Before stage `name` is rebuilt for other settings: its exports and the run's report
    describe the model it replaces, so they go now. A run stopped before it writes them again
    then leaves nothing that looks current but is not (the rerun rebuilds both). The report
    goes first: stopped between, it would name exports that are gone."""
    retire_reports(out_dir)
    with disk_errors(out_dir):
        for mode in (None, "torch-dynamic-int8"):
            remove_dir(out_dir / export_dir_name(name, mode))


def retire_reports(out_dir: Path) -> None:
    """The run's report files go before a stage they describe is rebuilt or re-scored (see
    retire_what_reads)."""
    with disk_errors(out_dir):
        for file in REPORT_FILES:
            (out_dir / file).unlink(missing_ok=True)


def export_stage(stage: Stage, settings: ExportSettings, recipe: Recipe, task: TaskData,
                 out_dir: Path, graphs: Fp32Graphs | None = None) -> dict:
    """Export a finished stage to DIR/<name>-onnx/ (DIR/<name>-torch-int8/ for torch-dynamic-int8),
    gated; the record plus test predictions.

    The key covers the stage's own key (its weights, passes and deploy settings), the export
    settings and the test-sample limit the gate evaluates on. `graphs`: the fp32 graphs of the
    run's exports so far, which the export of a model already exported starts from.
    """
    quantize = recorded_quantize(stage.path)
    path = out_dir / export_dir_name(stage.name, quantize.mode if quantize else None)
    key = export_key(stage.key, settings, quantize, recipe)

    def write(tmp: Path) -> dict:
        exported = export_into(tmp, ModelBundle.load(stage.path), settings, task, recipe.data.max_eval_samples,
                               final_path=path, graphs=graphs)
        # The gate already scored the shipped model on these test examples: reuse its predictions.
        return {"export": exported.record, "predictions": exported.predictions.tolist()}
    if read_json(path / STAGE_FILE).get("key") not in (None, key):
        retire_reports(out_dir)      # they describe the export this one replaces
    try:
        record = cached(path, key, write)
    except GateFailure as err:
        raise GateFailure(f"export of {stage.name}: {err}{gate_remedy(err.setting, settings)}",
                          err.setting) from None
    # The record's own path is where the export was built: a run dir moved since then holds it here.
    return {**record["export"], "path": str(path), "predictions": record["predictions"]}


# What each gate setting's recipe key must become to accept a model the gate refused.
GATE_REMEDIES = {"accuracy_tolerance": "a larger export.accuracy_tolerance (now {value:g}) to accept the drop, "
                                       "or more test examples (data.max_eval_samples) to measure it finer",
                 "min_accuracy": "a lower export.min_accuracy (now {value:g}) to accept it"}


def gate_remedy(setting: str | None, settings: ExportSettings) -> str:
    if setting not in GATE_REMEDIES:
        return ""
    return "; expected " + GATE_REMEDIES[setting].format(value=getattr(settings, setting))


def export_key(stage_key: str, settings: ExportSettings, quantize: QuantizeConfig | None, recipe: Recipe) -> str:
    # `skip_layernorm: auto` resolves by the installed onnxruntime: the resolved form is in the key
    residual = skip_layernorm_choice(settings, quantize)[0]
    return content_key({"input": stage_key, "export": key_fields(settings), "graph": GRAPH_VERSION,
                        "residual_layernorm": residual, "eval": recipe.data.max_eval_samples})


def finished_stage(name: str, path: Path, key: str) -> Stage | None:
    """The model stage at `path` if it is written with this key (what `model_stage` would reuse)."""
    record = stage_record(path)
    return stage_of(name, path, record) if record.get("key") == key else None


def stage_of(name: str, path: Path, record: dict) -> Stage:
    return Stage(name, path, record["key"], record["metrics"], np.asarray(record["predictions"]),
                 record["params"], record["history"], record.get(SCORED_MODEL))


def recorded_quantize(model_dir: Path) -> QuantizeConfig | None:
    """The quantize config a stage's passes recorded (compressor.json deploy), if any."""
    spec = read_provenance(model_dir).get("deploy", {}).get("quantize")
    return quantize_config_from_record(spec) if spec else None


def test_predictions(model_path: Path, task: TaskData, recipe: Recipe) -> np.ndarray:
    """Class predictions of a saved model (HF or ONNX dir) on the recipe's test examples."""
    return predict_classes(load_predictor(model_path), task.split("test").head(recipe.data.max_eval_samples), task)
