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
from typing import Any

import jax

from . import models as M, report, scenarios as S
from .timing import frozen_heap

MODES: dict[str, S.Settings] = {
    "smoke": S.Settings(
        mode="smoke",
        sizes=(4, 16),
        rounds=3,
        target_batch_s=2e-4,
        group_budget_s=0.5,
        target_group_budget_s=0.5,
        retrace_repeats=3,
        contrast_calls=3,
        adam_steps=5,
        ttfc_reps=1,
        ttfc_forward_reps=0,
        train_sizes=(4,),
        train_transformer=False,
        train_steps=2,
        train_rounds=2,
        train_budget_s=1.0,
        async_steps=2,
        async_rounds=2,
        async_host_s=2e-4,
        async_device_s=2e-4,
    ),
    "quick": S.Settings(
        mode="quick",
        sizes=(4, 32, 256),
        rounds=30,
        target_batch_s=2e-3,
        group_budget_s=2.0,
        target_group_budget_s=6.0,
        retrace_repeats=20,
        contrast_calls=5,
        adam_steps=200,
        ttfc_reps=7,
        ttfc_forward_reps=0,
        train_sizes=(32,),
        train_transformer=True,
        train_steps=10,
        train_rounds=10,
        train_budget_s=3.0,
        async_steps=10,
        async_rounds=6,
        async_host_s=1e-3,
        async_device_s=3e-3,
    ),
    "full": S.Settings(
        mode="full",
        sizes=(4, 32, 256),
        rounds=150,
        target_batch_s=2e-3,
        group_budget_s=None,
        target_group_budget_s=None,
        retrace_repeats=20,
        contrast_calls=5,
        adam_steps=200,
        ttfc_reps=15,
        ttfc_forward_reps=5,
        train_sizes=(32, 256),
        train_transformer=True,
        train_steps=20,
        train_rounds=15,
        train_budget_s=None,
        async_steps=50,
        async_rounds=10,
        async_host_s=1e-3,
        async_device_s=3e-3,
    ),
}
# Models of the tree-op / dispatch groups besides the MLPs.
OTHER_MODELS: tuple[str, ...] = ("transformer", "mixed")
REPO_ROOT = Path(__file__).resolve().parent.parent
# The sections `--only` selects, in the order they run; each names its key in results.json
# (`first_call` also fills `first_call_forward`).
SECTIONS: dict[str, str] = {
    "tree_ops": "pytree operations + dispatch of every model",
    "async_dispatch": "async dispatch (deepest MLP)",
    "retracing": "retracing (shallowest MLP)",
    "first_call": "time to first call",
    "training": "training-step throughput",
    "serialisation": "checkpoint save / load vs Equinox (skipped in --smoke)",
    "real_models": "eqx.nn layers inside user modules",
}


REAL_MODELS_STEP = "real models (eqx.nn layers in user modules)"


def _sizes_arg(text: str) -> tuple[int, ...]:
    parts = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(
            f"sizes are positive integers, comma-separated (e.g. 4,32,256); got {text!r}"
        )
    return tuple(int(x) for x in parts)


