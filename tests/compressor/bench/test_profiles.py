"""Why a profile is skipped: the reason names what is missing on this machine."""

from __future__ import annotations

import torch

from compressor.bench import profiles
from compressor.bench.profiles import load_profile, ort_session_options, unavailable_reason


def test_the_cpu_profile_runs_here():
    assert unavailable_reason(load_profile("cpu")) is None


def test_the_one_thread_profile_is_the_cpu_profile_on_one_thread():
    one, cpu = load_profile("cpu-1thread"), load_profile("cpu")
    assert unavailable_reason(one) is None
    assert one.thread_count() == 1 and cpu.threads == "cores"
    same = ("provider", "device", "graph_optimization", "batch_sizes", "sequence_lengths", "warmup", "iterations",
            "precisions")
    assert {f: getattr(one, f) for f in same} == {f: getattr(cpu, f) for f in same}


def test_sessions_stop_spinning_when_a_call_returns():
    # The benchmark times several sessions in turn: an idle one must not spin on the cores.
    options = ort_session_options(2, "all")
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert ort_session_options(2, "all", stop_spinning=False).get_session_config_entry(
        "session.force_spinning_stop") == "0"


def test_a_gpu_profile_without_a_gpu_says_no_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(profiles, "nvidia_gpu_present", lambda: False)
    assert unavailable_reason(load_profile("gpu-cuda-fp16")) == "no CUDA device is visible"


def test_a_gpu_with_cpu_builds_of_the_packages_says_what_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(profiles, "nvidia_gpu_present", lambda: True)
    reason = unavailable_reason(load_profile("gpu-tensorrt-int8"))
    assert "GPU is present" in reason and "CPU build" in reason and "onnxruntime-gpu" in reason
