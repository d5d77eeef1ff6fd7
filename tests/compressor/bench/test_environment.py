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
