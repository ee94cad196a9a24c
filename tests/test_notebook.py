"""The design-exploration notebook.

It executes without errors against the committed benchmark results (read by default)
and against a run that has the eqx.nn models; every matplotlib Axes it creates has an
x and a y label; the fair-twin and eqx.nn-model cells run; the committed notebook is
the current `make_notebook.py` cells built from the committed results. Benchmark
verdicts and numbers depend on the committed run and are not checked here; the plot
and table helpers (`examples/notebook_plot_cell.py`) are checked on a small synthetic
results dict instead.
"""

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib
import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
COMMITTED_RESULTS = ROOT / "benchmarks" / "results" / "cpu" / "results.json"
NOTEBOOK = EXAMPLES / "design_exploration.ipynb"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cell = _load("notebook_plot_cell")
make_notebook = _load("make_notebook")

# Run in the notebook's kernel: first (records every Axes created), and last (checks
# them). The same checker is unit-tested below, so it is known to be able to fail.
CHECKER = '''
def unlabelled_axes(axes):
    """Axes without an x label or without a y label, described."""
    return [
        f"{ax.get_title() or '(untitled)'}: x {ax.get_xlabel()!r}, y {ax.get_ylabel()!r}"
        for ax in axes
        if not (ax.get_xlabel().strip() and ax.get_ylabel().strip())
    ]
'''
RECORDER = """
import matplotlib.axes as _mpl_axes

_CREATED_AXES = []
_axes_init = _mpl_axes.Axes.__init__

def _recording_init(self, *args, **kwargs):
    _axes_init(self, *args, **kwargs)
    _CREATED_AXES.append(self)

_mpl_axes.Axes.__init__ = _recording_init
"""
CHECK = (
    CHECKER
    + """
_bad = unlabelled_axes(_CREATED_AXES)
assert not _bad, f"Axes without labels: {_bad}"
print(f"AXES CHECKED: {len(_CREATED_AXES)} all labelled")
"""
)


def unlabelled_axes(axes: Any) -> list[str]:
    namespace: dict[str, Any] = {}
    exec(CHECKER, namespace)
    return namespace["unlabelled_axes"](axes)


# --------------------------------------------------------------------------------------
# A small synthetic results dict, shaped like `python -m benchmarks` output.
# --------------------------------------------------------------------------------------


def _r(median: float) -> dict[str, float]:
    return {"median": median, "q1": median * 0.9, "q3": median * 1.1, "n": 10}


