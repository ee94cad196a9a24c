"""The design-exploration notebook.

It executes without errors against the committed benchmark results (read by default)
and against a run that has the eqx.nn models; every matplotlib Axes it creates has an
x and a y label; the committed notebook is the current `make_notebook.py` cells built
from the committed results. Its shape: no code cell longer than `MAX_CELL_LINES`, the
helpers imported from `examples/notebook_helpers.py` and never pasted. Its claims: each
alternative's demonstration prints the failure it describes, and the conclusion carries
the numbers of the results file (recomputed here from the JSON). The plot and table
helpers are also checked on a small synthetic results dict. Each checker that reads a
notebook is run on a doctored one too, so it is known to be able to fail.
"""

import ast
import contextlib
import copy
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
ECOSYSTEM_RESULTS = ROOT / "ecosystem" / "results" / "results.json"
NOTEBOOK = EXAMPLES / "design_exploration.ipynb"
MAX_CELL_LINES = 40


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


nh = _load("notebook_helpers")
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


def _mlp() -> dict[str, Any]:
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


def _real_models() -> dict[str, Any]:
    ops = {
        "build": "build (around made layers)",
        "flatten": "flatten",
        "dispatch": "dispatch (jax.jit; eqx-filter: eqx.filter_jit)",
    }
    fails = {"fails": "TypeError: jax.jit: non-array leaf of type custom_jvp"}
    linear = {
        "build": {"eqx-static": _r(3.0), "eqx-filter": _r(3.5)},
        "flatten": {"eqx-static": _r(0.2), "eqx-filter": _r(0.2)},
        "dispatch": {"eqx-static": _r(0.4), "eqx-filter": _r(0.2)},
    }
    transformer = {
        "build": {"eqx-static": _r(0.9), "eqx-filter": _r(1.1)},
        "flatten": {"eqx-static": _r(0.2), "eqx-filter": _r(0.2)},
        "dispatch": {"eqx-filter": _r(0.2)},
        "dispatch_partitioned": {"eqx-static": _r(0.35), "eqx-filter": _r(0.3)},
    }
    return {
        "impls": ["autostatic", "eqx-static", "eqx-filter"],
        "ops": ops,
        "models": {
            "linear-256": {
                "rounds": 10,
                "info": {},
                "ops_us": {"flatten": {"autostatic": _r(1.0)}},
                "ratios": linear,
            },
            "transformer": {
                "rounds": 10,
                "info": {},
                "ops_us": {"dispatch": {"autostatic": _r(1.0), "eqx-static": fails}},
                "ratios": transformer,
            },
        },
    }


def synthetic_results(real: bool = True) -> dict[str, Any]:
    training = {
        "autostatic / jax.jit": {
            "ms_per_step": 1.0,
            "steps_per_s": 1000.0,
            "throughput_ratios": {"eqx-static / eqx.filter_jit": _r(2.0)},
        },
        "eqx-static / jax.jit": {"ms_per_step": 1.25, "steps_per_s": 800.0},
        "eqx-static / eqx.filter_jit": {"ms_per_step": 2.0, "steps_per_s": 500.0},
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
        "tree_ops": {"mlp-4": _mlp(), "mlp-32": _mlp()},
        "training": {"mlp-32": {"variants": training}},
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
        results["real_models"] = _real_models()
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


def test_attempt_prints_type_and_first_line(capsys):
    class Boom(Exception):
        pass

    def fail() -> None:
        raise Boom(f"bad thing at {hex(id(fail))}\nsecond line")

    nh.attempt("fine", lambda: 3)
    nh.attempt("broken", fail)
    out = capsys.readouterr().out.splitlines()
    assert out == ["fine: ok, 3", "broken: Boom: bad thing"]


PLOTS = ["plot_mlp_overhead", "plot_training", "plot_real_models", "plot_losses"]


@pytest.mark.parametrize("name", PLOTS)
def test_every_plot_is_labelled_and_says_which_way_is_better(name):
    fig = getattr(nh, name)(synthetic_results())
    assert fig is not None and fig.axes
    assert unlabelled_axes(fig.axes) == []
    assert all("lower is better" in ax.get_title() for ax in fig.axes)
    plt.close(fig)


def test_colours_are_the_benchmark_reports():
    """One colour per implementation, the mapping `benchmarks/report.py` uses."""
    from benchmarks.report import IMPL_COLOURS

    assert nh.IMPL_COLOURS is IMPL_COLOURS
    wanted = {
        "autostatic": "tab:blue",
        "eqx-static": "tab:orange",
        "eqx-filter": "tab:green",
        "dataclass": "tab:purple",
        "dict": "black",
    }
    assert {k: IMPL_COLOURS[k] for k in wanted} == wanted
    fig = nh.plot_mlp_overhead(synthetic_results())
    by_label = {v: k for k, v in nh.IMPL_LABELS.items()}
    lines = [
        ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label() in by_label
    ]
    assert lines and all(
        ln.get_color() == IMPL_COLOURS[by_label[str(ln.get_label())]] for ln in lines
    )
    plt.close(fig)


def test_ratio_plots_mark_one():
    """The ratio plots draw the 1.0 line (labelled in the legend)."""
    for name in ("plot_real_models", "plot_losses"):
        fig = getattr(nh, name)(synthetic_results())
        labels = [
            label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]
        ]
        assert "1.0: same time" in labels, name
        plt.close(fig)


