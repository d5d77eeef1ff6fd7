"""Hardware profiles: where and how a model is measured (`profiles/*.yaml`).

A profile names an ONNX Runtime execution provider and the conditions of a measurement:
threads, batch sizes, sequence lengths (`real` test batches padded to each batch's longest
member, or fixed lengths), warm-up and measured iterations, and the precisions the
target suits. `requires` says what the hardware must offer; a profile whose hardware or
provider is absent is *skipped with its reason*, never failed, so one recipe runs on a
laptop and on a GPU server alike.
"""

from __future__ import annotations

import platform
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from compressor.yamlfile import (field_suggestion, is_type_tag, load_yaml, location, refuse_bool_items,
                                 refuse_bool_numbers, yaml_problem)
from pretrain.cpus import usable_cpus
from pretrain.errors import UserError, given_text, number_problem, validation_message
from pretrain.limits import MAX_THREADS

PROFILE_DIR = Path(__file__).resolve().parents[2] / "profiles"   # the repository's profiles/

Precision = Literal["fp32", "fp16", "int8", "int4"]
MIN_SEQUENCE_LENGTH = 2     # a fixed length holds [CLS] and [SEP] at least
# What an item of a list field takes, in words, where its type says less than its validator
# checks: a sequence length is an integer from 2 up, not any integer (profiles' and recipes' errors).
ITEM_FORMS = {"sequence_lengths": f"an integer >= {MIN_SEQUENCE_LENGTH} or 'real'"}
THREADS_FORM = f"an integer from 1 to {MAX_THREADS} or 'cores'"     # what `threads` takes, in its every error
# Calls per model and shape. The shipped profiles warm up 10-20 calls and time 100-300, the
# benchmarks here 1,000 at most. Warm-up fills ONNX Runtime's arenas and caches in a few calls;
# 10,000 timed calls put 100 past the p99. At a slow 1 s per call (a base model, batch 32, 512
# tokens, on CPU) the bounds keep one model's shape under four hours (each round of 10 timed
# calls adds 2 untimed, timing.py), where `warmup: 1000000000` would run for decades.
MAX_WARMUP = 1_000
MAX_ITERATIONS = 10_000


