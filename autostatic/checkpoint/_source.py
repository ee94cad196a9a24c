"""Random access to the bytes of a checkpoint, from a path or a binary file object."""

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from ._errors import CheckpointError

PathOrFile = str | os.PathLike | BinaryIO


def require_binary(file: Any, mode: str) -> None:
    """Refuses a text-mode file object, which would fail later with a confusing
    UnicodeDecodeError (reading) or TypeError (writing)."""
    file_mode = getattr(file, "mode", "")
    if isinstance(file, io.TextIOBase) or (
        isinstance(file_mode, str) and file_mode and "b" not in file_mode
    ):
        raise TypeError(
            f"the file object is open in text mode ({file_mode or type(file).__name__}"
            f"); checkpoints are binary. Open it with open(path, {mode!r})."
        )


class Source:
    """Random access to the bytes of a checkpoint, relative to where it starts."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        require_binary(file, "rb")
        self.file = file
        self.name = name
        try:
            self.start = file.tell()
            self.size = file.seek(0, io.SEEK_END) - self.start
        except (AttributeError, OSError, io.UnsupportedOperation) as err:
            raise CheckpointError(
                f"{name} is not seekable ({err}); loading needs random access. Read "
                "it into an io.BytesIO first."
            ) from err
        self._readinto = getattr(file, "readinto", None)

    def read_into(self, offset: int, view: memoryview, what: str) -> None:
        self.file.seek(self.start + offset)
        done, total = 0, len(view)
        while done < total:
            if self._readinto is not None:
                got = self._readinto(view[done:])
            else:
                chunk = self.file.read(min(total - done, 1 << 26))
                got = len(chunk)
                view[done : done + got] = chunk
            if not got:
                raise CheckpointError(
                    f"{self.name} ended while reading {what}: {total} bytes expected "
                    f"at byte {offset}, {done} found. The file is truncated or was "
                    "changed while loading."
                )
            done += got

    def read(self, offset: int, size: int, what: str) -> bytearray:
        """Reads `size` bytes, which the caller has checked the file has (a bytearray,
        so that a large header is not copied once more into a bytes object)."""
        data = bytearray(size)
        self.read_into(offset, memoryview(data), what)
        return data

    def seek_end(self) -> None:
        self.file.seek(self.start + self.size)


@contextlib.contextmanager
def open_source(file: PathOrFile) -> Iterator[Source]:
    """A `Source` for a path (opened unbuffered, read straight into arrays) or for a
    seekable binary file object positioned at the checkpoint."""
    if isinstance(file, (str, bytes, os.PathLike)):
        name = os.fsdecode(os.fspath(file))
        with open(name, "rb", buffering=0) as f:
            yield Source(f, repr(name))
    else:
        yield Source(file, "the file object")