def test_real_models_plot_compares_both_baselines():
    fig = nh.plot_real_models(synthetic_results())
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
        assert nh.plot_real_models(synthetic_results(real=False)) is None
    assert "not in these results" in out.getvalue()
    # The table falls back to the benchmark models.
    assert "**benchmark models**" in nh.fair_twin_table(synthetic_results(real=False))


def test_fair_twin_table_falls_back_to_the_partitioned_twin():
    """Where plain jax.jit refuses the fair twin, its dispatch cell is the partitioned
    twin's ratio, marked; a measured fair twin keeps its own."""
    text = nh.fair_twin_table(synthetic_results())
    row = next(x for x in text.splitlines() if x.startswith("| jit dispatch"))
    assert row == "| jit dispatch | 0.40x / 0.20x | 0.35x† / 0.20x |", row
    assert "†: plain `jax.jit` refuses the fair twin" in text


def test_models_table_is_the_benchmark_models():
    text = nh.models_table(synthetic_results())
    assert text.startswith("**benchmark models**")
    assert "| flatten | 0.20x / - | 0.20x / - |" in text
    assert "| jit dispatch | 0.50x / 0.15x | 0.50x / 0.15x |" in text


def test_comparisons_and_losses():
    rows = nh.comparisons(synthetic_results())
    by = {(r.section, r.model, r.op, r.ref): r for r in rows}
    assert by[nh.REAL, "linear-256", "build", nh.FAIR].median == 3.0
    assert (nh.REAL, "transformer", "dispatch", nh.FAIR) not in by
    assert by[nh.MODELS, "mlp-4", "dispatch", nh.FILTER].median == 0.15
    # Training: a paired throughput ratio of 2.0 is a time ratio of 0.5, quartiles
    # swapped; the fair twin has no paired ratio here: the ratio of the medians.
    filt = by[nh.TRAINING, "mlp-32", "step", nh.FILTER]
    assert (filt.median, filt.q1, filt.q3) == pytest.approx((0.5, 1 / 2.2, 1 / 1.8))
    fair = by[nh.TRAINING, "mlp-32", "step", nh.FAIR]
    assert fair.median == pytest.approx(0.8) and not fair.paired

    lost = nh.losses(synthetic_results())
    assert all(r.median > 1 for r in lost)
    assert lost[0].median == 3.5  # slowest first
    text = nh.losses_text(synthetic_results())
    assert (
        "| eqx.nn models | build (around made layers) | fair twin | linear-256 "
        "| 3.00x | 1 of 1 |" in text
    )
    assert (
        "| benchmark models | treedef == | fair twin | mlp-4, mlp-32 | 1.30x |" in text
    )
    assert "transformer, dispatch (jax.jit; eqx-filter: eqx.filter_jit)" in text


def test_retracing_text_ignores_stale_floor():
    text = nh.retracing_text(synthetic_results())
    assert "`float_hparam`: AutoModule 2, fewer: `eqx-filter / jax.jit` 1" in text
    assert "`dict / jax.jit` 1" not in text and "1 stale" in text


