"""Child process for peak-memory measurement: `python -m compressor.bench.memory_probe JOB_JSON`.

Imports only what the model's runtime needs (an ONNX model never imports torch), loads
the model once the way the benchmark does (the same loader for PyTorch dirs, adapters and
scalar mix included; the profile's threads and graph optimization level for ONNX), and for each set of batches resets the kernel's resident-memory
high-water mark (/proc/self/clear_refs), runs the batches, and reads VmHWM: the resident
memory a process serving this model at that batch size needs. Prints
{"peak_rss_mb": [one reading per set]}. It ends with the benchmark that started it (a
SIGKILL of `compressor run` or `bench` left it running until its calls were done).
"""

from __future__ import annotations

import json
import sys

from pretrain.child_process import end_with_parent


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_hwm() -> None:
    """Start a new high-water mark at the current RSS (Linux >= 4.0; elsewhere a no-op)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def load_batches(path: str) -> list[dict]:
    import numpy as np
    batches: dict[int, dict] = {}
    with np.load(path) as data:
        for key in data.files:
            index, name = key.split(":", 1)
            batches.setdefault(int(index), {})[name] = data[key]
    return [batches[i] for i in sorted(batches)]


def onnx_session(job: dict):
    import onnxruntime as ort

    from compressor.bench.profiles import ort_session_options
    options = ort_session_options(job["threads"], job["graph_optimization"])
    providers = [job["provider"]] + (["CPUExecutionProvider"] if job["provider"] != "CPUExecutionProvider" else [])
    return ort.InferenceSession(job["path"], options, providers=providers)


def onnx_model(job: dict):
    session = onnx_session(job)
    wanted = {i.name for i in session.get_inputs()}

    def run(feed: dict) -> None:
        session.run(None, {k: v for k, v in feed.items() if k in wanted})
    return run


def torch_module(job: dict):
    """The model as the benchmark loads it (compressor.bench.runners.load_torch_model)."""
    from pathlib import Path

    import torch

    from compressor.bench.runners import load_torch_model
    torch.set_num_threads(job["threads"])
    return load_torch_model(Path(job["path"])).eval().to(job["device"])


def torch_model(job: dict):
    import inspect

    import torch
    model = torch_module(job)
    wanted = set(inspect.signature(model.forward).parameters)

    def run(feed: dict) -> None:
        with torch.inference_mode():
            model(**{k: torch.from_numpy(v).to(job["device"]) for k, v in feed.items() if k in wanted})
    return run


def main() -> None:
    job = json.loads(sys.argv[1])
    end_with_parent(job["parent_pid"])     # before the model loads: seconds of an orphan's work
    sets = [load_batches(path) for path in job["inputs"]]
    run = (onnx_model if job["kind"] == "onnx" else torch_model)(job)
    readings = []
    for batches in sets:
        reset_hwm()
        for i in range(job["calls"]):
            run(batches[i % len(batches)])
        readings.append(vm_hwm_mb())
    print(json.dumps({"peak_rss_mb": readings}))


if __name__ == "__main__":
    main()