class Requirements(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    machine: list[str] = []           # platform.machine() values, e.g. [x86_64] or [aarch64, arm64]
    cpu_flags: list[str] = []         # /proc/cpuinfo flags, e.g. [avx512f, avx512_vnni]
    cuda: bool = False                # a CUDA device visible to torch


class Profile(BaseModel):
    """One deployment target. Fields are a contract: recipes and reports name them."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    description: str = ""
    provider: str = "CPUExecutionProvider"                 # ONNX Runtime execution provider
    device: Literal["cpu", "cuda"] = "cpu"                 # where PyTorch models run
    threads: int | Literal["cores"] = "cores"              # intra-op threads (ORT and torch), >= 1
    graph_optimization: Literal["disabled", "basic", "extended", "all"] = "all"
    batch_sizes: list[int] = Field(default=[1, 8], min_length=1)
    sequence_lengths: list[int | Literal["real"]] = Field(default=["real"], min_length=1)
    warmup: int = Field(10, ge=0, le=MAX_WARMUP)            # untimed iterations first
    iterations: int = Field(100, ge=1, le=MAX_ITERATIONS)   # timed iterations per measurement
    precisions: list[Precision] = ["fp32", "int8"]          # what this target runs fast
    requires: Requirements = Requirements()
    # Optimum's AutoQuantizationConfig preset for the optimum-default-int8 baseline on this
    # target; None: the preset for the CPU it runs on (compressor/bench/baselines.py).
    optimum_preset: Literal["arm64", "avx2", "avx512", "avx512_vnni"] | None = None

    @field_validator("threads", mode="before")
    @classmethod
    def _positive_threads(cls, threads: object) -> object:
        # YAML's `true` would pass as 1; the message adds (got N)
        if isinstance(threads, bool) or (isinstance(threads, int) and not 1 <= threads <= MAX_THREADS):
            raise ValueError(f"expected {THREADS_FORM}")
        return threads

    @field_validator("batch_sizes", "sequence_lengths", mode="before")
    @classmethod
    def _no_bool_items(cls, values: object, info: ValidationInfo) -> object:
        return numbers_as_written(values, info)

    @field_validator("batch_sizes")
    @classmethod
    def _positive_batches(cls, sizes: list[int]) -> list[int]:
        return check_batch_sizes(sizes)

    @field_validator("sequence_lengths")
    @classmethod
    def _positive_lengths(cls, lengths: list) -> list:
        return check_sequence_lengths(lengths)

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, provider: str) -> str:
        import onnxruntime as ort      # every provider ORT has a name for, built in here or not
        if provider not in ort.get_all_providers():
            raise ValueError(f"no ONNX Runtime execution provider has that name; expected one of "
                             f"{', '.join(ort.get_available_providers())} (on this machine) or another "
                             "name onnxruntime.get_all_providers() lists")
        return provider

    def thread_count(self) -> int:
        if self.threads == "cores":        # the cores this process may use, not the machine's
            return usable_cpus()
        return int(self.threads)

    def suits(self, precision: str) -> bool:
        return precision_family(precision) in self.precisions


def numbers_as_written(values: object, info: ValidationInfo) -> object:
    """Shared by profiles and a recipe's `benchmark:` overrides: YAML's true/false in
    batch_sizes or sequence_lengths refused as written (before pydantic makes them 1 and 0)."""
    return refuse_bool_items(values, "numbers or 'real'" if info.field_name == "sequence_lengths" else "numbers")


def check_batch_sizes(sizes: list[int]) -> list[int]:
    """Shared by profiles and a recipe's `benchmark:` overrides."""
    if not sizes or any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise ValueError(f"batch sizes must be distinct integers >= 1, at least one (got {sizes})")
    return sizes


def check_sequence_lengths(lengths: list) -> list:
    """Fixed lengths hold [CLS] and [SEP] at least; each measured once."""
    if not lengths or any(isinstance(n, int) and n < MIN_SEQUENCE_LENGTH for n in lengths):
        raise ValueError(f"sequence lengths must be 'real' or fixed lengths >= {MIN_SEQUENCE_LENGTH}, at least one "
                         f"(got {lengths})")
    if len(set(map(str, lengths))) != len(lengths):
        raise ValueError(f"sequence lengths must be distinct (got {lengths})")
    return lengths


def with_overrides(profile: Profile, overrides: dict) -> Profile:
    """The profile with batch sizes, lengths or iterations replaced, validated as the file is."""
    try:
        return Profile.model_validate({**profile.model_dump(), **overrides})
    except ValidationError as err:
        raise UserError(describe_profile_error(err)) from None


def ort_session_options(threads: int, graph_optimization: str, stop_spinning: bool = True):
    """ONNX Runtime session options for a profile's threads and graph optimization level.

    Shared by the benchmark and the memory probe, so both run the graph ORT would run.
    `stop_spinning`: the pool's workers stop spinning when a call returns. The benchmark
    times several sessions in turn in one process; left spinning (ONNX Runtime's default),
    an idle session's workers take the cores from the session being timed, which shows most
    at batch 1 (benchmarks/README.md, "Idle spinning"). Within a call the workers still spin
    between operators, and a session timed alone runs as fast either way.
    """
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.force_spinning_stop", "1" if stop_spinning else "0")
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[graph_optimization]
    return options


def precision_family(precision: str) -> str:
    """'dynamic-int8', 'static-int8', 'qat-int8' ... -> 'int8'; 'fp16' -> 'fp16'."""
    for family in ("int8", "int4", "fp16"):
        if family in precision:
            return family
    return "fp32"


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(ref: str) -> Profile:
    """A profile by name (profiles/NAME.yaml) or by path to a YAML file."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") and not path.is_file():
        raise UserError(f"profile file {ref} not found; expected a path to a profile .yaml, or one of the "
                        f"profiles {', '.join(profile_names())}")
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{ref}.yaml"
        if not path.is_file():
            raise UserError(f"unknown profile {ref!r}; known profiles: {', '.join(profile_names())} "
                            "(or a path to a profile .yaml)")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not a valid YAML profile{yaml_problem(err)}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a valid YAML profile: not UTF-8 text") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of profile fields (provider, threads, batch_sizes, ...)")
    raw.setdefault("name", path.stem)
    try:
        profile = Profile.model_validate(raw)
        refuse_bool_numbers(raw, profile, "")
    except ValidationError as err:
        raise UserError(f"{path}: {describe_profile_error(err)}") from None
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None
    return profile


def describe_profile_error(err: ValidationError) -> str:
    """`warmup: expected an integer from 0 to 1000 (got -1)`, `threads: expected an integer from 1
    to 1024 or 'cores' (got 'many')`: the field, what it takes, the value."""
    first = err.errors()[0]
    # Union branches appear in loc as type tags ("int", "literal['cores']"): not field names.
    parts = [str(p) for p in first["loc"] if not is_type_tag(p)]
    given = first.get("input")
    shown = "" if isinstance(given, (dict, list)) or first["type"] == "missing" else f" (got {given_text(given)})"
    field = Profile.model_fields.get(parts[0]) if parts else None
    is_type_error = first["type"].endswith(("_type", "_parsing")) or first["type"] in ("literal_error",
                                                                                         "int_from_float")
    number = number_problem(first, field) if len(parts) == 1 else None
    if number is not None:      # both bounds said, as recipes say them (not "greater than or equal to 1")
        return f"{parts[0]}: {number}"
    if parts == ["threads"] and is_type_error:
        return f"threads: expected {THREADS_FORM}{shown}"
    if field is not None and len(parts) == 1 and is_type_error:
        return f"{parts[0]}: expected {type_name(field.annotation)}{shown}"
    if parts and parts[0] in ITEM_FORMS and is_type_error:
        return f"{location(first['loc'])}: expected {ITEM_FORMS[parts[0]]}{shown}"
    hint = field_suggestion(Profile, tuple(parts)) if first["type"] == "extra_forbidden" else ""
    return f"{location(first['loc']) or 'profile'}: {validation_message(first)}{shown}{hint}"


def type_name(annotation) -> str:
    """int | Literal['cores'] -> "int or 'cores'"; list[int] -> "list[int]"."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, UnionType):
        return " or ".join(type_name(a) for a in args)
    if get_origin(annotation) is Literal:
        return " or ".join(repr(a) for a in args)
    return getattr(annotation, "__name__", str(annotation)) if not args else str(annotation).replace("typing.", "")


def unavailable_reason(profile: Profile) -> str | None:
    """Why this machine cannot run the profile, or None when it can."""
    req = profile.requires
    machine = platform.machine()
    if req.machine and machine not in req.machine:
        return f"needs a machine of type {' or '.join(req.machine)}; this one is {machine}"
    if req.cpu_flags:
        from compressor.bench.environment import cpu_flags
        missing = [f for f in req.cpu_flags if f not in cpu_flags()]
        if missing:
            return f"the CPU lacks {', '.join(missing)}"
    if req.cuda or profile.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            if nvidia_gpu_present() and torch.version.cuda is None:
                # The usual case on a GPU box set up by `make`: the venv holds the CPU builds.
                return (f"an NVIDIA GPU is present but torch {torch.__version__} is a CPU build: "
                        f"install a CUDA build of torch and onnxruntime-gpu to run this profile")
            return "no CUDA device is visible"
    import onnxruntime as ort
    if profile.provider not in ort.get_available_providers():
        return (f"ONNX Runtime here has no {profile.provider} "
                f"(available: {', '.join(ort.get_available_providers())})")
    return None


def nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver sees a GPU, whatever the Python packages can use."""
    return Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir())
