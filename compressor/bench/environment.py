"""What a measurement ran on: versions, CPU, threads, date (recorded beside every figure)."""

from __future__ import annotations

import datetime as dt
import os
import platform
from importlib import metadata

import torch

from compressor import __version__
from pretrain.cpus import cpu_quota

PACKAGES = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime",
            "neural-compressor-pt", "numpy", "tokenizers", "safetensors")
# Variables that hold a library below the CPU's own instruction set (a CPU emulated on a
# bigger one): a figure measured under one is not the CPU's, so it is recorded beside it.
ISA_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
INTERESTING_CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                         "amx_int8", "amx_bf16", "neon", "asimddp")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def read_cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags (x86 `flags`, ARM `Features`)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and value.strip():
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return model, flags


def cpu_flags() -> set[str]:
    return read_cpuinfo()[1]


def cpu_info() -> dict:
    model, flags = read_cpuinfo()
    return {"model": model, "cores": os.cpu_count(), "machine": platform.machine(),
            "flags": sorted(f for f in INTERESTING_CPU_FLAGS if f in flags)}


def isa_limits() -> dict[str, str]:
    """The ISA_LIMIT_VARIABLES set in this process's environment."""
    return {name: os.environ[name] for name in ISA_LIMIT_VARIABLES if os.environ.get(name)}


def environment() -> dict:
    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "tool_version": __version__, "python": platform.python_version(), "platform": platform.platform(),
           "cpu": cpu_info(), "torch_threads": torch.get_num_threads(),
           "packages": package_versions()}
    env.update(isa_limits_entry())
    env.update(quota_entry())
    return env


def isa_limits_entry() -> dict:
    """`isa_limits` only where one is set: the CPU's flags alone then misdescribe the run."""
    limits = isa_limits()
    return {"isa_limits": limits} if limits else {}


def quota_entry() -> dict:
    """`cpu_quota`: the CPUs' worth of time a cgroup quota (a container's `--cpus`) lets this
    process use, where one is set: `cores` and the affinity then overstate what it ran on."""
    quota = cpu_quota()
    return {} if quota is None else {"cpu_quota": round(quota, 3)}
