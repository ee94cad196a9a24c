"""Equinox's example notebooks with their Modules auto-static, by the base swap alone.

    python -m ecosystem.notebooks --git-dir PATH [--only NAME ...] [--out DIR]

The notebooks of `docs/examples/` at the tag of the installed Equinox (from its git
directory; never committed) are executed three times each, as in `python -m
ecosystem`: stock; with a first cell that rebases the classes the notebook defines
onto `AutoModule` (`autostatic.rebase(["__main__"])`, static markers kept: b); and
the same with the markers dropped (b2). Not one line of a notebook is edited; in every
mode a first cell seeds numpy's and Python's global generators, and a last cell prints
a fingerprint of what the notebook left: every array, module or container of them in
its namespace, by name, as the dtype, shape and sum of each array leaf. The report
(`notebooks.md`, `notebooks.json`) gives per notebook and mode whether it ran, and
where its printed output or fingerprint differs from stock's. Notebooks that need
data this machine cannot reach (`CANNOT_RUN`) are listed with what they need. `unet`
imports `einops`, which autostatic does not install (`pip install einops`): without
it that notebook fails in every mode, and the report says so. `mnist` needs torch and
torchvision (`pip install torch==2.14.1 torchvision==0.29.1`, or any pair that
imports); where the snapshot lacks MNIST's training images, the test set stands in
for them in every mode (`stand_in_mnist`), and the report says so.
"""

import argparse
import difflib
import gzip
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import nbclient
import nbformat

from .run import autostatic_commit

EXAMPLES = "docs/examples"
MODES = ("baseline", "b", "b2")
_DOWNLOADS = "downloads its dataset with torchvision (this machine has no network)"
# Notebooks this machine cannot run, and why (`--run` runs one anyway).
CANNOT_RUN = {
    "bert": "reads `bert_checkpoint.eqx` (kept in Git LFS, absent here) and downloads "
    "a tokenizer and a dataset with `transformers` and `datasets`; reading that "
    "checkpoint, written with static markers, into the ported classes is tested in "
    "`tests/test_eqx_format.py`, and the notebook's own classes by `python -m "
    "ecosystem.bert`",
    "deep_convolutional_gan": _DOWNLOADS,
    "vision_transformer": _DOWNLOADS,
    "score_based_diffusion": "reads MNIST's training images (absent here) or "
    "downloads them",
}
_MNIST_RAW = "MNIST/MNIST/raw"


def stand_in_mnist(examples: Path) -> str | None:
    """Where the snapshot lacks MNIST's training images (kept out of it: large), the
    test images and labels written as the training set, so that `mnist` reads real
    digits with their labels; what was done, or None where nothing was needed."""
    raw = examples / _MNIST_RAW
    if (raw / "train-images-idx3-ubyte").exists():
        return None
    for kind in ("images-idx3", "labels-idx1"):
        test = raw / f"t10k-{kind}-ubyte"
        if not test.exists():
            packed = test.with_name(test.name + ".gz")
            if not packed.exists():
                return None
            test.write_bytes(gzip.decompress(packed.read_bytes()))
        (raw / f"train-{kind}-ubyte").write_bytes(test.read_bytes())
    return (
        "MNIST's training images are absent from the snapshot: its 10,000 test "
        "images and labels stand in for the training set, in every mode"
    )


def _needs(notebook: str) -> str | None:
    """Why `notebook` cannot run in this environment, beyond `CANNOT_RUN`."""
    if notebook == "mnist" and importlib.util.find_spec("torchvision") is None:
        return "needs torch and torchvision (`pip install torch torchvision`)"
    return None