def test_conclusion_on_synthetic_results():
    ecosystem = {
        "lib": {
            "version": "1.0",
            "outcomes": [
                {"mode": "baseline", "selected": 10, "passed": 10},
                {"mode": "b2", "selected": 10, "passed": 9},
            ],
        }
    }
    text = nh.conclusion(synthetic_results(), ecosystem)
    assert "range over the 2 eqx.nn models (linear-256, transformer)" in text
    assert "* flatten (paid" in text and "0.20x the fair twin's time" in text
    # Dispatch against the fair twin: 0.40x measured, 0.35x partitioned.
    assert "0.35x–0.40x the fair twin's time (on 1, the twin partitioned" in text
    assert "* build (paid once per model, when it is constructed): 0.90x–3.00x" in text
    assert "* training step (forward + grad + adam): 0.80x the fair twin's" in text
    assert "* lib 1.0: 10 of 10 pass as installed; 9 of 10 pass rebased, every" in text
    verdict = text.split("**Verdict.**")[1]
    assert "on every model in flatten and jit dispatch" in verdict
    assert "slower in no operation on every model" in verdict


def test_default_results_are_the_committed_ones(monkeypatch):
    monkeypatch.delenv(nh.RESULTS_ENV, raising=False)
    path, committed = nh.results_path()
    assert committed and path.resolve() == COMMITTED_RESULTS.resolve()
    monkeypatch.setenv(nh.RESULTS_ENV, "/elsewhere/results.json")
    assert nh.results_path() == (Path("/elsewhere/results.json"), False)
    assert make_notebook.RESULTS_ENV == nh.RESULTS_ENV


def test_make_notebook_refuses_committed_notebook_from_other_results(monkeypatch):
    monkeypatch.setenv(nh.RESULTS_ENV, "/elsewhere/results.json")
    with pytest.raises(SystemExit):
        make_notebook.main([])


# --------------------------------------------------------------------------------------
# The notebook's shape, from its cells.
# --------------------------------------------------------------------------------------


def long_code_cells(notebook: nbformat.NotebookNode, limit: int) -> list[str]:
    """The first line of every code cell longer than `limit` lines."""
    return [
        c.source.splitlines()[0]
        for c in notebook.cells
        if c.cell_type == "code" and len(c.source.splitlines()) > limit
    ]


def pasted_helpers(notebook: nbformat.NotebookNode) -> list[str]:
    """Functions of `notebook_helpers.py` that a code cell defines again."""
    tree = ast.parse((EXAMPLES / "notebook_helpers.py").read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    return sorted(n for n in names if f"def {n}(" in code)


def test_shape_checkers_can_fail():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("x = 1\n" * (MAX_CELL_LINES + 1)),
        nbformat.v4.new_code_cell("def conclusion(results, ecosystem):\n    pass"),
    ]
    assert long_code_cells(notebook, MAX_CELL_LINES) == ["x = 1"]
    assert pasted_helpers(notebook) == ["conclusion"]


def test_notebook_cells_are_short_and_import_the_helpers():
    notebook = make_notebook.build()
    assert long_code_cells(notebook, MAX_CELL_LINES) == []
    assert pasted_helpers(notebook) == []
    imports = [c for c in notebook.cells if "import notebook_helpers" in c.source]
    assert len(imports) == 1 and imports[0].cell_type == "code"


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
    return _execute({nh.RESULTS_ENV: None})


@pytest.fixture(scope="module")
def real_models_run(tmp_path_factory) -> nbformat.NotebookNode:
    path = tmp_path_factory.mktemp("results") / "results.json"
    path.write_text(json.dumps(synthetic_results()))
    return _execute({nh.RESULTS_ENV: str(path)})


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
    assert "fair twin holding an eqx.nn.MLP, jax.jit, output shape: TypeError" in live
    assert "AutoModule holding an eqx.nn.MLP, jax.jit, output shape: ok, (2,)" in live
    assert "AutoModule, jax.jit" in _text([_cell(notebook, "class AutoScaled")])
    # ... and so did the comparison with both baselines.
    compare = _cell(notebook, "nh.fair_twin_table(results)")
    assert "vs fair twin / vs eqx.filter_jit" in _text([compare])
    assert _images(_cell(notebook, "nh.plot_training(results)")) == 1
    assert "In this run:" in _text([_cell(notebook, "nh.losses_text(results)")])


