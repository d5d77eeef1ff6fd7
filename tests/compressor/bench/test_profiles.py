"""Why a profile is skipped: the reason names what is missing on this machine."""

from __future__ import annotations

import pytest
import torch

from compressor.bench import profiles
from compressor.bench.profiles import load_profile, ort_session_options, unavailable_reason
from pretrain.errors import UserError


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


def profile_file(tmp_path, **changes):
    import yaml
    raw = yaml.safe_load((profiles.PROFILE_DIR / "cpu.yaml").read_text())
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**raw, **changes}))
    return str(path)


@pytest.mark.parametrize("changes, why", [
    ({"threads": True}, "threads"),
    ({"warmup": True}, "warmup: expected a number, got true"),
    ({"batch_sizes": [8, True]}, r"batch_sizes: expected numbers, got \[8, true\]"),
    ({"sequence_lengths": [True, 128]}, r"sequence_lengths: expected numbers or 'real', got \[true, 128\]"),
    ({"provider": "CPUExecutionprovider"}, "no ONNX Runtime execution provider has that name.*'CPUExecutionprovider'"),
    ({"sequence_lengths": []}, "at least 1 item"),
    ({"sequence_lengths": [16, 16]}, "distinct"),
    ({"sequence_lengths": ["real", "x"]}, r"sequence_lengths\[1\]: expected an integer >= 2 or 'real' \(got 'x'\)"),
    ({"batch_sizes": [8, 8]}, "distinct"),
])
def test_a_profile_that_could_not_measure_is_refused_in_one_line(tmp_path, changes, why):
    with pytest.raises(UserError, match=why) as err:
        load_profile(profile_file(tmp_path, **changes))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("changes, message", [
    # what the field takes, both bounds said as recipes say them; not pydantic's "greater than or equal to 0"
    ({"warmup": -1}, "warmup: expected an integer from 0 to 1000 (got -1)"),
    ({"warmup": "x"}, "warmup: expected an integer from 0 to 1000 (got 'x')"),
    ({"iterations": 0}, "iterations: expected an integer from 1 to 10000 (got 0)"),
    ({"iterations": 2.5}, "iterations: expected an integer from 1 to 10000 (got 2.5)"),
    ({"threads": 0}, "threads: expected an integer from 1 to 1024 or 'cores' (got 0)"),
    ({"threads": -1}, "threads: expected an integer from 1 to 1024 or 'cores' (got -1)"),
    ({"threads": "many"}, "threads: expected an integer from 1 to 1024 or 'cores' (got 'many')"),
    ({"threads": 1.5}, "threads: expected an integer from 1 to 1024 or 'cores' (got 1.5)"),
    # Upper bounds too: a profile that would time for days, or start a million threads, is refused.
    ({"warmup": 1_000_000_000}, "warmup: expected an integer from 0 to 1000 (got 1000000000)"),
    ({"iterations": 10_001}, "iterations: expected an integer from 1 to 10000 (got 10001)"),
    ({"threads": 1025}, "threads: expected an integer from 1 to 1024 or 'cores' (got 1025)"),
])
def test_a_profile_number_says_what_its_field_takes(tmp_path, changes, message):
    path = profile_file(tmp_path, **changes)
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_users_profile_number_is_one_line_exit_2_through_bench(tmp_path, capsys):
    from compressor.cli.commands import main
    path = profile_file(tmp_path, warmup=-1)
    assert main(["bench", "--model", "m", "--profile", path, "--out", str(tmp_path / "result.json")]) == 2
    assert capsys.readouterr().err == f"error: {path}: warmup: expected an integer from 0 to 1000 (got -1)\n"
    assert [p.name for p in tmp_path.iterdir()] == ["mine.yaml"]


def test_a_bench_override_says_what_the_field_takes(tmp_path, capsys):
    with pytest.raises(UserError) as err:
        profiles.with_overrides(load_profile("cpu"), {"iterations": 0})
    assert str(err.value) == "iterations: expected an integer from 1 to 10000 (got 0)"
    # --iterations takes the profile's bounds, refused when the command line is read
    from compressor.cli.commands import main
    assert main(["bench", "--model", "m", "--iterations", "20000", "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err == ("error: compressor bench: argument --iterations: expected a positive integer "
                                       "from 1 to 10000 (got 20000)\n")
    assert list(tmp_path.iterdir()) == []


def test_a_profile_file_that_is_not_there_is_named_as_a_file(tmp_path):
    with pytest.raises(UserError, match=r"^profile file .*nowhere.yaml not found; expected a path"):
        load_profile(str(tmp_path / "nowhere.yaml"))


def test_a_profile_that_is_not_yaml_is_refused_with_its_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: b\nbatch_sizes: [1, 8\nthreads: 1\n")
    with pytest.raises(UserError, match=r"broken.yaml: not a valid YAML profile at line \d+: .+") as err:
        load_profile(str(path))
    assert "\n" not in str(err.value)


def test_overrides_are_validated_as_the_profile_file_is():
    with pytest.raises(UserError, match="fixed lengths >= 2"):
        profiles.with_overrides(load_profile("cpu"), {"sequence_lengths": [1]})
    assert profiles.with_overrides(load_profile("cpu"), {"batch_sizes": [2]}).batch_sizes == [2]


def test_the_measuring_environment_records_each_profiles_threads():
    from compressor.bench.measure import measuring_environment
    env = measuring_environment([load_profile("cpu-1thread")])
    assert env["threads"] == {"cpu-1thread": 1} and "torch_threads" not in env


def test_a_graph_without_an_export_record_gets_the_precision_of_its_operators(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from compressor.evaluate import graph_precision

    def graph(op: str, dtype=TensorProto.FLOAT):
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
        node = helper.make_node(op, ["x"], ["y"])
        init = [helper.make_tensor("w", dtype, [1], [1.0])]
        model = helper.make_model(helper.make_graph([node], "g", inputs, [], init))
        path = tmp_path / f"{op}-{dtype}.onnx"
        onnx.save(model, str(path))
        return path
    assert graph_precision(graph("MatMulInteger")) == "int8"          # Optimum's dynamic int8, e.g.
    assert graph_precision(graph("MatMulNBits")) == "int4"
    assert graph_precision(graph("Relu", TensorProto.FLOAT16)) == "fp16"
    assert graph_precision(graph("Relu")) == "fp32"
