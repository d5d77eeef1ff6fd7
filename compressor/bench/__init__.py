"""Measurement: latency, throughput and peak memory of deployable models on hardware profiles.

    runners.py       Deployable (a model as it ships), input batches, loading a runner
    timing.py        interleaved timing, statistics, tie-aware rankings
    measure.py       any list of models on a profile (`measure_models`); a recipe's benchmark
    memory_probe.py  the child process that reads a model's peak memory
    profiles.py      hardware profiles: schema, loading, availability
    baselines.py     what a user would otherwise ship: pytorch-eager-fp32, onnxruntime-fp32,
                     optimum-default-int8
    environment.py   what a measurement ran on

Nothing is imported here: the memory probe child (`python -m compressor.bench.memory_probe`)
must load only what its model's runtime needs (an ONNX model never imports torch).
"""
