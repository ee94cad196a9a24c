"""Writing a file at a path atomically and durably: `write_file`.

The bytes go to a temporary file beside the target, which is renamed over the target,
so a crash leaves the earlier file or the whole new one; a durable write also fsyncs the
file before the rename and its folder after it. A FIFO or character device is written
into as it is, since a rename would replace it by a regular file; a folder or any other
special file is refused.
"""

import contextlib
import functools
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from ._errors import CheckpointError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so stale temporary files stay
    fcntl = None

# A writer of the whole file; the file it gets is a binary file object, or a
# stand-in that passes its writes on in chunks.
Write = Callable[[Any], None]
FilePath = str | bytes | os.PathLike

# A durable save starts the disk writes of every this many bytes as soon as they are
# written, so that the disk works while later arrays are copied.
_WRITEBACK_CHUNK = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback, do not wait


@functools.cache
def _start_writeback() -> Callable[[int, int, int], None] | None:
    """Linux's `sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`, which the
    `os` module lacks: starts writing a range of a file's dirty pages to disk and returns
    without waiting. `None` elsewhere (the fsync at the end then does all the work)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        # A failure (a file system without it) is ignored: only the fsync is relied on.
        function(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)

    return start


class _WritebackFile:
    """The temporary file of a durable save. Writes go through in chunks of
    `_WRITEBACK_CHUNK` bytes, and the disk write of each chunk is started as soon as
    it is written, so the fsync at the end waits for the last chunk instead of the
    whole file (about 1.5x faster durable saves; design.md, "Saving")."""

    def __init__(self, f: BinaryIO, start: Callable[[int, int, int], None]) -> None:
        self.f, self.start, self.fd = f, start, f.fileno()
        self.written = self.started = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for begin in range(0, len(view), _WRITEBACK_CHUNK):
            chunk = view[begin : begin + _WRITEBACK_CHUNK]
            self.f.write(chunk)
            self.written += len(chunk)
            if self.written - self.started >= _WRITEBACK_CHUNK:
                self.f.flush()
                self.start(self.fd, self.started, self.written - self.started)
                self.started = self.written
        return len(view)

    def flush(self) -> None:
        self.f.flush()


def _replaced_file(path: FilePath) -> str:
    """The file that writing to `path` replaces: through a symbolic link, its target,
    so the link stays a link (as `open(path, "wb")` would write through it)."""
    name = os.fsdecode(os.fspath(path))
    return os.path.realpath(name) if os.path.islink(name) else name


def _write_through(path: FilePath, write: Write) -> bool:
    """Writes into `path` as it is, if it is a FIFO or a character device
    (`/dev/stdout` into a pipe, `/dev/null`), which a rename would replace by a
    regular file; returns whether it did. Refuses anything else that is not a
    regular file."""
    name = os.fsdecode(os.fspath(path))
    try:
        mode = os.stat(name).st_mode
    except OSError:  # a new path (or a broken link): the atomic write says why
        return False
    if stat.S_ISREG(mode):
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        with open(name, "wb") as f:
            write(f)
        return True
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
    raise CheckpointError(
        f"cannot save to {name!r}: it is {kind}. Give the path of a file (it is "
        "created, or replaced whole)."
    )


_TEMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp\Z", re.DOTALL)


def _create_temp(target: str) -> tuple[int, str]:
    """A new temporary file beside `target`, locked until its descriptor is closed."""
    folder, base = os.path.split(os.path.abspath(target))
    temp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
    # os.open with 0o666 gives the final file the usual umask permissions.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(temp, flags, 0o666)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, temp


def _remove_stale_temps(target: str) -> None:
    """Deletes the temporary files of earlier writes to `target` whose process died.

    A write holds an exclusive `flock` on its temporary file from just after creating
    it until after the rename, and the kernel drops a lock when its process dies, even
    by SIGKILL: a temporary file that can be locked is abandoned. The one exception is
    the instant between a live write's create and its lock, when its file is still
    empty, so an empty file is only deleted once it is a minute old.
    """
    if fcntl is None:
        return
    folder, base = os.path.split(os.path.abspath(target))
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _TEMP_NAME.match(name)
        if match is None or match.group(1) != base:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):  # vanished, in use, or not ours to delete
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                info = os.fstat(fd)
                if info.st_size or time.time() - info.st_mtime > 60:
                    os.unlink(path)
            finally:
                os.close(fd)


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; not every platform can open a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _with_path(err: OSError, target: str) -> OSError:
    """`err` with the path being saved in its message (a failed write names none)."""
    if err.filename is not None:
        return err
    why = f"{err.strerror or err} (saving failed; any earlier file there is unchanged)"
    if err.errno is None:
        return OSError(f"{why}: {target!r}")
    return OSError(err.errno, why, target)  # the errno picks the subclass


def _atomic_write(path: FilePath, write: Write, durable: bool) -> None:
    """Writes through `write` to a temporary file beside the target, then renames it
    over the target; `durable`: the file is fsynced before the rename and the folder
    after it. A failure at any point leaves an existing file untouched and removes the
    temporary file."""
    target = _replaced_file(path)
    try:
        fd, temp = _create_temp(target)
    except OSError as err:  # name the file asked for, not the temporary one
        raise OSError(
            err.errno, f"{err.strerror} (cannot create a file beside it)", target
        ) from err
    try:
        with contextlib.suppress(FileNotFoundError):  # keep a replaced file's mode
            os.chmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        with open(fd, "wb", closefd=False) as f:
            start = _start_writeback() if durable else None
            write(f if start is None else _WritebackFile(f, start))
            f.flush()
            if durable:
                os.fsync(fd)
        if fcntl is None:  # Windows cannot rename an open file
            os.close(fd)
            fd = -1
        os.replace(temp, target)  # still locked, so no other write deletes it first
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(err, OSError):
            raise _with_path(err, target) from err
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    if durable:
        _fsync_folder(os.path.dirname(os.path.abspath(target)))
    _remove_stale_temps(target)


def write_file(path: FilePath, write: Write, *, durable: bool) -> None:
    """Writes the file at `path` through `write`: a FIFO or character device is
    written into as it is, a folder or other special file is refused, and a regular
    or new file is replaced atomically (`durable`: and is on disk on return)."""
    if not _write_through(path, write):
        _atomic_write(path, write, durable)