def synthetic_results(real: bool = True) -> dict[str, Any]:
    def mlp() -> dict[str, Any]:
        impls = ("autostatic", "eqx-static", "eqx-filter", "dict")
        return {
            "ops_us": {i: {"flatten": _r(10.0), "unflatten": _r(20.0)} for i in impls},
            "ratios": {
                "eqx-static": {
                    "autostatic": {
                        "flatten": _r(0.2),
                        "unflatten_read": _r(0.7),
                        "treedef_eq": _r(1.3),
                        "build": _r(1.5),
                    }
                }
            },
            "dispatch_us": {
                "autostatic / jax.jit": {
                    **_r(20.0),
                    "ratios": {
                        "eqx-static / jax.jit": _r(0.5),
                        "eqx-filter / eqx.filter_jit": _r(0.15),
                    },
                },
                "eqx-static / jax.jit": _r(40.0),
                "eqx-filter / eqx.filter_jit": _r(130.0),
            },
        }

    results: dict[str, Any] = {
        "machine": {
            "mode": "synthetic",
            "date": "2000-01-01T00:00:00+00:00",
            "git_commit": "0000000",
            "platform": "test",
            "cpu_count": 2,
            "cpus_usable": 2,
            "backend": "cpu",
            "device_kind": "cpu",
            "device_count": 1,
            "versions": {"jax": "0", "equinox": "0"},
        },
        "tree_ops": {"mlp-4": mlp(), "mlp-32": mlp()},
        "training": {
            "mlp-32": {
                "variants": {
                    "autostatic / jax.jit": {
                        "ms_per_step": 1.0,
                        "steps_per_s": 1000.0,
                        "throughput_ratios": {"eqx-static / eqx.filter_jit": _r(2.0)},
                    },
                    "eqx-static / jax.jit": {"ms_per_step": 1.25, "steps_per_s": 800.0},
                    "eqx-static / eqx.filter_jit": {
                        "ms_per_step": 2.0,
                        "steps_per_s": 500.0,
                    },
                }
            }
        },
        "retracing": {
            "scenarios": {
                "float_hparam": {
                    "description": "float 1.0, 2.0, 1.0, 2.0",
                    "ideal": 2,
                    "static_values_equal": False,
                }
            },
            "counts": {
                "autostatic / jax.jit": {"float_hparam": {"count": 2}},
                "eqx-filter / jax.jit": {"float_hparam": {"count": 1}},
                "dict / jax.jit": {"float_hparam": {"count": 1, "stale": True}},
            },
        },
        "targets": [{"target": "t", "where": "w", "value": 0.5, "status": "MET"}],
    }
    if real:
        ops = {
            "build": "build (around made layers)",
            "flatten": "flatten",
            "dispatch": "dispatch (jax.jit; eqx-filter: eqx.filter_jit)",
        }
        fails = {"fails": "TypeError: jax.jit: non-array leaf of type custom_jvp"}
        results["real_models"] = {
            "impls": ["autostatic", "eqx-static", "eqx-filter"],
            "ops": ops,
            "models": {
                "linear-256": {
                    "rounds": 10,
                    "info": {},
                    "ops_us": {"flatten": {"autostatic": _r(1.0)}},
                    "ratios": {
                        "build": {"eqx-static": _r(3.0), "eqx-filter": _r(3.5)},
                        "flatten": {"eqx-static": _r(0.2), "eqx-filter": _r(0.2)},
                        "dispatch": {"eqx-static": _r(0.4), "eqx-filter": _r(0.2)},
                    },
                },
                "transformer": {
                    "rounds": 10,
                    "info": {},
                    "ops_us": {
                        "dispatch": {"autostatic": _r(1.0), "eqx-static": fails}
                    },
                    "ratios": {
                        "build": {"eqx-static": _r(0.9), "eqx-filter": _r(1.1)},
                        "flatten": {"eqx-static": _r(0.2), "eqx-filter": _r(0.2)},
                        "dispatch": {"eqx-filter": _r(0.2)},
                        "dispatch_partitioned": {
                            "eqx-static": _r(0.35),
                            "eqx-filter": _r(0.3),
                        },
                    },
                },
            },
        }
    return results


# --------------------------------------------------------------------------------------
# The helpers, directly.
# --------------------------------------------------------------------------------------


def test_label_checker_can_fail():
    fig, (labelled, bare) = plt.subplots(1, 2)
    labelled.set(xlabel="x", ylabel="y")
    bare.set(xlabel="x", title="no y label")
    assert unlabelled_axes([labelled]) == []
    assert unlabelled_axes([labelled, bare]) == ["no y label: x 'x', y ''"]
    plt.close(fig)


PLOTS = ["plot_mlp_overhead", "plot_fair_twin", "plot_real_models", "plot_losses"]


@pytest.mark.parametrize("name", PLOTS)
def test_every_plot_has_labelled_axes(name):
    fig = getattr(cell, name)(synthetic_results())
    assert fig is not None and fig.axes
    assert unlabelled_axes(fig.axes) == []
    assert all(ax.get_title() for ax in fig.axes)
    plt.close(fig)


def test_ratio_plots_mark_one():
    """The ratio plots draw the 1.0 line (labelled in the legend)."""
    for name in PLOTS[1:]:
        fig = getattr(cell, name)(synthetic_results())
        labels = [
            label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]
        ]
        assert "1.0: same time" in labels, name
        plt.close(fig)


