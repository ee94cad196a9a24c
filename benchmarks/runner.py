"""The command line: `python -m benchmarks [--quick | --full | --smoke] [--out DIR] [--sizes ...]`.

- `--quick` (default): the README numbers, under 2 minutes on 2 CPU cores (compile
  times included). Trains the 32-layer MLP and the transformer; the 256-layer training
  step (about 10 s of compilation per variant on CPU) is only in `--full`, and so is the
  time to first call of the whole forward pass (besides that of the cheap function).
- `--full`: more rounds, the 256-layer training step, first-call times of the forward
  pass, and every model's tree-op/dispatch group in its own process (`--no-isolate` to
  turn off).
- `--smoke`: seconds; checks that everything runs (used by the test suite). Its numbers
  mean nothing.

Results go to `--out` (default `benchmarks/results/<backend>/`): `results.json`,
`results.md` (the printed tables) and PNG plots. The backend is whatever JAX picks
(`JAX_PLATFORMS` is respected), so the same command runs on CPU, GPU and TPU.

The exit status is 0 whether targets are met or missed (benchmarks are not tests); it
is 1 only if a section crashed (the others still run and the results are still written).
"""

import argparse
import dataclasses
import datetime
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
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
        help="seconds; only checks that everything runs",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default benchmarks/results/<backend>/)",
    )
    p.add_argument(
        "--sizes",
        type=lambda s: tuple(int(x) for x in s.split(",") if x),
        default=None,
        help="MLP depths, comma-separated (default 4,32,256)",
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
    return args


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
    out = args.out or report.default_out_dir(machine["backend"])
    out.mkdir(parents=True, exist_ok=True)
    isolate = args.isolate if args.isolate is not None else args.mode == "full"
    results: dict[str, Any] = {
        "machine": machine,
        "settings": dataclasses.asdict(settings),
        "tree_ops": {},
        "async_dispatch": None,
        "retracing": None,
        "first_call": {},
        "first_call_forward": {},
        "training": {},
        "serialisation": None,
        "real_models": None,
        "targets": [],
        "errors": [],
    }

    def log(msg: str) -> None:
        print(
            f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True
        )

    def section(name: str, fn: Callable[[], Any]) -> Any:
        log(name)
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
        f"{args.mode} mode, backend {machine['backend']} ({machine['device_kind']}), out {out}"
    )

    models = [f"mlp-{n}" for n in settings.sizes] + list(OTHER_MODELS)
    for i, model in enumerate(models):
        if isolate:
            res = section(
                f"tree ops + dispatch: {model} (own process)",
                lambda m=model: _tree_ops_isolated(m, args.mode, settings.sizes),
            )
        else:
            res = section(
                f"tree ops + dispatch: {model}",
                lambda m=model, i=i: S.tree_ops(
                    m,
                    *_arrays_for(m, arrays),
                    settings,
                    seed=i,
                    budget_s=_budget(m, settings),
                ),
            )
        if res is not None:
            results["tree_ops"][model] = res

    big = f"mlp-{max(settings.sizes)}"
    results["async_dispatch"] = section(
        f"async dispatch ({big})",
        lambda: S.async_dispatch(_arrays_for(big, arrays)[1], settings),
    )
    small = f"mlp-{min(settings.sizes)}"
    results["retracing"] = section(
        f"retracing ({small})",
        lambda: S.retracing(_arrays_for(small, arrays)[1], settings),
    )
    for fn, key, reps in (
        ("probe", "first_call", settings.ttfc_reps),
        ("forward", "first_call_forward", settings.ttfc_forward_reps),
    ):
        for n in settings.sizes if reps else ():
            res = section(
                f"time to first call, {fn} (mlp-{n})",
                lambda n=n, fn=fn: S.first_call(
                    n, _arrays_for(f"mlp-{n}", arrays)[1], settings, fn, seed=n
                ),
            )
            if res is not None:
                results[key][str(n)] = res
    trained = [f"mlp-{n}" for n in settings.train_sizes]
    for model in trained + (["transformer"] if settings.train_transformer else []):
        res = section(
            f"training step ({model})",
            lambda m=model: S.training(m, *_arrays_for(m, arrays), settings),
        )
        if res is not None:
            results["training"][model] = res
    if args.mode != "smoke":
        results["serialisation"] = section(
            "serialisation", lambda: _serialisation(quick=args.mode == "quick")
        )
    else:
        results["serialisation"] = {
            "status": "skipped",
            "error": "not run in --smoke mode",
        }

    results["real_models"] = section(
        "real models (eqx.nn layers in user modules)", lambda: _real_models(settings)
    )

    results["targets"] = (
        section("targets", lambda: report.evaluate_targets(results)) or []
    )
    results["wall_s"] = time.perf_counter() - start
    text = report.render(results)
    print(text)
    (out / "results.md").write_text(text)
    if not args.no_plots:
        results["plots"] = section("plots", lambda: report.plot(results, out)) or []
        if not results["plots"]:
            results["plots_note"] = (
                "matplotlib is not installed (pip install -e '.[bench]')"
            )
    results["wall_s"] = time.perf_counter() - start
    report.write_json(results, out / "results.json")
    log(f"done: {out / 'results.json'}, {len(results['errors'])} section error(s)")
    return 1 if results["errors"] else 0
