"""The command line: `python -m benchmarks [--quick | --full | --smoke] [--only SECTIONS]
[--out DIR | --write-results] [--sizes ...]`.

- `--quick` (default): the README numbers, under 2 minutes on 2 CPU cores (compile
  times included). Trains the 32-layer MLP and the transformer; the 256-layer training
  step (about 10 s of compilation per variant on CPU) is only in `--full`, and so is the
  time to first call of the whole forward pass (besides that of the cheap function).
- `--full`: more rounds, the 256-layer training step, first-call times of the forward
  pass, and every model's tree-op/dispatch group in its own process (`--no-isolate` to
  turn off).
- `--smoke`: seconds; checks that everything runs (used by the test suite). Its numbers
  mean nothing, so its targets are "not judged (smoke run)" instead of MET / MISSED.
- `--only tree_ops,training`: only these sections (`SECTIONS`; `-` may stand for `_`).
  The results, the tables and the targets then hold only what ran.

Results go to `--out DIR`, by default `benchmarks/out/<backend>/` (ignored by git), so
ad-hoc runs never touch the checkout; only `--write-results` writes the committed
`benchmarks/results/<backend>/` (refused with `--smoke` and `--only`). Each holds
`results.json`, `results.md` (the printed tables) and PNG plots; the summary at the end of the
output names the files written. The backend is whatever JAX picks (`JAX_PLATFORMS` is
respected), so the same command runs on CPU, GPU and TPU.

Progress goes to stderr, one line per step:
`[  33.1 s] 3/14 tree ops + dispatch: mlp-256, ETA ~40 s` (time so far, step k of n,
and a rough estimate of the time left: each step still to run, this one included, at the
mean time of the steps of its kind run so far, else of all steps so far).

The exit status is 0 whether targets are met or missed (benchmarks are not tests); it
is 1 only if a section crashed (the others still run and the results are still written),
and 2 for a refused command line.
"""

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import jax

from . import (
    construction,
    models as M,
    real_models,
    registry,
    report,
    retracing,
    scaling,
    scenarios as S,
    serialisation,
)
from .schema import Machine, Results, Serialisation
from .settings import MODES, Settings
from .timing import frozen_heap

REPO_ROOT = Path(__file__).resolve().parent.parent
REAL_MODELS_STEP = "real models (eqx.nn layers in user modules)"


# --------------------------------------------------------------------------------------
# The command line.
# --------------------------------------------------------------------------------------


def _parse_sizes(text: str) -> tuple[int, ...]:
    """`--sizes`: positive integers, comma-separated."""
    parts = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(
            f"sizes are positive integers, comma-separated (e.g. 4,32,256); got {text!r}"
        )
    return tuple(int(x) for x in parts)


def _parse_sections(text: str) -> tuple[str, ...]:
    """`--only`: known section names (`-` for `_`), in the order they run."""
    names = [x.strip().replace("-", "_") for x in text.split(",")]
    unknown = [x for x in names if x not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(repr(x) for x in unknown)}; "
            f"valid sections: {', '.join(SECTIONS)}"
        )
    return tuple(x for x in SECTIONS if x in names)  # the order they run in


