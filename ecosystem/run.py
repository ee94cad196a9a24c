"""The ecosystem report: diffrax, lineax, optimistix and quax's own test suites with
their Modules auto-static.

    python -m ecosystem [--git-dir LIB=PATH ...] [--every K] [--start R] [--only LIB]
                        [--jobs N] [--part K/N] [--new-only] [--modes M] [--out DIR]
                        [--deadline MINUTES] [--chunk N]

For each library, the tests of the git tag matching the installed version are
extracted (never committed), collected, and a deterministic sample (every K-th item
of each file, in collection order; K=1 runs everything) is run three times:

- baseline: the library as installed;
- b: every `eqx.Module` class of the library and of its tests rebased onto
  `autostatic.AutoModule` (`pytest -p autostatic.rebased`), with those of the
  Equinox-based libraries it requires (the rebase follows them), static markers kept;
- b2: the same with every `eqx.field(static=True)` marker removed.

Each failure is put under the cause its message names (`CAUSES`), and the report
(`report.md`, `results.json`) lists per library and mode the items selected, passed
and failed, and each remaining failure grouped by cause. Runs add to `--out`'s
results item by item: another part of the files (`--part`), or a denser sample of the
items no run has reached (`--every K --new-only`), or the items a sample left
(`--every K --start R`), so a whole suite can be run over several sessions; a run
given a `--deadline` keeps what ran by then and leaves the rest to a later
`--new-only` run.
"""

import argparse
import concurrent.futures
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Library, the folder of its tests in its repository.
LIBRARIES = {
    "lineax": "tests",
    "optimistix": "tests",
    "diffrax": "test",
    "quax": "tests",
}
# Every mode, in the order they run (`--modes` picks some).
ALL_MODES = "baseline,b,b2"
# The sample taken by default: every K-th item of each file (at least one a file).
# lineax's and optimistix's three modes take about 35 minutes on this 2-core machine
# (lineax has 4215 items at about 3 s each); diffrax's items compile whole solves, so
# it gets the first item of each file: 21 items, about 30 minutes with the three
# modes side by side (`--jobs 3`).
# quax's whole suite runs (its items are small).
EVERY = {"lineax": 40, "optimistix": 8, "diffrax": 1000, "quax": 1}
MODES = {
    "baseline": [],
    "b": ["-p", "autostatic.rebased", "--autostatic-rebase={packages}"],
    "b2": [
        "-p",
        "autostatic.rebased",
        "--autostatic-rebase={packages}",
        "--autostatic-drop-static-markers",
    ],
}
# A failure's cause, by a pattern of its message: (name, pattern, reason).
CAUSES: list[tuple[str, str, str]] = [
    (
        "crash",
        r"exit code -\d+",
        "the interpreter died (a signal) before the item reported",
    ),
    (
        "timeout",
        r"Timeout|timed out",
        "the item ran past the per-item time limit",
    ),
    (
        "structure",
        r"PyTree structures? (must|do not) match|different (types|pytree metadata)|"
        r"same (input and output )?structure|must have (the )?same (type )?structure|"
        r"container/pytree structure",
        "two trees that an eqx.Module gives the same structure differ",
    ),
    (
        "tracer",
        r"TracerBoolConversionError|ConcretizationTypeError|TracerIntegerConversion",
        "a value the library keeps static became a tracer",
    ),
    (
        "non-array leaf",
        r"is not a valid JAX type|Cannot interpret value of type",
        "a non-array reached a JAX transform as a leaf",
    ),
    (
        "warning",
        r"Warning",
        "a warning turned into an error by the suite's filterwarnings",
    ),
]


@dataclass
class Outcome:
    mode: str
    selected: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    # node id -> (cause, first line of the message)
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)
    rebase_summary: str = ""
    # node id -> "passed", "failed" or "skipped": what runs of parts merge by
    statuses: dict[str, str] = field(default_factory=dict)
    # Test files that never import the library, run stock in this mode.
    stock_files: list[str] = field(default_factory=list)

    def note(self, node: str, status: str) -> None:
        self.statuses[node] = status
        setattr(self, status, getattr(self, status) + 1)


def _git_archive(git_dir: str, tag: str, paths: list[str], into: Path) -> None:
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "--format=tar", tag, *paths],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")


def _sdist_extract(sdist: str, paths: list[str], into: Path) -> None:
    """`paths` of a source distribution (`NAME-VERSION/...` inside), under `into`."""
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            inner = member.name.split("/", 1)[-1]
            if any(inner == p or inner.startswith(p + "/") for p in paths):
                member.name = inner
                members.append(member)
        tar.extractall(into, members=members, filter="data")


