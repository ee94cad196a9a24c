"""The checkpoint benchmark's cells (`serialisation`), and one measurement of a cell: its
operation timed once, warm code and cold memory, with the peak memory around it, in a
fresh process forked from a server (`_zygote`) that has imported numpy, JAX, Equinox
and autostatic but started nothing."""

import gc
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from typing import Any

AUTO, AUTO_FAST, EQX, FLOOR_SYNC, FLOOR_STREAM, FLOOR = (
    "autostatic",
    "autostatic durable=False",
    "eqx",
    "numpy + fsync",
    "numpy + writeback + fsync",
    "numpy",
)
SAVE, LOAD_HOST, LOAD_DEVICE = "save", "load_host", "load_device"
CELLS: tuple[tuple[str, str], ...] = (
    (SAVE, AUTO),
    (SAVE, AUTO_FAST),
    (SAVE, EQX),
    (SAVE, FLOOR_SYNC),
    (SAVE, FLOOR_STREAM),
    (SAVE, FLOOR),
    (LOAD_HOST, AUTO),
    (LOAD_HOST, EQX),
    (LOAD_HOST, FLOOR),
    (LOAD_DEVICE, AUTO),
    (LOAD_DEVICE, EQX),
    (LOAD_DEVICE, FLOOR),
)
_FILES = {"autostatic": "model.safetensors", "eqx": "model.eqx", "numpy": "model.bin"}


def file_format(impl: str) -> str:
    """Which file format a cell writes or reads."""
    return impl.split(" ")[0]


# --------------------------------------------------------------------------- child side


