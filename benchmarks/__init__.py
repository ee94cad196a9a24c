"""Benchmarks: `autostatic.AutoModule` against Equinox and plain-pytree floors.

Run with `python -m benchmarks [--quick | --full | --smoke] [--only SECTION[,SECTION]]
[--out DIR | --write-results] [--sizes 4,32,256]` (`--help` lists the sections). Results
go to `benchmarks/out/<backend>/` (ignored by git) unless `--out DIR` is given; only
`--write-results` writes the committed `benchmarks/results/<backend>/`.

Modules:

- `models`: the same MLP / transformer / mixed-container models in every implementation
  (`autostatic`, `eqx-static`, `eqx-filter`, `dataclass`, `dict`), built from one set of
  arrays, plus the jit variants each implementation is called with.
- `timing`: the interleaved timing harness (timeit-style batches, gc off, every cell in a
  reshuffled order every round, ratios paired per round) and small statistics helpers.
- `scenarios`: what is measured: pytree operations, dispatch, async dispatch, retracing,
  time to first call, training-step throughput.
- `report`: tables, targets (MET / MISSED; not judged in `--smoke`), `results.json` and
  PNG plots.
- `runner`: the command line (`main(argv)`), also used in-process by the smoke test.
- `micro`: micro-benchmarks behind single design decisions (aux comparison, the routed
  `eqx.tree_at`): `python -m benchmarks.micro`.
- `test_bench`: a few pytest-benchmark tests (`python -m pytest benchmarks/test_bench.py
  --benchmark-only`).
"""
