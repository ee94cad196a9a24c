"""The sections of a run: what each measures, where its results go in results.json, and
the steps it plans; and `Run`, one run's options and results as its steps fill them in."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from . import (
    construction,
    containers,
    real_models,
    registry,
    report,
    retracing,
    scaling,
    scenarios as S,
    serialisation,
    training,
)
from .progress import Progress
from .schema import Results, Serialisation
from .settings import Settings
from .timing import frozen_heap

REPO_ROOT = Path(__file__).resolve().parent.parent
REAL_MODELS_STEP = "real models (eqx.nn layers in user modules)"


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a run: its progress label, what it measures, where its result goes,
    and its wall budget (a lower bound for the ETA) where it has one."""

    label: str
    measure: Callable[[], Any]
    store: Callable[[Any], None]
    budget_s: float | None = None


class Run:
    """One run: its options, its results as they fill in, and the parts of every
    synthetic model, made once and shared by every section."""

    def __init__(
        self,
        args: argparse.Namespace,
        settings: Settings,
        results: Results,
        progress: Progress,
    ) -> None:
        self.args, self.settings, self.results = args, settings, results
        self.progress = progress
        self.isolate: bool = (
            args.isolate if args.isolate is not None else args.mode == "full"
        )
        self._parts: dict[str, Any] = {}

    def parts(self, model: str) -> Any:
        """What every implementation of a synthetic model is built from."""
        if model not in self._parts:
            self._parts[model] = registry.make_parts(model)
        return self._parts[model]

    def store(self, key: str, sub: str | None = None) -> Callable[[Any], None]:
        """Puts a step's result at `results[key]` (or `results[key][sub]`; a failed
        step's `None` is not put there)."""
        results = cast(dict[str, Any], self.results)

        def put(res: Any) -> None:
            if sub is None:
                results[key] = res
            elif res is not None:
                results[key][sub] = res

        return put

    def guarded(
        self, name: str, fn: Callable[[], Any], progress: str = "", eta: str = ""
    ) -> Any:
        """`fn()`, or None after recording its exception as the section's error."""
        self.progress.log(f"{progress}{name}{eta}")
        try:
            # keeps the collector's full-heap scans out of every section
            with frozen_heap():
                return fn()
        except Exception as err:
            traceback.print_exc()
            self.results["errors"].append(
                {"section": name, "error": f"{type(err).__name__}: {err}"}
            )
            return None


def group_budget(model: str, settings: Settings) -> float | None:
    """A tree-op group's wall budget: the MLP the targets are read on (256 layers,
    else the deepest) gets more rounds."""
    depth = (
        report.TARGETS_DEPTH
        if report.TARGETS_DEPTH in settings.sizes
        else max(settings.sizes)
    )
    if model == f"mlp-{depth}":
        return settings.target_group_budget_s
    return settings.group_budget_s