def _define_models() -> Any:
    """`build(impl, count, side, abstract)`: the model of one format. Imported in the
    children only: the parent process stays free of JAX."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import autostatic as asx

    class AutoNet(asx.AutoModule):
        weights: list
        name: str

        def __init__(self, weights: list) -> None:
            self.weights = weights
            self.name = "net"

    class EqxNet(eqx.Module):
        weights: list
        name: str = eqx.field(static=True)

        def __init__(self, weights: list) -> None:
            self.weights = weights
            self.name = "net"

    def build(impl: str, count: int, side: int, abstract: bool) -> Any:
        """The model (a list of arrays for the floor) or, `abstract`, its template."""
        cls = {"autostatic": AutoNet, "eqx": EqxNet, "numpy": list}[file_format(impl)]
        if abstract:  # nothing is allocated
            return eqx.filter_eval_shape(
                lambda: cls([jnp.zeros((side, side), "float32") for _ in range(count)])
            )
        # Blocked on, so that no copy is still in flight (holding its numpy source)
        # when the baseline of the peak memory is taken.
        return jax.block_until_ready(
            cls(
                [
                    jax.device_put(np.full((side, side), i, np.float32))
                    for i in range(count)
                ]
            )
        )

    return build


def _numpy_save(path: str, model: list, fsync: bool, writeback: bool = False) -> None:
    """The floor's save; `writeback`: the disk write of each array is started as soon
    as it is written (Linux's `sync_file_range`), so the fsync waits for the last one,
    as in our durable save."""
    import numpy as np

    from autostatic.checkpoint._files import _start_writeback

    start = _start_writeback() if writeback else None
    with open(path, "wb") as f:
        for leaf in model:
            begin = f.tell()
            np.asarray(leaf).tofile(f)
            if start is not None:
                f.flush()
                start(f.fileno(), begin, f.tell() - begin)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _numpy_load(path: str, like: list, device: bool) -> list:
    """The floor's load: the raw bytes into arrays of known shapes (then to the device)."""
    import jax
    import numpy as np

    out = []
    with open(path, "rb", buffering=0) as f:
        for leaf in like:
            array = np.empty(leaf.shape, leaf.dtype)
            if f.readinto(array) != array.nbytes:  # pyright: ignore[reportArgumentType]
                raise EOFError(path)
            out.append(jax.device_put(array) if device else array)
    return out


def _make_operation(op: str, impl: str) -> Any:
    """`f(path, subject)` doing the cell's operation (a load returns the result)."""
    import equinox as eqx

    import autostatic

    if op == SAVE:
        return {
            AUTO: autostatic.save,
            AUTO_FAST: lambda path, model: autostatic.save(path, model, durable=False),
            EQX: eqx.tree_serialise_leaves,
            FLOOR_SYNC: lambda path, model: _numpy_save(path, model, fsync=True),
            FLOOR_STREAM: lambda path, model: _numpy_save(
                path, model, fsync=True, writeback=True
            ),
            FLOOR: lambda path, model: _numpy_save(path, model, fsync=False),
        }[impl]
    host = op == LOAD_HOST
    return {
        AUTO: lambda path, like: autostatic.load(path, like, host=host),
        EQX: eqx.tree_deserialise_leaves,
        FLOOR: lambda path, like: _numpy_load(path, like, device=not host),
    }[impl]


def _make_subject(op: str, impl: str, count: int, side: int) -> Any:
    """What a cell's operation takes: the model to save, or the template to load."""
    import jax
    import numpy as np

    build = _define_models()
    if op == SAVE:
        return build(impl, count, side, abstract=False)
    like = build(impl, count, side, abstract=True)
    if impl == EQX and op == LOAD_HOST:
        like = jax.tree.map(
            lambda s: np.broadcast_to(np.zeros((), s.dtype), s.shape), like
        )
    return like


def _prepare(folder: str, count: int, side: int) -> None:
    """Writes the file each format's loads read, fsynced (so no writeback is pending)."""
    for impl in ("autostatic", "eqx", "numpy"):
        path = os.path.join(folder, _FILES[impl])
        model = _make_subject(SAVE, impl, count, side)
        if impl == "autostatic":
            _make_operation(SAVE, AUTO)(path, model)
        elif impl == "eqx":
            _make_operation(SAVE, EQX)(path, model)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        else:
            _make_operation(SAVE, FLOOR_SYNC)(path, model)


def _read_rss_kb(field: str) -> int | None:
    """A memory field of `/proc/self/status`, in kB (None where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Resets the peak resident set to the current one; False where Linux does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
    except OSError:
        return False
    return _read_rss_kb("VmHWM") is not None


def _read_maxrss_kb() -> int:
    """The process's peak resident set so far, in kB."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage // 1024 if sys.platform == "darwin" else usage  # bytes on macOS


def _measure(op: str, impl: str, folder: str, count: int, side: int) -> dict[str, Any]:
    """One measurement of one cell, in a fresh process: seconds and peak memory."""
    import jax

    operation = _make_operation(op, impl)
    fmt = file_format(impl)
    if op == SAVE:
        # A name ending in .eqx, which Equinox would otherwise append.
        path = os.path.join(folder, f"save-{impl.replace(' ', '-')}.{fmt}.eqx")
        warm_path = path + ".warm.eqx"
    else:
        path = os.path.join(folder, _FILES[fmt])
        warm_path = os.path.join(folder, f"warm-{os.getpid()}.eqx")

    # Warm code, cold memory: the same calls on a tiny model of the same structure.
    writer = impl if op == SAVE else _WRITER[fmt]
    _make_operation(SAVE, writer)(warm_path, _make_subject(SAVE, writer, count, 1))
    if op != SAVE:
        jax.block_until_ready(operation(warm_path, _make_subject(op, impl, count, 1)))
    os.remove(warm_path)

    subject = _make_subject(op, impl, count, side)
    # Untimed: the disk starts idle, with no writeback of an earlier cell in flight (a
    # save without fsync otherwise meets the kernel's dirty-page throttling at random).
    os.sync()
    gc.collect()
    gc.disable()
    precise = _reset_peak()
    baseline = _read_rss_kb("VmRSS") if precise else _read_maxrss_kb()
    start = time.perf_counter()
    out = operation(path, subject)
    if op != SAVE:
        jax.block_until_ready(out)
    seconds = time.perf_counter() - start
    peak = (_read_rss_kb("VmHWM") if precise else _read_maxrss_kb()) or 0
    gc.enable()
    if op == SAVE:
        os.remove(path)  # untimed: no dirty pages are left for the next cell
    return {
        "seconds": seconds,
        "peak_rss_mb": max(peak - (baseline or 0), 0) / 1024,
        "peak_method": "VmHWM" if precise else "ru_maxrss",
    }


# The cell that writes each format's warm-up file for a load.
_WRITER = {"autostatic": AUTO, "eqx": EQX, "numpy": FLOOR}


# -------------------------------------------------------------------------- parent side


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _zygote() -> None:
    """The server every measurement is forked from (`python -c`, run by `Zygote`): it
    imports numpy, JAX, Equinox and autostatic but starts nothing (no JAX backend, no
    allocations), then, for each request line on stdin, forks a child that runs one
    function and reports its result, one line on stdout. Without `os.fork`, it runs one
    request itself and is replaced for the next."""
    import equinox  # noqa: F401
    import jax  # noqa: F401
    import numpy  # noqa: F401

    import autostatic  # noqa: F401

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints of the children go to stderr, not into the replies
    fork = getattr(os, "fork", None)
    for line in sys.stdin:
        request = json.loads(line)
        if fork is None:
            out.write(_reply(request) + "\n")
            out.flush()
            return
        read, write = os.pipe()
        pid = fork()
        if pid == 0:  # the child: one measurement, then gone without any cleanup
            os.close(read)
            with os.fdopen(write, "w") as f:
                f.write(_reply(request))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            reply = f.read()
        _, status = os.waitpid(pid, 0)
        if not reply:
            reply = json.dumps({"error": f"the measurement process died ({status})"})
        out.write(reply + "\n")
        out.flush()


def _reply(request: dict[str, Any]) -> str:
    """Runs the requested function of this module; its result or traceback, as JSON."""
    try:
        return json.dumps({"ok": globals()[request["fn"]](*request["args"])})
    except BaseException:
        return json.dumps({"error": traceback.format_exc()})


class Zygote:
    """The parent's end of `_zygote`: `call` runs a function of this module in a fresh
    process forked from it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        from .processes import child_environment  # imports jax: the parent's alone

        code = f"from {__name__} import _zygote; _zygote()"
        return subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=_REPO,  # where `benchmarks` is a package
            env=child_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, fn: str, *args: Any) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"fn": fn, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the measurement server died ({self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{fn}{args} failed:\n{reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