def test_real_models_plot_compares_both_baselines():
    fig = cell.plot_real_models(synthetic_results())
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2
    assert "fair twin" in titles[0] and "eqx.filter_jit" in titles[1]
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    # The transformer's fair-twin dispatch fails: marked, not drawn.
    assert any(t.get_text() == "fails / n/a" for t in fig.axes[0].texts)
    plt.close(fig)


def test_missing_real_models_is_said_not_crashed():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cell.plot_real_models(synthetic_results(real=False)) is None
    assert "not in these results" in out.getvalue()
    # The table falls back to the MLP floor.
    assert "**MLP floor**" in cell.fair_twin_table(synthetic_results(real=False))


def test_fair_twin_table_falls_back_to_the_partitioned_twin():
    """Where plain jax.jit refuses the fair twin, its dispatch cell is the partitioned
    twin's ratio, marked; a measured fair twin keeps its own."""
    text = cell.fair_twin_table(synthetic_results())
    row = next(x for x in text.splitlines() if x.startswith("| jit dispatch"))
    assert row == "| jit dispatch | 0.40x / 0.20x | 0.35x† / 0.20x |", row
    assert "†: plain `jax.jit` refuses the fair twin" in text


def test_comparisons_and_losses():
    rows = cell.comparisons(synthetic_results())
    by = {(r.section, r.model, r.op, r.ref): r for r in rows}
    assert by["eqx.nn models", "linear-256", "build", cell.FAIR].median == 3.0
    assert ("eqx.nn models", "transformer", "dispatch", cell.FAIR) not in by
    assert by["MLP floor", "mlp-4", "dispatch", cell.FILTER].median == 0.15
    # Training: a paired throughput ratio of 2.0 is a time ratio of 0.5, quartiles
    # swapped; the fair twin has no paired ratio here: the ratio of the medians.
    filt = by["training step", "mlp-32", "step", cell.FILTER]
    assert (filt.median, filt.q1, filt.q3) == pytest.approx((0.5, 1 / 2.2, 1 / 1.8))
    fair = by["training step", "mlp-32", "step", cell.FAIR]
    assert fair.median == pytest.approx(0.8) and not fair.paired

    lost = cell.losses(synthetic_results())
    assert all(r.median > 1 for r in lost)
    assert lost[0].median == 3.5  # slowest first
    text = cell.losses_text(synthetic_results())
    assert "linear-256 | build (around made layers) | fair twin | 3.00x" in text
    assert "transformer, dispatch (jax.jit; eqx-filter: eqx.filter_jit)" in text


def test_retracing_text_ignores_stale_floor():
    text = cell.retracing_text(synthetic_results())
    assert "`float_hparam`: AutoModule 2, fewer: `eqx-filter / jax.jit` 1" in text
    assert "`dict / jax.jit` 1" not in text and "1 stale" in text


def test_default_results_are_the_committed_ones(monkeypatch):
    monkeypatch.delenv(cell.RESULTS_ENV, raising=False)
    path, committed = cell.results_path()
    assert committed and (EXAMPLES / path).resolve() == COMMITTED_RESULTS.resolve()
    monkeypatch.setenv(cell.RESULTS_ENV, "/elsewhere/results.json")
    assert cell.results_path() == (Path("/elsewhere/results.json"), False)


def test_make_notebook_refuses_committed_notebook_from_other_results(monkeypatch):
    monkeypatch.setenv(cell.RESULTS_ENV, "/elsewhere/results.json")
    with pytest.raises(SystemExit):
        make_notebook.main([])


# --------------------------------------------------------------------------------------
# The notebook, executed.
# --------------------------------------------------------------------------------------


def _execute(env: dict[str, str | None]) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(RECORDER))
    notebook.cells.append(nbformat.v4.new_code_cell(CHECK))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
        client = nbclient.NotebookClient(
            notebook,
            timeout=300,
            kernel_name="python3",
            resources={"metadata": {"path": str(EXAMPLES)}},
        )
        client.execute()  # raises CellExecutionError on any failing cell
    return notebook


@pytest.fixture(scope="module")
def committed_run() -> nbformat.NotebookNode:
    return _execute({cell.RESULTS_ENV: None})


