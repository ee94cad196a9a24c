"""Benchmarks: `autostatic.AutoModule` against Equinox and dict / dataclass floors.

Run with `python -m benchmarks [--quick | --full | --smoke] [--only SECTION[,SECTION]]
[--out DIR | --write-results] [--sizes 4,32,256] [--gc-off]` (`--help` lists the
sections). Results
go to `benchmarks/out/<backend>/` (ignored by git) unless `--out DIR` is given; only
`--write-results` writes the committed `benchmarks/results/<backend>/`.

Modules:

- `registry`: every benchmark model, one table entry each (how to add one is at its
  top).
- `models`: the synthetic MLP / transformer / mixed-container models in every
  implementation (`autostatic`, `eqx-static`, `eqx-filter`, `dataclass`, `dict`), built
  from one set of arrays, the jit variants each implementation is called with, and
  `Model`, how the registry describes a model.
- `forward`: the synthetic models' forward passes and the dispatch benchmark's cheap
  function on each.
- `real_models`: models built from `eqx.nn` layers, and their measurement.
- `settings`: how much each mode measures.
- `timing`: the interleaved timing harness (timeit-style batches, the garbage
  collector on as users run, off with `--gc-off`; every cell in a reshuffled order
  every round, ratios paired per round) and small statistics helpers.
- `scenarios`: what is measured on the synthetic models: pytree operations, dispatch,
  async dispatch, time to first call.
- `training`: training-step throughput on the synthetic models.
- `scaling`: from 16 to 4,096 layers of the user's own and of `eqx.nn` layers, with
  memory.
- `containers`: the models people write with their parameters in plain containers
  (the README's list of dicts, dicts of dicts, lists of arrays, mixed tuples), at 16,
  256 and 4,096 entries, with memory.
- `retracing`: trace counts, scripted on the MLP and in purpose-built contrasts.
- `construction`: what building, tracing and compiling cost: wrapping made layers and
  arrays, building with the layers' init, trace times, and trace + compile of diffrax
  / optimistix stock and rebased onto AutoModule (`ecosystem_trace`, a script run in
  processes of its own, the rebased ones by `python -m autostatic.rebased`).
- `serialisation`: checkpoint save / load against Equinox's and a numpy floor.
- `schema`: the `results.json` format, as types every producer and reader shares.
- `report`: tables, targets (MET / MISSED; not judged in `--smoke`), the verdict and
  summary, `results.json` and PNG plots (a package, one module per idea).
- `runner`: the command line (`main(argv)`), also used in-process by the smoke test.
- `micro`: micro-benchmarks behind single design decisions (aux comparison, the routed
  `eqx.tree_at`): `python -m benchmarks.micro`.
- `test_bench`: a few pytest-benchmark tests (`python -m pytest benchmarks/test_bench.py
  --benchmark-only`).
"""