def _add_mode_options(p: argparse.ArgumentParser) -> None:
    """`--quick`, `--full`, `--smoke`: one at most."""
    mode = p.add_mutually_exclusive_group()
    for name, text in (
        ("quick", "README numbers, < 2 min on 2 CPU cores (default)"),
        (
            "full",
            "more rounds, 256-layer training, forward-pass first calls (~7 min on 2 "
            "cores)",
        ),
        ("smoke", "seconds; only checks that everything runs (targets not judged)"),
    ):
        mode.add_argument(
            f"--{name}", dest="mode", action="store_const", const=name, help=text
        )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """`--out DIR` or `--write-results`: one at most."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default benchmarks/out/<backend>/, ignored by git)",
    )
    where.add_argument(
        "--write-results",
        action="store_true",
        help="write the committed benchmarks/results/<backend>/ (not with --smoke "
        "or --only)",
    )


def make_parser() -> argparse.ArgumentParser:
    """The options of `python -m benchmarks`."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        allow_abbrev=False,
        description="Benchmarks autostatic.AutoModule against eqx.Module (static fields / "
        "filter_jit) and dict/dataclass floors; prints tables and MET/MISSED targets, writes "
        "results.json, results.md and PNG plots.",
    )
    _add_mode_options(p)
    p.add_argument(
        "--only",
        type=_parse_sections,
        default=None,
        metavar="SECTION[,SECTION]",
        help="run only these sections (default all): "
        + "; ".join(f"{k} = {v.description}" for k, v in SECTIONS.items()),
    )
    _add_output_options(p)
    p.add_argument(
        "--sizes",
        type=_parse_sizes,
        default=None,
        help="MLP depths: positive integers, comma-separated (default 4,32,256)",
    )
    p.add_argument(
        "--isolate",
        dest="isolate",
        action="store_true",
        default=None,
        help="one process per tree-op group (default in --full)",
    )
    p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="run every group in this process",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, `mode` defaulted to quick; exits (status 2) on a refused line."""
    p = make_parser()
    args = p.parse_args(argv)
    args.mode = args.mode or "quick"
    if args.write_results and (args.mode == "smoke" or args.only):
        p.error(
            "--write-results replaces the committed results: it needs a whole "
            "--quick or --full run (not --smoke, not --only); use --out DIR instead"
        )
    return args


def out_dir(args: argparse.Namespace, backend: str) -> Path:
    """Where the results go: `--out`, else the committed `benchmarks/results/<backend>/`
    with `--write-results`, else `benchmarks/out/<backend>/` (ignored by git)."""
    if args.out is not None:
        return args.out
    if args.write_results:
        return report.results_dir(backend)
    return report.default_out_dir(backend)


def settings_for(args: argparse.Namespace) -> Settings:
    """The mode's settings, with `--sizes` (and the trained depths among them)."""
    settings = MODES[args.mode]
    if args.sizes:
        sizes = tuple(sorted(set(args.sizes)))
        train = tuple(n for n in settings.train_sizes if n in sizes) or (sizes[0],)
        settings = dataclasses.replace(settings, sizes=sizes, train_sizes=train)
    return settings


# --------------------------------------------------------------------------------------
# The machine.
# --------------------------------------------------------------------------------------


def _git_commit() -> str | None:
    """The checkout's short commit, if git can tell, else `$AUTOSTATIC_COMMIT` (a copy
    of the working tree without `.git`, as sent to a lent GPU machine)."""
    return _git_head() or os.environ.get("AUTOSTATIC_COMMIT")


def _git_head() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def describe_machine(mode: str) -> Machine:
    """What results.json records about where and with what it was made."""
    versions: dict[str, str | None] = {}
    for pkg in ("jax", "jaxlib", "equinox", "optax", "autostatic", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    commit = _git_commit()
    devices = jax.devices()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "mode": mode,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "versions": versions,
        "autostatic_import_error": M.AUTOSTATIC_ERROR,
        "git_commit": commit,
        "env": {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "XLA_FLAGS")},
    }


# --------------------------------------------------------------------------------------
# Progress.
# --------------------------------------------------------------------------------------