@pytest.fixture(scope="module")
def real_models_run(tmp_path_factory) -> nbformat.NotebookNode:
    path = tmp_path_factory.mktemp("results") / "results.json"
    path.write_text(json.dumps(synthetic_results()))
    return _execute({cell.RESULTS_ENV: str(path)})


def _text(cells: list[Any]) -> str:
    parts = []
    for c in cells:
        for o in c.get("outputs", []):
            parts.append(o.get("text", ""))
            parts.append(o.get("data", {}).get("text/markdown", ""))
    return "".join(parts)


def _cell(notebook: nbformat.NotebookNode, marker: str) -> Any:
    found = [c for c in notebook.cells if c.cell_type == "code" and marker in c.source]
    assert len(found) == 1, marker
    return found[0]


def _images(c: Any) -> int:
    return sum("image/png" in o.get("data", {}) for o in c.outputs)


def _provenance(results: dict[str, Any]) -> str:
    m = results["machine"]
    return f"run: {m['mode']} mode, {m['date']}, git commit {m.get('git_commit', '?')}"


@pytest.mark.parametrize("run", ["committed_run", "real_models_run"])
def test_notebook_executes_with_labelled_axes(run, request):
    notebook = request.getfixturevalue(run)
    text = _text(notebook.cells)
    assert "AXES CHECKED:" in text
    assert int(text.split("AXES CHECKED: ")[1].split()[0]) >= 3
    # The notebook's own computations (not the benchmark's verdicts).
    assert ".layers[0].weight" in text
    # The fair twin: the live cell ran ...
    live = _text([_cell(notebook, "class TwinLayer(eqx.Module)")])
    assert "fair twin under jax.jit:         [2. 2.]" in live
    assert "fair twin has the AutoModule's leaves: True" in live
    assert "fair twin holding an eqx.nn.MLP, jax.jit: TypeError" in live
    assert "AutoModule holding an eqx.nn.MLP, jax.jit: output shape (2,)" in live
    assert "AutoModule, jax.jit" in _text([_cell(notebook, "class AutoScaled")])
    # ... and so did the comparison with both baselines.
    compare = _cell(notebook, "plot_fair_twin(results)")
    assert "vs fair twin / vs eqx.filter_jit" in _text([compare])
    assert _images(compare) == 1
    assert "In this run:" in _text([_cell(notebook, "losses_text(results)")])


def test_notebook_reads_committed_results_by_default(committed_run):
    text = _text([_cell(committed_run, "results, source = load_results()")])
    assert f"results: {cell.COMMITTED} (committed;" in text
    committed = json.loads(COMMITTED_RESULTS.read_text())
    assert _provenance(committed) in text
    models = _cell(committed_run, "plot_real_models(results)")
    if committed.get("real_models"):
        assert _images(models) == 1
    else:  # results from before the eqx.nn models: said, not crashed
        assert _images(models) == 0
        assert "real_models section): not in these results" in _text([models])


def test_notebook_eqx_nn_model_cell_plots(real_models_run):
    text = _text([_cell(real_models_run, "results, source = load_results()")])
    assert "AUTOSTATIC_RESULTS: development only" in text
    assert _provenance(synthetic_results()) in text
    assert _images(_cell(real_models_run, "plot_real_models(results)")) == 1
    assert "| linear-256 | transformer |" in _text(
        [_cell(real_models_run, "fair_twin_table(results)")]
    )


def test_committed_notebook_is_current_and_from_committed_results():
    """What is committed: the cells `make_notebook.py` builds now, executed against
    the committed results (regenerate with `python examples/make_notebook.py`)."""
    committed = nbformat.read(NOTEBOOK, as_version=4)
    built = make_notebook.build()
    assert [(c.cell_type, c.source) for c in committed.cells] == [
        (c.cell_type, c.source) for c in built.cells
    ]
    outputs = [o for c in committed.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = _text(committed.cells)
    assert f"results: {cell.COMMITTED} (committed;" in text
    assert _provenance(json.loads(COMMITTED_RESULTS.read_text())) in text