_REBASE_CELL = """\
import autostatic
_autostatic_rebase = autostatic.rebase(["__main__"], drop_static_markers={drop})
"""
# Some notebooks draw data from numpy's global generator unseeded, or shuffle with
# torch's; every mode, stock included, starts from the same seeds.
_SEED_CELL = """\
import random, numpy
random.seed(0)
numpy.random.seed(0)
try:
    import torch
    torch.manual_seed(0)
except ImportError:
    pass
"""
_FINGERPRINT_CELL = """\
import equinox as _eqx, jax as _jax, numpy as _np
for _name, _value in sorted(dict(globals()).items()):
    if _name.startswith("_"):
        continue
    try:
        _leaves = _jax.tree.leaves(_eqx.filter(_value, _eqx.is_array))
    except Exception:
        continue
    if _leaves and all(hasattr(_l, "dtype") for _l in _leaves):
        print("FINGERPRINT", _name, [
            (str(_l.dtype), tuple(_l.shape), float(_np.asarray(_l, dtype=_np.float64).sum()))
            for _l in _leaves])
if "_autostatic_rebase" in globals():
    print(_autostatic_rebase.summary())
"""
# A notebook's outputs that differ between runs of the same code: wall times, and
# the addresses in reprs (`<function relu at 0x7f...>`).
_VOLATILE = re.compile(r"\d+(\.\d+)?(e-?\d+)? ?(s|ms|seconds)\b|\b0x[0-9a-f]+\b")


def extract(git_dir: str, into: Path) -> tuple[list[Path], list[str]]:
    """The example notebooks at the installed Equinox's tag, under `into`, with the
    files beside them, and the files a partial clone lacks (large data, kept out of
    a snapshot)."""
    tag = f"v{importlib.metadata.version('equinox')}"

    def git(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", *args], capture_output=True
        )

    names = git("ls-tree", "-r", "--name-only", tag, EXAMPLES).stdout.decode().split()
    absent = []
    for name in names:
        blob = git("show", f"{tag}:{name}")
        if blob.returncode != 0:
            absent.append(name)
            continue
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(blob.stdout)
    return sorted((into / EXAMPLES).glob("*.ipynb")), absent


def execute(path: Path, mode: str, timeout: int) -> dict[str, Any]:
    """Runs the notebook at `path` in `mode`: whether it ran, its printed output
    (cell by cell, wall times and addresses masked) and the first error."""
    notebook = nbformat.read(path, as_version=4)
    if mode != "baseline":
        cell = _REBASE_CELL.format(drop=mode == "b2")
        notebook.cells.insert(0, nbformat.v4.new_code_cell(cell))
    notebook.cells.insert(0, nbformat.v4.new_code_cell(_SEED_CELL))
    notebook.cells.append(nbformat.v4.new_code_cell(_FINGERPRINT_CELL))
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as err:  # a failing cell: what it said is the outcome
        error = _error_line(str(err))
    printed = _printed(notebook)
    summary = [line for line in printed if line.startswith("autostatic rebase")]
    rebased = re.search(
        r"(\d+) direct eqx.Module subclasses rebased", " ".join(summary)
    )
    return {
        "ran": error is None,
        "error": error,
        "seconds": round(time.perf_counter() - start, 1),
        "rebased": int(rebased[1]) if rebased else 0,
        "output": [line for line in printed if line not in summary],
    }


def _printed(notebook: nbformat.NotebookNode) -> list[str]:
    """Every line the cells printed or displayed as text, wall times masked."""
    lines = []
    for cell in notebook.cells:
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            lines += [_VOLATILE.sub("<masked>", line) for line in text.splitlines()]
    return lines


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


_EXCEPTION = re.compile(r"^\w*(Error|Exception)\b")


def _error_line(message: str) -> str:
    """The last line of a cell's traceback naming an exception, else its last."""
    lines = [line for line in _COLOUR.sub("", message).splitlines() if line.strip()]
    named = [i for i, line in enumerate(lines) if _EXCEPTION.match(line)]
    if not named:
        return (lines[-1] if lines else "(no message)").strip()[:300]
    # The line after the exception's, where indented, continues it (a key path).
    said = lines[named[-1] : named[-1] + 2]
    if len(said) == 2 and not said[1].startswith((" ", "\t")):
        said = said[:1]
    return " ".join(line.strip() for line in said)[:300]