def extract(library: str, source: str | None, work: Path) -> Path:
    """The library's tests at the tag of the installed version, under `work`, from
    its git directory, or from its source distribution (a `.tar.gz`: for a version
    whose tag the repository lacks)."""
    version = importlib.metadata.version(library)
    root = work / library
    if (root / LIBRARIES[library]).exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    if source is not None and source.endswith(".tar.gz"):
        _sdist_extract(source, [LIBRARIES[library], "pyproject.toml"], root)
        return root
    git_dir = source
    if git_dir is None:
        git_dir = str(work / f"{library}.git")
        if not Path(git_dir).exists():
            url = f"https://github.com/patrick-kidger/{library}"
            subprocess.run(
                ["git", "clone", "--bare", "--filter=blob:none", url, git_dir],
                check=True,
            )
    _git_archive(git_dir, f"v{version}", [LIBRARIES[library], "pyproject.toml"], root)
    return root


def collect(root: Path) -> list[str]:
    """The node ids of the tests under `root`, in collection order."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout
    # Node ids start the line; pytest's warnings quote them indented ("  Test: ...").
    return [line for line in out.splitlines() if "::" in line and line[:1].strip()]


def sample(items: list[str], every: int, start: int = 0) -> list[str]:
    """Every `every`-th item of each file, starting with its `start`-th (0: its
    first)."""
    per_file: dict[str, list[str]] = {}
    for item in items:
        per_file.setdefault(item.split("::")[0], []).append(item)
    return [i for group in per_file.values() for i in group[start::every]]


def classify(message: str) -> str:
    for name, pattern, _ in CAUSES:
        if re.search(pattern, message):
            return name
    return "other"


def run_mode(
    root: Path,
    library: str,
    mode: str,
    items: list[str],
    timeout: int,
    deadline: float | None = None,
    chunk: int | None = None,
) -> Outcome:
    """Runs `items` in `mode`, one pytest process per test file (per `chunk` items of
    it): a test that kills its interpreter (diffrax's suite has one) loses only its
    own process's remaining items, each counted as a crash. No process starts after
    `deadline` (`time.monotonic`); the items left are not in the outcome."""
    outcome = Outcome(mode, len(items))
    per_file: dict[str, list[str]] = {}
    for item in items:
        per_file.setdefault(item.split("::")[0], []).append(item)
    for file_items in per_file.values():
        size = chunk or len(file_items)
        for i in range(0, len(file_items), size):
            if deadline is not None and time.monotonic() > deadline:
                outcome.selected = len(outcome.statuses)
                return outcome
            _run_file(root, library, mode, file_items[i : i + size], timeout, outcome)
    return outcome


def _run_file(
    root: Path,
    library: str,
    mode: str,
    items: list[str],
    timeout: int,
    outcome: Outcome,
) -> None:
    packages = f"{library},{LIBRARIES[library]}"
    junit = root / f"junit-{mode}.xml"
    start = time.perf_counter()
    run = _pytest(
        root, [a.format(packages=packages) for a in MODES[mode]], items, junit, timeout
    )
    if f"{library!r} was never imported" in run.stdout + run.stderr:
        # A file that never imports the library (quax's checks of its own source
        # text) has nothing to rebase, and the rebase refuses to pass for one that
        # worked: it runs stock, and the report says so.
        outcome.stock_files.append(_file_of(items[0]))
        run = _pytest(root, [], items, junit, timeout)
    outcome.seconds += time.perf_counter() - start
    summary = re.search(r"autostatic rebase: .*", run.stdout)
    outcome.rebase_summary = outcome.rebase_summary or (summary[0] if summary else "")
    cases = (
        list(ElementTree.parse(junit).getroot().iter("testcase"))
        if junit.exists()
        else []
    )
    seen = set()
    for case in cases:
        name = case.get("name") or ""
        node = next((i for i in items if i.endswith("::" + name)), name)
        seen.add(node)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            message = "\n".join(filter(None, (problem.get("message"), problem.text)))
            outcome.note(node, "failed")
            outcome.failures[node] = (classify(message), _gist(message))
        elif case.find("skipped") is not None:
            outcome.note(node, "skipped")
        else:
            outcome.note(node, "passed")
    lost = [i for i in items if i not in seen]
    if lost:  # the process died, or could not collect the file
        tail = (run.stdout + run.stderr).strip().splitlines()[-1:] or ["no output"]
        why = f"not run: pytest ended with exit code {run.returncode} ({tail[0][:200]})"
        cause = "crash" if run.returncode < 0 or not cases else classify(tail[0])
        for node in lost:
            outcome.note(node, "failed")
            outcome.failures[node] = (cause, why)


def _pytest(
    root: Path, args: list[str], items: list[str], junit: Path, timeout: int
) -> subprocess.CompletedProcess:
    junit.unlink(missing_ok=True)
    command = [
        sys.executable,
        *("-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"),
        *args,
        *items,
    ]
    try:
        return subprocess.run(
            command,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout,
            # Equinox's test-key fixture draws a new seed per run unless told one:
            # the same seed in every mode makes their random matrices the same.
            env={**os.environ, "JAX_PLATFORMS": "cpu", "EQX_GETKEY_SEED": "0"},
        )
    except subprocess.TimeoutExpired:  # killed: its items are crashes
        said = f"killed after the --timeout of {timeout} s"
        return subprocess.CompletedProcess(command, -9, "", said)


_ERROR_LINE = re.compile(r"^E?\s*((\w+\.)*\w+(Error|Exception|Warning)\b.*)$")


def _gist(message: str) -> str:
    """The line of a failure that says what failed: the innermost error line of
    the traceback (`E   TypeError: ...`), else the message's first line."""
    lines = [line for line in message.splitlines() if line.strip()]
    errors = [m[1] for m in map(_ERROR_LINE.match, lines) if m]
    meaningful = [e for e in errors if "stack outside of JIT" not in e]
    gist = (meaningful or errors or lines or ["(no message)"])[-1]
    return gist.strip()[:300]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ecosystem", description=__doc__)
    parser.add_argument(
        "--git-dir",
        action="append",
        default=[],
        metavar="LIB=PATH",
        help="the library's git directory, or its sdist (.tar.gz) where a tag is "
        "missing",
    )
    parser.add_argument(
        "--every", type=int, metavar="K", help="sample every K-th item (default: EVERY)"
    )
    parser.add_argument(
        "--start",
        type=int,
        default=0,
        metavar="R",
        help="start each file's sample at its R-th item (0: its first), so that "
        "`--every 2 --start 1` takes the items `--every 2` left",
    )
    parser.add_argument("--only", action="append", choices=sorted(LIBRARIES))
    parser.add_argument("--modes", default=ALL_MODES)
    parser.add_argument(
        "--part",
        metavar="K/N",
        help="only the test files of part K of N (every N-th file by path); runs of "
        "parts merge into --out's results, each recorded with its commit",
    )
    parser.add_argument(
        "--new-only",
        action="store_true",
        help="only the sampled items no earlier run in --out's results has reached, "
        "so a denser sample (a smaller --every) adds to the results item by item",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="modes run side by side (each item runs alone in its mode either way)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "autostatic-ecosystem",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--timeout", type=int, default=3 * 3600, help="per run, seconds"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        help="minutes after which no test process starts: the items left stay for a "
        "later run (--new-only), and what ran is kept",
    )
    parser.add_argument(
        "--chunk", type=int, help="at most this many items in one test process"
    )
    parser.add_argument(
        "--failed-only",
        action="store_true",
        help="only the sampled items that --out's results hold as failed in one of "
        "--modes: run again after a fix",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only render report.md again from the results.json in --out",
    )
    return parser


def _run_library(
    library: str, git_dir: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    """One library's tests, sampled, in every mode of `args.modes`: its results."""
    root = extract(library, git_dir, args.work)
    items = collect(root)
    every = args.every or EVERY[library]
    chosen = in_part(sample(items, every, args.start), args.part)
    modes = args.modes.split(",")
    if args.new_only:
        done = _items_run(args.out / "results.json", library, modes)
        chosen = [i for i in chosen if i not in done]
    if args.failed_only:
        failed = items_failed(args.out / "results.json", library, modes)
        chosen = [i for i in chosen if i in failed]
    print(f"{library}: {len(chosen)} of {len(items)} items", flush=True)
    deadline = None if args.deadline is None else time.monotonic() + 60 * args.deadline
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = [
            pool.submit(
                run_mode,
                root,
                library,
                mode,
                chosen,
                args.timeout,
                deadline,
                args.chunk,
            )
            for mode in modes
        ]
        outcomes = [run.result() for run in runs]
    for outcome in outcomes:
        print(
            f"  {outcome.mode}: {outcome.passed} passed, {outcome.failed} failed, "
            f"{outcome.skipped} skipped ({outcome.seconds:.0f} s)",
            flush=True,
        )
    stopped = any(o.selected < len(chosen) for o in outcomes)
    files: dict[str, int] = {}
    for item in items:
        files[_file_of(item)] = files.get(_file_of(item), 0) + 1
    return {
        "version": importlib.metadata.version(library),
        "collected": len(items),
        "collected_files": files,
        "every": every,
        "outcomes": [asdict(o) for o in outcomes],
        "runs": [
            {
                "autostatic": autostatic_commit(),
                "part": args.part or "all",
                "every": every,
                "start": args.start,
                "new_only": args.new_only,
                **({"failed_only": True} if args.failed_only else {}),
                "modes": args.modes,
                "items": len(set().union(*(o.statuses for o in outcomes))),
                **({"stopped": True} if stopped else {}),
            }
        ],
    }


def _file_of(item: str) -> str:
    return item.split("::")[0]


def in_part(items: list[str], part: str | None) -> list[str]:
    """The items of part `K/N`: those of every N-th test file (sorted by path),
    starting with the K-th; all of them without a part."""
    if part is None:
        return items
    k, n = map(int, part.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--part {part}: K must be between 1 and N")
    files = sorted({_file_of(i) for i in items})[k - 1 :: n]
    return [i for i in items if _file_of(i) in set(files)]


def items_reached(result: dict[str, Any]) -> set[str]:
    """The items one library's results hold an outcome of, in any mode."""
    return {n for o in result["outcomes"] for n in o.get("statuses", {})}


def _items_run(path: Path, library: str, modes: list[str]) -> set[str]:
    """The items of `library` that the results at `path` hold an outcome of in
    every one of `modes`."""
    if not path.exists():
        return set()
    result = json.loads(path.read_text()).get(library)
    if result is None or result.get("version") != importlib.metadata.version(library):
        return set()
    by_mode = {o["mode"]: set(o.get("statuses", {})) for o in result["outcomes"]}
    if not all(mode in by_mode for mode in modes):
        return set()
    return set.intersection(*(by_mode[mode] for mode in modes))


def items_failed(path: Path, library: str, modes: list[str]) -> set[str]:
    """The items of `library` that the results at `path` hold as failed in one of
    `modes`."""
    if not path.exists():
        return set()
    result = json.loads(path.read_text()).get(library) or {"outcomes": []}
    return {
        item
        for o in result["outcomes"]
        if o["mode"] in modes
        for item, status in o.get("statuses", {}).items()
        if status == "failed"
    }


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """One library's results of an earlier run and of a new one (another part,
    another sample, or the same items again): each item's latest outcome per mode,
    `every` the densest sample run. Results of another version, or without per-item
    outcomes, are replaced."""
    same = old.get("version") == new["version"]
    if not same or not all("statuses" in o for o in old["outcomes"]):
        return new
    old_by_mode = {o["mode"]: o for o in old["outcomes"]}
    outcomes = []
    for o in new["outcomes"]:
        before = old_by_mode.pop(o["mode"], None)
        outcomes.append(o if before is None else _merged(before, o))
    # A sample of some files only, or started past each file's first item, is no
    # denser sample of the suite.
    run = new["runs"][-1]
    partial = (
        run.get("start", 0) != 0
        or run.get("part", "all") != "all"
        or run.get("stopped", False)
        or run.get("failed_only", False)
    )
    every = old.get("every", new["every"])
    return {
        **new,
        "every": every if partial else min(every, new["every"]),
        "outcomes": outcomes + list(old_by_mode.values()),
        "runs": old.get("runs", []) + new["runs"],
    }


def _merged(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    statuses = {**before["statuses"], **after["statuses"]}
    failures = {
        node: why
        for node, why in {**before["failures"], **after["failures"]}.items()
        if statuses.get(node) == "failed"
    }
    counts = {k: sum(v == k for v in statuses.values()) for k in _STATUSES}
    return {
        **after,
        **counts,
        "selected": len(statuses),
        "seconds": before["seconds"] + after["seconds"],
        "failures": failures,
        "statuses": statuses,
        "rebase_summary": after["rebase_summary"] or before["rebase_summary"],
        "stock_files": sorted(
            set(before.get("stock_files", [])) | set(after.get("stock_files", []))
        ),
    }


_STATUSES = ("passed", "failed", "skipped")


def autostatic_commit() -> str:
    """The commit of the autostatic checkout run (with `+` if it has changes)."""
    here = Path(__file__).parent.parent  # the checkout

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True)
        return run.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+" if git("status", "--porcelain", "--", "autostatic") else "")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .report import render

    if args.report_only:
        results = json.loads((args.out / "results.json").read_text())
        (args.out / "report.md").write_text(render(results))
        return 0
    git_dirs = dict(spec.split("=", 1) for spec in args.git_dir)
    results = {}
    for library in args.only or list(LIBRARIES):
        results[library] = _run_library(library, git_dirs.get(library), args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    if path.exists():  # other libraries stay as they were; parts are merged
        earlier = json.loads(path.read_text())
        results = {
            **earlier,
            **{
                lib: merge(earlier[lib], r) if lib in earlier else r
                for lib, r in results.items()
            },
        }
    path.write_text(json.dumps(results, indent=1) + "\n")

    (args.out / "report.md").write_text(render(results))
    return 0
