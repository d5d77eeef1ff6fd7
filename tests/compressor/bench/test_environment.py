from __future__ import annotations

from compressor.bench import environment
from compressor.report.render import environment_lines


def test_instruction_set_limits_are_recorded_only_where_set(monkeypatch):
    """A run under ATEN_CPU_CAPABILITY=avx2 on an AMX CPU measured AVX2 kernels while its flags
    said amx: the limits go beside the flags, and the report says so."""
    for name in environment.ISA_LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    plain = environment.environment()
    assert "isa_limits" not in plain
    assert not [line for line in environment_lines(plain) if "instruction sets" in line]

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    limited = environment.environment()
    assert limited["isa_limits"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert environment_lines(limited)[-1] == \
        "instruction sets limited by: ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2"


def test_a_cgroup_quota_is_recorded_only_where_set(monkeypatch):
    """A run in a container held to 1.5 CPUs recorded the host's cores alone: the quota goes
    beside them, and the report says so."""
    monkeypatch.setattr(environment, "cpu_quota", lambda: None)
    plain = environment.environment()
    assert "cpu_quota" not in plain and "quota" not in environment_lines(plain)[1]
    monkeypatch.setattr(environment, "cpu_quota", lambda: 1.5)
    held = environment.environment()
    assert held["cpu_quota"] == 1.5
    assert ", a cgroup quota of 1.5 CPUs, " in environment_lines(held)[1]