class Progress:
    """Progress lines on stderr, each with the time since the run started."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {msg}", file=sys.stderr, flush=True)


def step_kind(label: str) -> str:
    """The kind of a step, for the ETA: its label up to the first `:` or ` (`."""
    return label.split(":")[0].split(" (")[0].strip()


def eta_text(
    done: list[tuple[str, float]], remaining: list[tuple[str, float | None]]
) -> str:
    """`, ETA ~40 s`: the steps still to run (this one included, each a `(kind, budget)`
    pair), each estimated by the mean time of the steps of its kind run so far, else by
    its timing budget where it has one (a lower bound: compiling comes on top) or the
    mean of every step so far, whichever is larger. Empty before the first step has
    finished (nothing to estimate from)."""
    if not done or not remaining:
        return ""
    overall = sum(s for _, s in done) / len(done)
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in done:
        by_kind.setdefault(kind, []).append(seconds)
    left = sum(
        sum(by_kind[k]) / len(by_kind[k]) if k in by_kind else max(overall, b or 0.0)
        for k, b in remaining
    )
    if left >= 90:
        return f", ETA ~{left / 60:.0f} min"
    return f", ETA ~{max(1.0, left):.0f} s"


# --------------------------------------------------------------------------------------
# One run: its steps, planned per section, then run in order.
# --------------------------------------------------------------------------------------


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
    model: str, mode: str, sizes: tuple[int, ...]
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
        ]
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
                        m, run.args.mode, settings.sizes
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
            lambda m=model: S.training(
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
    "construction": Section(
        "building, tracing and compiling (diffrax / optimistix rebased in own "
        "processes)",
        {"construction": {}},
        _plan_construction,
    ),
}


def _new_results(
    machine: Machine, settings: Settings, sections: tuple[str, ...]
) -> Results:
    """The results before any step has run: only the keys of the sections that run."""
    results: dict[str, Any] = {
        "machine": machine,
        "settings": dataclasses.asdict(settings),
        "sections": list(sections),
    }
    for name in sections:
        for key, value in SECTIONS[name].empty.items():
            results[key] = dict(value) if isinstance(value, dict) else value
    results["targets"] = []
    results["errors"] = []
    return cast(Results, results)


def _run_steps(run: Run, steps: list[Step]) -> None:
    """Runs every step in order, with step k of n and an ETA on each progress line."""
    done: list[tuple[str, float]] = []  # (kind, seconds) of the steps run so far
    for k, step in enumerate(steps, 1):
        remaining = [(step_kind(s.label), s.budget_s) for s in steps[k - 1 :]]
        eta = eta_text(done, remaining)
        begin = time.perf_counter()
        result = run.guarded(
            step.label, step.measure, progress=f"{k}/{len(steps)} ", eta=eta
        )
        step.store(result)
        done.append((step_kind(step.label), time.perf_counter() - begin))


def _finish(run: Run, out: Path) -> str:
    """Judges the targets, draws the plots, renders the report and writes every file;
    returns the report's text."""
    results, sections = run.results, tuple(run.results["sections"])
    results["targets"] = (
        run.guarded(
            "targets",
            lambda: report.evaluate_targets(
                results, sections=sections, judged=run.args.mode != "smoke"
            ),
        )
        or []
    )
    # The files are named in the summary at the end of the output, so the plots are
    # drawn before the text is rendered (results.json is written last).
    written = [out / "results.json", out / "results.md"]
    if not run.args.no_plots:
        results["plots"] = run.guarded("plots", lambda: report.plot(results, out)) or []
        written += [out / name for name in results["plots"]]
        if importlib.util.find_spec("matplotlib") is None:
            results["plots_note"] = (
                "matplotlib is not installed (pip install -e '.[bench]')"
            )
    results["files"] = [str(p) for p in written]
    results["wall_s"] = run.progress.elapsed()
    text = report.render(results)
    (out / "results.md").write_text(text)
    report.write_json(results, out / "results.json")
    return text


def _run_worker(args: argparse.Namespace, settings: Settings) -> int:
    """A child process of `run_tree_ops_in_subprocess`: one tree-op group."""
    res = S.tree_ops(
        args.worker,
        registry.synthetic_model(args.worker),
        registry.make_parts(args.worker),
        settings,
        budget_s=group_budget(args.worker, settings),
    )
    args.worker_out.write_text(json.dumps(report.jsonable(res)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmarks; the exit status is 1 if a section crashed, else 0."""
    args = parse_args(argv)
    settings = settings_for(args)
    progress = Progress()
    if args.worker:
        return _run_worker(args, settings)
    machine = describe_machine(args.mode)
    out = out_dir(args, machine["backend"])
    out.mkdir(parents=True, exist_ok=True)
    sections = args.only or tuple(SECTIONS)
    results = _new_results(machine, settings, sections)
    run = Run(args, settings, results, progress)
    if M.AUTOSTATIC_ERROR:
        run.progress.log(f"autostatic unavailable: {M.AUTOSTATIC_ERROR}")
    run.progress.log(
        f"{args.mode} mode, backend {machine['backend']} ({machine['device_kind']}), "
        f"sections {', '.join(sections)}, out {out}"
    )
    # Planned up front so that the progress lines can say "step k of n".
    steps = [step for name in sections for step in SECTIONS[name].plan(run)]
    _run_steps(run, steps)
    text = _finish(run, out)
    run.progress.log(f"done, {len(run.results['errors'])} section error(s)")
    print(text, end="", flush=True)  # ends with the summary, which names the files
    return 1 if run.results["errors"] else 0
