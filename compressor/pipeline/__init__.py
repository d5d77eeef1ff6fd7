"""Recipe -> stages -> report.json (+ report.md, report.html, pareto.png).

Stages, in order: the teacher (load, optionally fine-tune); each variant (the teacher with
the variant's passes applied in order); one ONNX export per model when the recipe has
`export: {onnx: true}` (DIR/<name>-onnx/, or DIR/<name>-torch-int8/ for a torch-dynamic-int8
deployment; gated for parity and accuracy); the baselines and one benchmark of every
deployable model on the recipe's hardware profiles when it has `benchmark:`. Every stage
goes through `cached`: its output dir is written atomically (temporary name, then rename)
and carries `stage.json` with a content key (the key of its input, its config, the tool's
version). Rerunning a recipe reuses every stage whose key is unchanged; an interrupted run
(even `kill -9`) resumes after the last finished stage.

    recipe.py            the recipe schema and validation
    api.py               the same recipe built in Python (`Pipeline`)
    run.py               run_recipe: the stages in order, then the report
    plan.py              `compressor run --plan`: each stage cached or to build, nothing run
    stages.py            teacher, variant and export stages
    benchmark_stages.py  baselines and the benchmark stage
    report_data.py       report.json from the finished stages
    cache.py             `cached`, content keys, fingerprints
    outdir.py            owning the output dir, stale temporaries, disk errors
    paths.py             a recipe's relative paths
"""

from compressor.pipeline.run import run_recipe

__all__ = ["run_recipe"]