def _only_arg(text: str) -> tuple[str, ...]:
    names = [x.strip().replace("-", "_") for x in text.split(",")]
    unknown = [x for x in names if x not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(repr(x) for x in unknown)}; "
            f"valid sections: {', '.join(SECTIONS)}"
        )
    return tuple(x for x in SECTIONS if x in names)  # the order they run in


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        allow_abbrev=False,
        description="Benchmarks autostatic.AutoModule against eqx.Module (static fields / "
        "filter_jit) and dict/dataclass floors; prints tables and MET/MISSED targets, writes "
        "results.json, results.md and PNG plots.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="README numbers, < 2 min on 2 CPU cores (default)",
    )
    mode.add_argument(
        "--full",
        dest="mode",
        action="store_const",
        const="full",
        help="more rounds, 256-layer training, forward-pass first calls (~7 min on 2 cores)",
    )
    mode.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const="smoke",
        help="seconds; only checks that everything runs (targets not judged)",
    )
    p.add_argument(
        "--only",
        type=_only_arg,
        default=None,
        metavar="SECTION[,SECTION]",
        help="run only these sections (default all): "
        + "; ".join(f"{k} = {v}" for k, v in SECTIONS.items()),
    )
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
    p.add_argument(
        "--sizes",
        type=_sizes_arg,
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


def machine_info(mode: str) -> dict[str, Any]:
    versions = {}
    for pkg in ("jax", "jaxlib", "equinox", "optax", "autostatic", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = (
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
        commit = None
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


def _settings(args: argparse.Namespace) -> S.Settings:
    settings = MODES[args.mode]
    if args.sizes:
        sizes = tuple(sorted(set(args.sizes)))
        train = tuple(n for n in settings.train_sizes if n in sizes) or (sizes[0],)
        settings = dataclasses.replace(settings, sizes=sizes, train_sizes=train)
    return settings


def _arrays_for(model: str, cache: dict[str, Any]) -> tuple[M.Family, Any]:
    """The family and the arrays of a model name (`mlp-32`, `transformer`, `mixed`),
    built once and shared by every implementation and section."""
    if model not in cache:
        if model.startswith("mlp-"):
            cache[model] = M.mlp_arrays(int(model.split("-")[1]))
        elif model == "transformer":
            cache[model] = M.transformer_arrays()
        elif model == "mixed":
            cache[model] = M.mixed_arrays()
        else:
            raise ValueError(model)
    family = M.FAMILIES["mlp" if model.startswith("mlp-") else model]
    return family, cache[model]


def _budget(model: str, settings: S.Settings) -> float | None:
    """The MLP the targets are read on (256 layers, else the deepest) gets more rounds."""
    target = (
        report.TARGET_N if report.TARGET_N in settings.sizes else max(settings.sizes)
    )
    if model == f"mlp-{target}":
        return settings.target_group_budget_s
    return settings.group_budget_s


def _tree_ops_isolated(model: str, mode: str, sizes: tuple[int, ...]) -> dict[str, Any]:
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


def _serialisation(quick: bool) -> dict[str, Any]:
    """Runs `benchmarks/serialisation.py`'s `run(quick)` if it exists (written separately)."""
    try:
        from . import serialisation  # type: ignore[attr-defined]
    except ModuleNotFoundError as err:
        if err.name == f"{__package__}.serialisation":
            return {
                "status": "missing",
                "error": "benchmarks/serialisation.py does not exist",
            }
        return {"status": "failed", "error": f"import: {type(err).__name__}: {err}"}
    except Exception as err:
        return {"status": "failed", "error": f"import: {type(err).__name__}: {err}"}
    run = getattr(serialisation, "run", None)
    if not callable(run):
        return {
            "status": "failed",
            "error": "benchmarks/serialisation.py has no run(quick) function",
        }
    try:
        out = run(quick=quick)
    except Exception as err:
        traceback.print_exc()
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    return {"status": "ok", "results": out}


def _real_models(settings: S.Settings) -> dict[str, Any]:
    """`benchmarks/real_models.py` (imported here: it needs autostatic to import)."""
    from . import real_models

    return real_models.run(settings)


def _kind(label: str) -> str:
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = _settings(args)
    start = time.perf_counter()
    arrays: dict[str, Any] = {}

    if args.worker:  # a child process of `_tree_ops_isolated`
        family, arr = _arrays_for(args.worker, arrays)
        res = S.tree_ops(
            args.worker, family, arr, settings, budget_s=_budget(args.worker, settings)
        )
        args.worker_out.write_text(json.dumps(report._jsonable(res)))
        return 0

    machine = machine_info(args.mode)
    out = out_dir(args, machine["backend"])
    out.mkdir(parents=True, exist_ok=True)
    isolate = args.isolate if args.isolate is not None else args.mode == "full"
    sections = args.only or tuple(SECTIONS)
    empty: dict[str, Any] = {
        "tree_ops": {},
        "async_dispatch": None,
        "retracing": None,
        "first_call": {},
        "first_call_forward": {},
        "training": {},
        "serialisation": None,
        "real_models": None,
    }
    results: dict[str, Any] = {
        "machine": machine,
        "settings": dataclasses.asdict(settings),
        "sections": list(sections),
    }
    for key, value in empty.items():  # only the sections that run
        if key.removesuffix("_forward") in sections:
            results[key] = value
    results["targets"] = []
    results["errors"] = []

    def log(msg: str) -> None:
        print(
            f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True
        )

    def section(
        name: str, fn: Callable[[], Any], progress: str = "", eta: str = ""
    ) -> Any:
        log(f"{progress}{name}{eta}")
        try:
            with (
                frozen_heap()
            ):  # keeps the collector's full-heap scans out of every section
                return fn()
        except Exception as err:
            traceback.print_exc()
            results["errors"].append(
                {"section": name, "error": f"{type(err).__name__}: {err}"}
            )
            return None

    if M.AUTOSTATIC_ERROR:
        log(f"autostatic unavailable: {M.AUTOSTATIC_ERROR}")
    log(
        f"{args.mode} mode, backend {machine['backend']} ({machine['device_kind']}), "
        f"sections {', '.join(sections)}, out {out}"
    )

    # Every step of the run: (label, what it runs, where its result goes), planned
    # up front so that the progress lines can say "step k of n".
    steps: list[tuple[str, Callable[[], Any], Callable[[Any], None]]] = []
    # The wall budgets of the steps that have one (by label), for the ETA.
    budgets: dict[str, float] = {}

    def store(key: str, sub: str | None = None) -> Callable[[Any], None]:
        def put(res: Any) -> None:
            if sub is None:
                results[key] = res
            elif res is not None:
                results[key][sub] = res

        return put

    if "tree_ops" in sections:
        models = [f"mlp-{n}" for n in settings.sizes] + list(OTHER_MODELS)
        for i, model in enumerate(models):
            if isolate:
                steps.append(
                    (
                        f"tree ops + dispatch: {model} (own process)",
                        lambda m=model: _tree_ops_isolated(
                            m, args.mode, settings.sizes
                        ),
                        store("tree_ops", model),
                    )
                )
            else:
                budget = _budget(model, settings)
                if budget is not None:
                    budgets[f"tree ops + dispatch: {model}"] = budget
                steps.append(
                    (
                        f"tree ops + dispatch: {model}",
                        lambda m=model, i=i: S.tree_ops(
                            m,
                            *_arrays_for(m, arrays),
                            settings,
                            seed=i,
                            budget_s=_budget(m, settings),
                        ),
                        store("tree_ops", model),
                    )
                )

    big = f"mlp-{max(settings.sizes)}"
    if "async_dispatch" in sections:
        steps.append(
            (
                f"async dispatch ({big})",
                lambda: S.async_dispatch(_arrays_for(big, arrays)[1], settings),
                store("async_dispatch"),
            )
        )
    small = f"mlp-{min(settings.sizes)}"
    if "retracing" in sections:
        steps.append(
            (
                f"retracing ({small})",
                lambda: S.retracing(_arrays_for(small, arrays)[1], settings),
                store("retracing"),
            )
        )
    if "first_call" in sections:
        for fn, key, reps in (
            ("probe", "first_call", settings.ttfc_reps),
            ("forward", "first_call_forward", settings.ttfc_forward_reps),
        ):
            for n in settings.sizes if reps else ():
                steps.append(
                    (
                        f"time to first call, {fn} (mlp-{n})",
                        lambda n=n, fn=fn: S.first_call(
                            n, _arrays_for(f"mlp-{n}", arrays)[1], settings, fn, seed=n
                        ),
                        store(key, str(n)),
                    )
                )
    if "training" in sections:
        trained = [f"mlp-{n}" for n in settings.train_sizes]
        for model in trained + (["transformer"] if settings.train_transformer else []):
            if settings.train_budget_s is not None:
                budgets[f"training step ({model})"] = settings.train_budget_s
            steps.append(
                (
                    f"training step ({model})",
                    lambda m=model: S.training(m, *_arrays_for(m, arrays), settings),
                    store("training", model),
                )
            )
    if "serialisation" in sections:
        if args.mode != "smoke":
            steps.append(
                (
                    "serialisation",
                    lambda: _serialisation(quick=args.mode == "quick"),
                    store("serialisation"),
                )
            )
        else:
            results["serialisation"] = {
                "status": "skipped",
                "error": "not run in --smoke mode",
            }
    if "real_models" in sections:
        if settings.target_group_budget_s is not None:  # four models, one run each
            budgets[REAL_MODELS_STEP] = 4 * settings.target_group_budget_s
        steps.append(
            (
                REAL_MODELS_STEP,
                lambda: _real_models(settings),
                store("real_models"),
            )
        )

    done: list[tuple[str, float]] = []  # (kind, seconds) of the steps run so far
    for k, (label, fn, put) in enumerate(steps, 1):
        eta = eta_text(done, [(_kind(x), budgets.get(x)) for x, *_ in steps[k - 1 :]])
        begin = time.perf_counter()
        put(section(label, fn, progress=f"{k}/{len(steps)} ", eta=eta))
        done.append((_kind(label), time.perf_counter() - begin))

    results["targets"] = (
        section(
            "targets",
            lambda: report.evaluate_targets(
                results, sections=sections, judged=args.mode != "smoke"
            ),
        )
        or []
    )
    # The files are named in the summary at the end of the output, so the plots are
    # drawn before the text is rendered (results.json is written last).
    written = [out / "results.json", out / "results.md"]
    if not args.no_plots:
        results["plots"] = section("plots", lambda: report.plot(results, out)) or []
        written += [out / name for name in results["plots"]]
        if importlib.util.find_spec("matplotlib") is None:
            results["plots_note"] = (
                "matplotlib is not installed (pip install -e '.[bench]')"
            )
    results["files"] = [str(p) for p in written]
    results["wall_s"] = time.perf_counter() - start
    text = report.render(results)
    (out / "results.md").write_text(text)
    report.write_json(results, out / "results.json")
    log(f"done, {len(results['errors'])} section error(s)")
    print(text, end="", flush=True)  # ends with the summary, which names the files
    return 1 if results["errors"] else 0
