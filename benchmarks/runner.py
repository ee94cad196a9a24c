"""The command line: `python -m benchmarks [--quick | --full | --smoke] [--only SECTIONS]
[--out DIR | --write-results] [--sizes ...] [--gc-off]`.

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
- `--gc-off`: timed code runs with the garbage collector off (by default it is on, as
  users run; see `timing`), for figures beside the default ones where the collector's
  share explains something. Recorded in results.json's `settings` (`gc_off`).

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
import time
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import jax

from . import models as M, registry, report, scenarios as S, timing
from .progress import eta_text, Progress, step_kind
from .schema import Machine, Results
from .sections import group_budget, REPO_ROOT, Run, SECTIONS, Step
from .settings import MODES, Settings

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
    p.add_argument(
        "--gc-off",
        action="store_true",
        help="time with the garbage collector off (default on, as users run)",
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
    """The mode's settings, with `--sizes` (and the trained depths among them) and
    `--gc-off`."""
    settings = dataclasses.replace(MODES[args.mode], gc_off=args.gc_off)
    if args.sizes:
        sizes = tuple(sorted(set(args.sizes)))
        train = tuple(n for n in settings.train_sizes if n in sizes) or (sizes[0],)
        settings = dataclasses.replace(settings, sizes=sizes, train_sizes=train)
    return settings


# --------------------------------------------------------------------------------------
# The machine.
# --------------------------------------------------------------------------------------


def _git_commit() -> str | None:
    """`$AUTOSTATIC_COMMIT` where set (a copy of the working tree sent to a lent
    machine, whose `.git`, if any, need not match it), else the checkout's short
    commit, if git can tell."""
    return os.environ.get("AUTOSTATIC_COMMIT") or _git_head()


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
        except metadata.PackageNotFoundError:  # a checkout run in place
            versions[pkg] = getattr(sys.modules.get(pkg), "__version__", None)
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
# One run: its results, its steps in order, then its files.
# --------------------------------------------------------------------------------------


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
    with timing.collector_off(settings.gc_off):
        return _main(args, settings)


def _main(args: argparse.Namespace, settings: Settings) -> int:
    """`main` once the command line is read."""
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