def differences(runs: dict[str, Any]) -> dict[str, list[str] | None]:
    """Per rebased mode, the printed lines that differ from stock's; where stock
    fails, b2's from b's (b then has none to compare with: `None`)."""
    if runs["baseline"]["ran"]:
        return {m: compare(runs["baseline"], runs[m]) for m in MODES[1:]}
    return {"b": None, "b2": compare(runs["b"], runs["b2"])}


def compare(stock: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The lines of `other`'s printed output that differ from stock's (a diff)."""
    return [
        line
        for line in difflib.unified_diff(stock["output"], other["output"], n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Equinox's example notebooks, auto-static by the base swap alone",
        "",
        f"Made by `python -m ecosystem.notebooks` (Equinox {results['equinox']}, "
        f"autostatic {results['autostatic']}). b: the classes each notebook defines "
        "rebased onto AutoModule, static markers kept; b2: markers dropped. *same*: "
        "every printed line and the fingerprint of every array left in the namespace "
        "equal stock's (wall times and addresses masked), or b's where stock fails.",
        "",
        "| notebook | classes rebased | stock | b | b2 |",
        "|---|---:|---|---|---|",
    ]
    for name, r in results["notebooks"].items():
        cells = [_cell(r["runs"]["baseline"], None)]
        cells += [_cell(r["runs"][m], r["differences"][m]) for m in ("b", "b2")]
        rebased = r["runs"]["b"]["rebased"]
        lines.append(f"| {name} | {rebased} | {' | '.join(cells)} |")
    stand_ins = results.get("stand_ins", {})
    if stand_ins:
        lines += ["", "Data standing in for what the snapshot lacks:", ""]
        lines += [f"- {name}: {what}" for name, what in stand_ins.items()]
    skipped = results["skipped"]
    if skipped:
        lines += ["", "Not run here:", ""]
        lines += [f"- {name}: {why}" for name, why in skipped.items()]
    if results["absent"]:
        shown = ", ".join(f"`{Path(a).name}`" for a in results["absent"])
        lines += ["", f"Files of `{EXAMPLES}` absent from the snapshot used: {shown}."]
    for name, r in results["notebooks"].items():
        for mode in ("b", "b2"):
            if r["differences"][mode]:
                lines += ["", f"## {name}, {mode}: lines that differ", ""]
                lines += ["```", *r["differences"][mode][:40], "```"]
    return "\n".join(lines) + "\n"


def _cell(run: dict[str, Any], different: list[str] | None) -> str:
    if not run["ran"]:
        return f"fails: {run['error']}"
    if different is None:
        return f"ran ({run['seconds']:.0f} s)"
    if different:
        return f"**{len(different)} lines differ** ({run['seconds']:.0f} s)"
    return f"same ({run['seconds']:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecosystem.notebooks")
    parser.add_argument("--git-dir", required=True, help="Equinox's git directory")
    parser.add_argument("--only", action="append", help="a notebook's name")
    parser.add_argument(
        "--run", action="append", default=[], help="a notebook of CANNOT_RUN, run"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "autostatic-notebooks",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--timeout", type=int, default=1800, help="per cell, seconds")
    args = parser.parse_args(argv)
    skipped = {n: why for n, why in CANNOT_RUN.items() if n not in args.run}
    results: dict[str, Any] = {
        "equinox": importlib.metadata.version("equinox"),
        "autostatic": autostatic_commit(),
        "notebooks": {},
        "skipped": skipped,
        "stand_ins": {},
    }
    paths, absent = extract(args.git_dir, args.work)
    results["absent"] = absent
    for path in paths:
        name = path.stem
        if name not in skipped and (why := _needs(name)):
            skipped[name] = why
        if (args.only and name not in args.only) or name in skipped:
            continue
        if name == "mnist" and (done := stand_in_mnist(path.parent)):
            results["stand_ins"][name] = done
        runs = {mode: execute(path, mode, args.timeout) for mode in MODES}
        print(name, {m: r["ran"] for m, r in runs.items()}, flush=True)
        results["notebooks"][name] = {
            "runs": runs,
            "differences": differences(runs),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "notebooks.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "notebooks.md").write_text(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