def run_tree_ops_in_subprocess(
    model: str, mode: str, sizes: tuple[int, ...], gc_off: bool = False
) -> dict[str, Any]:
    """Runs one tree-op group in a fresh interpreter (like the anchor harness's
    per-size processes), so one model's heap and caches cannot affect another's."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "group.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks",
            f"--{mode}",
            "--worker",
            model,
            "--worker-out",
            str(path),
            "--sizes",
            ",".join(map(str, sizes)),
        ] + (["--gc-off"] if gc_off else [])
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(REPO_ROOT)]
                + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            ),
        )
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0 or not path.exists():
            raise RuntimeError(f"worker for {model} failed:\n{proc.stderr[-3000:]}")
        return json.loads(path.read_text())


def run_serialisation(quick: bool) -> Serialisation:
    """The checkpoint section: `serialisation.run(quick)`, or why it failed."""
    try:
        out = serialisation.run(quick=quick)
    except Exception as err:
        traceback.print_exc()
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    return {"status": "ok", "results": out}


def _plan_tree_ops(run: Run) -> list[Step]:
    """A tree-op / dispatch group per synthetic model (each in its own process with
    `--isolate`)."""
    settings, steps = run.settings, []
    for i, model in enumerate(registry.tree_ops_models(settings.sizes)):
        if run.isolate:
            steps.append(
                Step(
                    f"tree ops + dispatch: {model} (own process)",
                    lambda m=model: run_tree_ops_in_subprocess(
                        m, run.args.mode, settings.sizes, settings.gc_off
                    ),
                    run.store("tree_ops", model),
                )
            )
            continue
        steps.append(
            Step(
                f"tree ops + dispatch: {model}",
                lambda m=model, i=i: S.tree_ops(
                    m,
                    registry.synthetic_model(m),
                    run.parts(m),
                    settings,
                    seed=i,
                    budget_s=group_budget(m, settings),
                ),
                run.store("tree_ops", model),
                group_budget(model, settings),
            )
        )
    return steps


def _plan_async_dispatch(run: Run) -> list[Step]:
    """Async dispatch on the deepest MLP."""
    deepest = f"mlp-{max(run.settings.sizes)}"
    return [
        Step(
            f"async dispatch ({deepest})",
            lambda: S.async_dispatch(run.parts(deepest), run.settings),
            run.store("async_dispatch"),
        )
    ]


def _plan_retracing(run: Run) -> list[Step]:
    """Retracing on the shallowest MLP."""
    shallowest = f"mlp-{min(run.settings.sizes)}"
    return [
        Step(
            f"retracing ({shallowest})",
            lambda: retracing.retracing(run.parts(shallowest), run.settings),
            run.store("retracing"),
        )
    ]


def _plan_first_call(run: Run) -> list[Step]:
    """Time to first call per MLP depth, of the cheap function (and of the forward
    pass in --full)."""
    settings, steps = run.settings, []
    for fn, key, reps in (
        ("probe", "first_call", settings.ttfc_reps),
        ("forward", "first_call_forward", settings.ttfc_forward_reps),
    ):
        for n in settings.sizes if reps else ():
            steps.append(
                Step(
                    f"time to first call, {fn} (mlp-{n})",
                    lambda n=n, fn=fn: S.first_call(
                        n, run.parts(f"mlp-{n}"), settings, fn, seed=n
                    ),
                    run.store(key, str(n)),
                )
            )
    return steps


def _plan_training(run: Run) -> list[Step]:
    """The training step of every trained model."""
    settings = run.settings
    return [
        Step(
            f"training step ({model})",
            lambda m=model: training.training(
                m, registry.synthetic_model(m), run.parts(m), settings
            ),
            run.store("training", model),
            settings.train_budget_s,
        )
        for model in registry.trained_models(settings)
    ]


def _plan_serialisation(run: Run) -> list[Step]:
    """The checkpoint benchmark (skipped in --smoke)."""
    if run.args.mode == "smoke":  # seconds are not enough to write a checkpoint
        run.results["serialisation"] = {
            "status": "skipped",
            "error": "not run in --smoke mode",
        }
        return []
    return [
        Step(
            "serialisation",
            lambda: run_serialisation(quick=run.args.mode == "quick"),
            run.store("serialisation"),
        )
    ]


def _plan_real_models(run: Run) -> list[Step]:
    """Every eqx.nn model, in one step."""
    per_model = run.settings.target_group_budget_s
    return [
        Step(
            REAL_MODELS_STEP,
            lambda: real_models.run(run.settings, registry.EQX_NN_MODELS),
            run.store("real_models"),
            None if per_model is None else len(registry.EQX_NN_MODELS) * per_model,
        )
    ]


def _plan_scaling(run: Run) -> list[Step]:
    """Both kinds of layer at every depth, in one step."""
    budget = run.settings.group_budget_s
    sizes = run.settings.scaling_sizes
    return [
        Step(
            f"scaling: {', '.join(map(str, sizes))} layers, own and eqx.nn",
            lambda: scaling.scaling(run.settings),
            run.store("scaling"),
            None if budget is None else 2 * len(sizes) * budget,
        )
    ]


def _plan_containers(run: Run) -> list[Step]:
    """Each kind of container at every size, a step per kind."""
    budget = run.settings.group_budget_s
    sizes = run.settings.containers_sizes
    return [
        Step(
            f"containers: {kind}, {', '.join(map(str, sizes))} entries",
            lambda k=kind: containers.containers(k, run.settings),
            run.store("containers", kind),
            None if budget is None else len(sizes) * budget,
        )
        for kind in containers.KINDS
    ]


def _plan_construction(run: Run) -> list[Step]:
    """Building, tracing, and trace + compile of diffrax / optimistix stock vs
    rebased (own processes), each a step of its own."""
    settings = run.settings
    return [
        Step(
            "construction builds (wrapping layers and arrays, layer init)",
            lambda: construction.builds(settings),
            run.store("construction", "builds"),
        ),
        Step(
            "construction trace (transformer forward, training step)",
            lambda: construction.trace(settings),
            run.store("construction", "trace"),
        ),
        Step(
            "construction trace + compile: diffrax / optimistix stock vs rebased "
            f"({2 * settings.ecosystem_processes} processes)",
            lambda: construction.ecosystem(settings),
            run.store("construction", "ecosystem"),
        ),
    ]


@dataclasses.dataclass(frozen=True)
class Section:
    """A section `--only` selects: what it measures (for `--help`), where it goes in
    results.json before it has run, and how it plans its steps."""

    description: str
    empty: dict[str, Any]  # results key -> value before the section has run
    plan: Callable[[Run], list[Step]]


# The sections in the order they run; each names its key in results.json.
SECTIONS: dict[str, Section] = {
    "tree_ops": Section(
        "pytree operations + dispatch of every model",
        {"tree_ops": {}},
        _plan_tree_ops,
    ),
    "async_dispatch": Section(
        "async dispatch (deepest MLP)", {"async_dispatch": None}, _plan_async_dispatch
    ),
    "retracing": Section(
        "retracing (shallowest MLP)", {"retracing": None}, _plan_retracing
    ),
    "first_call": Section(
        "time to first call",
        {"first_call": {}, "first_call_forward": {}},
        _plan_first_call,
    ),
    "training": Section("training-step throughput", {"training": {}}, _plan_training),
    "serialisation": Section(
        "checkpoint save / load vs Equinox (skipped in --smoke)",
        {"serialisation": None},
        _plan_serialisation,
    ),
    "real_models": Section(
        "eqx.nn layers inside user modules", {"real_models": None}, _plan_real_models
    ),
    "scaling": Section(
        "16 to 4,096 layers of the user's own and of eqx.nn, with memory",
        {"scaling": None},
        _plan_scaling,
    ),
    "containers": Section(
        "models of containers in fields (the README's list of dicts, dicts of dicts, "
        "lists of arrays, mixed tuples) at 16 to 4,096 entries, with memory",
        {"containers": {}},
        _plan_containers,
    ),
    "construction": Section(
        "building, tracing and compiling (diffrax / optimistix rebased in own "
        "processes)",
        {"construction": {}},
        _plan_construction,
    ),
}
