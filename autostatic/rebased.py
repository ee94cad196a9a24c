"""Run an Equinox-based codebase with its Modules auto-static, without editing it.

As a pytest plugin::

    pytest -p autostatic.rebased --autostatic-rebase=diffrax,test \\
        [--autostatic-drop-static-markers] [--autostatic-no-follow]

As a runner of a script or module::

    python -m autostatic.rebased [--drop-static-markers] [--no-follow] diffrax script.py ARGS
    python -m autostatic.rebased diffrax -m some.module ARGS
    python -m autostatic.rebased diffrax,__main__ script.py ARGS   # and its classes
    python -m autostatic.rebased src/models,net.py script.py ARGS  # by directory, file

(options before the packages: what follows the script or module is its own.)

Every class of the named packages (and modules under them, e.g. a test package) with
`eqx.Module` as a direct base becomes an `autostatic.AutoModule` subclass, and so
does every such class of the installed Equinox-based libraries they require (lineax
and optimistix for diffrax), unless told not to follow them. The run
fails if a named package was imported before the rebase, or ends with none of its
classes rebased: a rebase that silently did nothing cannot pass for one that worked.
"""

import argparse
import contextlib
import runpy
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from .rebase._rebase import active_rebase, rebase, RebaseError

__all__ = ["main"]


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("autostatic")
    group.addoption(
        "--autostatic-rebase",
        default="",
        help=ENTRIES_HELP
        + " whose eqx.Module classes become autostatic.AutoModule subclasses "
        "(e.g. diffrax,lineax,tests)",
    )
    group.addoption(
        "--autostatic-drop-static-markers",
        action="store_true",
        help="also remove static=True from their eqx.field(...)s",
    )
    group.addoption(
        "--autostatic-no-follow",
        action="store_true",
        help="rebase only the named packages, not the Equinox-based libraries "
        "they require",
    )


# What a rebase may name, as `--help` says it.
ENTRIES_HELP = (
    "comma-separated entries, each a package or module (`diffrax`: its submodules "
    "too), a directory or file of modules, relative to where the run starts "
    "(`tests`, `src/models/net.py`), or `__main__` (the script run, or a notebook's "
    "later cells)"
)


def _stop_on_sigterm() -> None:
    """Makes a SIGTERM (a time limit: `timeout`, a CI job's) stop the run as Ctrl-C
    does, so that it still ends with its summary; where the signal has no handler
    of its own and this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _option(config: Any, name: str) -> Any:
    return getattr(config.known_args_namespace, name)


def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> None:
    # Before conftest.py files are imported: they import the packages under test.
    packages = _option(early_config, "autostatic_rebase")
    if not packages:
        return
    import pytest

    _stop_on_sigterm()
    try:
        rebase(
            packages.split(","),
            drop_static_markers=_option(early_config, "autostatic_drop_static_markers"),
            follow_dependencies=not _option(early_config, "autostatic_no_follow"),
        )
    except RebaseError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_report_header(config: Any) -> str | None:
    installed = active_rebase()
    return None if installed is None else installed.summary() + " (so far)"


def pytest_collection_finish(session: Any) -> None:
    installed = active_rebase()
    if installed is None:
        return
    import pytest

    try:
        installed.check()
    except RebaseError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    installed = active_rebase()
    if installed is not None:
        terminalreporter.write_line(installed.summary())


_EPILOG = """\
forms:
  python -m autostatic.rebased mylib script.py ARGS          a script, mylib rebased
  python -m autostatic.rebased mylib -m pkg.mod ARGS         a module run as __main__
  python -m autostatic.rebased mylib,__main__ script.py      the script's classes too
  python -m autostatic.rebased src/models,net.py script.py   by directory, by file
  pytest -p autostatic.rebased --autostatic-rebase=mylib,tests
      [--autostatic-drop-static-markers] [--autostatic-no-follow]

The summary (classes rebased per package) goes to stderr when the run ends, also
when it is stopped by Ctrl-C or SIGTERM.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m autostatic.rebased",
        description="Run a script or module with the eqx.Module classes of PACKAGES\n"
        "rebased onto autostatic.AutoModule. Options go before PACKAGES: what\n"
        "follows the script or module is its own.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("packages", help=ENTRIES_HELP)
    parser.add_argument(
        "--drop-static-markers",
        action="store_true",
        help="also remove static=True from their eqx.field(...)s",
    )
    parser.add_argument(
        "--no-follow",
        action="store_true",
        help="rebase only PACKAGES, not the Equinox-based libraries they require",
    )
    parser.add_argument("-m", dest="module", help="run this module as __main__")
    parser.add_argument("target", nargs=argparse.REMAINDER, help="script and args")
    args = parser.parse_args(argv)
    if not args.module and not args.target:
        parser.error("give a script path or -m MODULE")
    try:
        installed = rebase(
            args.packages.split(","),
            drop_static_markers=args.drop_static_markers,
            follow_dependencies=not args.no_follow,
        )
    except RebaseError as err:
        parser.exit(2, f"{err}\n")
    _stop_on_sigterm()
    with _summary_at_the_end(installed):
        if args.module:
            sys.argv = [args.module, *args.target]
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args.target)
            runpy.run_path(args.target[0], run_name="__main__")
    try:
        installed.check()
    except RebaseError as err:
        parser.exit(2, f"{err}\n")


@contextlib.contextmanager
def _summary_at_the_end(installed: Any) -> Iterator[None]:
    """Prints the rebase's summary when the run ends, however it ends: a run that a
    time limit stops says what it had rebased by then."""
    try:
        yield
    except BaseException as stop:
        if not isinstance(stop, SystemExit):
            print(f"autostatic rebase: the run stopped ({stop!r})", file=sys.stderr)
        raise
    finally:
        print(installed.summary(), file=sys.stderr)


if __name__ == "__main__":
    main()