def test_notebook_reads_committed_results_by_default(committed_run):
    text = _text([_cell(committed_run, "results, source = nh.load_results()")])
    assert f"results: {nh.COMMITTED} (committed;" in text
    committed = json.loads(COMMITTED_RESULTS.read_text())
    assert _provenance(committed) in text
    models = _cell(committed_run, "nh.plot_real_models(results)")
    if committed.get("real_models"):
        assert _images(models) == 1
    else:  # results from before the eqx.nn models: said, not crashed
        assert _images(models) == 0
        assert "real_models section): not in these results" in _text([models])


def test_notebook_eqx_nn_model_cell_plots(real_models_run):
    text = _text([_cell(real_models_run, "results, source = nh.load_results()")])
    assert "AUTOSTATIC_RESULTS: development only" in text
    assert _provenance(synthetic_results()) in text
    assert _images(_cell(real_models_run, "nh.plot_real_models(results)")) == 1
    assert "| linear-256 | transformer |" in _text(
        [_cell(real_models_run, "nh.fair_twin_table(results)")]
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
    assert f"results: {nh.COMMITTED} (committed;" in text
    assert _provenance(json.loads(COMMITTED_RESULTS.read_text())) in text


# --------------------------------------------------------------------------------------
# What the alternatives' demonstrations and the conclusion claim, in their outputs.
# --------------------------------------------------------------------------------------

# Per demonstration: the cell's marker, the line where the AutoModule half of its output
# starts, what the toy rule's half must print (its failures), and what AutoModule's must.
DEMOS: dict[str, tuple[str, list[str], list[str]]] = {
    "class AtAssignment(Toy)": (
        "AutoModule: ",
        [
            "decide at assignment: 0 leaves, gradient of layers[0] [3. 4.]",
            "decide at assignment: the same jit, a second model: ValueError: "
            "Exception raised while checking equality of metadata fields",
        ],
        [
            "AutoModule: 1 leaves, gradient of layers[0] [6. 8.]",
            "AutoModule: the same jit, a second model: ok, 61.0",
        ],
    ),
    "class AtFlatten(Toy)": (
        "AutoModule: ",
        [
            "decide at every flatten: the model's treedef kept by a tree of 0s False, "
            "by eval_shape False",
            "jax.vmap, in_axes the tree of 0s: ValueError: vmap in_axes specification "
            "must be a tree prefix",
            "jax.tree.map over model and shapes: ValueError: pytree structure error",
            "eqx.partition (as eqx.filter_jit does): ValueError: pytree structure error",
        ],
        [
            "AutoModule: the model's treedef kept by a tree of 0s True, by eval_shape True",
            "jax.vmap, in_axes the tree of 0s: ok, [3. 3.]",
            "jax.tree.map over model and shapes: ok, True",
            "eqx.partition (as eqx.filter_jit does): ok",
        ],
    ),
    "class Hinted(Toy)": (
        "AutoHinted: ",
        [
            "Hinted: leaves [1.0], gradient of layers[0] [3. 4.]",
            "the same jit, a second model: ValueError: Exception raised while checking "
            "equality of metadata fields",
            "`if m.scale > 0.5` under jax.jit: TracerBoolConversionError",
        ],
        [
            "gradient of layers[0] [6. 8.]",
            "the same jit, a second model: ok, 61.0",
            # The ambiguous hint: a Python float there is a leaf in AutoModule too.
            "`if m.scale > 0.5` under jax.jit: TracerBoolConversionError",
        ],
    ),
    "class PerAttribute(Toy)": (
        "AutoModule: ",
        [
            "per attribute, all dynamic: jax.jit: TypeError: non-array leaf of type str",
            "per attribute, all static: gradient of parts[0] [3. 4.]",
            "per attribute, all static: the same jit, a second model: ValueError: "
            "Exception raised while checking equality of metadata fields",
        ],
        [
            "AutoModule: gradient of parts[0] [3. 3.]",
            "AutoModule: the same jit, a second model: ok, 42.0",
            ".parts[0]  dynamic",
        ],
    ),
}


def demo_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Each expected line a demonstration's output lacks, on its side (the toy's
    output before the AutoModule half, AutoModule's after it)."""
    problems = []
    for marker, (split, toy, auto) in DEMOS.items():
        text = _text([_cell(notebook, marker)])
        at = text.find(split)
        if at < 0:
            problems.append(f"{marker}: no line starting {split!r}")
            continue
        for side, wanted in ((text[:at], toy), (text[at:], auto)):
            problems += [f"{marker}: {w!r}" for w in wanted if w not in side]
    return problems


def _span(values: list[float]) -> str:
    lo, hi = f"{min(values):.2f}x", f"{max(values):.2f}x"
    return lo if lo == hi else f"{lo}–{hi}"


def conclusion_numbers(results: dict[str, Any], ecosystem: dict[str, Any]) -> list[str]:
    """The ranges and counts the conclusion must state, computed from the JSON alone:
    per eqx.nn-model operation and baseline, the range of the median ratios (the fair
    twin's dispatch partitioned where plain jax.jit refuses it); the training step's
    time ratios (inverse throughput ratios); each library's pass counts per mode."""
    wanted = []
    models = results["real_models"]["models"].values()
    for op in ("flatten", "unflatten_read", "dispatch", "treedef_eq", "build"):
        for impl, whose in (
            ("eqx-static", "the fair twin's time"),
            ("eqx-filter", "eqx.filter_jit's"),
        ):
            values = []
            for m in models:
                found = m["ratios"].get(op, {}).get(impl)
                if found is None and op == "dispatch":
                    found = m["ratios"].get("dispatch_partitioned", {}).get(impl)
                if found is not None:
                    values.append(found["median"])
            if values:
                wanted.append(f"{_span(values)} {whose}")
    for variant, before, after in (
        ("eqx-static / jax.jit", "(forward + grad + adam): ", " the fair twin's time"),
        ("eqx-filter / eqx.filter_jit", "and ", " eqx.filter_jit's"),
    ):
        values = [
            1
            / t["variants"]["autostatic / jax.jit"]["throughput_ratios"][variant][
                "median"
            ]
            for t in results["training"].values()
        ]
        wanted.append(f"{before}{_span(values)}{after}")
    for library, result in ecosystem.items():
        for o in result["outcomes"]:
            wanted.append(f"{o['passed']} of {o['selected']} pass")
        wanted.append(f"* {library} {result['version']}: ")
    return wanted


def conclusion_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """What the conclusion cell's output lacks of the committed files' numbers."""
    text = _text([_cell(notebook, "nh.conclusion(results")])
    results = json.loads(COMMITTED_RESULTS.read_text())
    ecosystem = json.loads(ECOSYSTEM_RESULTS.read_text())
    return [n for n in conclusion_numbers(results, ecosystem) if n not in text]


def _doctored(notebook: nbformat.NotebookNode, replace: str) -> nbformat.NotebookNode:
    """A copy whose stream and markdown outputs have every digit 0-9 and every
    'Error' word replaced, as if the code had printed something else."""
    doctored = copy.deepcopy(notebook)
    for c in doctored.cells:
        for o in c.get("outputs", []):
            if "text" in o:
                o["text"] = o["text"].replace("Error", replace).replace("0.", "9.")
            data = o.get("data", {})
            if "text/markdown" in data:
                data["text/markdown"] = data["text/markdown"].replace("0.", "9.")
    return doctored


def test_claim_checkers_can_fail():
    committed = nbformat.read(NOTEBOOK, as_version=4)
    doctored = _doctored(committed, "Fine")
    assert demo_problems(doctored)
    assert conclusion_problems(doctored)


def test_demonstrations_show_their_failures_in_the_committed_notebook():
    assert demo_problems(nbformat.read(NOTEBOOK, as_version=4)) == []


def test_demonstrations_show_their_failures_when_run(committed_run):
    assert demo_problems(committed_run) == []


def test_conclusion_quotes_the_results_file():
    assert conclusion_problems(nbformat.read(NOTEBOOK, as_version=4)) == []


def test_conclusion_quotes_the_results_file_when_run(committed_run):
    assert conclusion_problems(committed_run) == []
