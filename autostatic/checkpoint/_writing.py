"""Writing a safetensors file: the header length, the header, then the tensors' bytes,
each aligned to its item size."""

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ._dtypes import KNOWN_DTYPES, little_endian, METADATA_DTYPES, storage_of
from ._errors import CheckpointError, show
from ._header import LENGTH_BYTES

LITTLE_ENDIAN_HOST = sys.byteorder == "little"


@dataclasses.dataclass(frozen=True)
class Planned:
    """One array to write: its key, numpy dtype name and shape."""

    key: str
    dtype_name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * KNOWN_DTYPES[self.dtype_name].itemsize


def encode_header(arrays: list[Planned]) -> tuple[bytes, list[int]]:
    """The header bytes, and the indices of `arrays` in the order their bytes follow.

    Decreasing item size keeps every tensor aligned to its item size (a stable sort, so
    same-size tensors keep their natural order); the header itself lists them in natural
    order, for people reading it.
    """
    order = sorted(
        range(len(arrays)),
        key=lambda i: -min(KNOWN_DTYPES[arrays[i].dtype_name].itemsize, 8),
    )
    offsets: dict[int, list[int]] = {}
    offset = 0
    for i in order:
        offsets[i] = [offset, offset + arrays[i].nbytes]
        offset += arrays[i].nbytes
    header: dict[str, Any] = {}
    raw_dtypes = {a.key: a.dtype_name for a in arrays if storage_of(a.dtype_name).raw}
    if raw_dtypes:
        header["__metadata__"] = {METADATA_DTYPES: json.dumps(raw_dtypes)}
    for i, planned in enumerate(arrays):
        storage = storage_of(planned.dtype_name)
        extra = () if storage.extra_axis is None else (storage.extra_axis,)
        header[planned.key] = {
            "dtype": storage.name,
            "shape": list(planned.shape + extra),
            "data_offsets": offsets[i],
        }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + b" " * (-len(encoded) % 8), order


def file_writer(
    planned: list[Planned], arrays: list[Any]
) -> Callable[[BinaryIO], None]:
    """The writer of the file holding `arrays`, the array of each entry of `planned`:
    the header length, the header, then the tensors' bytes in the order the header
    gives. The header is encoded here, once, however often the writer runs."""
    header, order = encode_header(planned)

    def write(f: BinaryIO) -> None:
        f.write(len(header).to_bytes(LENGTH_BYTES, "little"))
        f.write(header)
        for i in order:
            _write_tensor(f, planned[i].key, arrays[i], planned[i].nbytes)

    return write


def _write_tensor(f: BinaryIO, key: str, leaf: Any, nbytes: int) -> None:
    """Writes the `nbytes` bytes of `leaf` as the file stores a tensor: little-endian,
    C order, packed."""
    # One array on the host at a time: a device array is copied here, then dropped.
    array = np.asarray(leaf)
    if array.dtype.byteorder == ">" or (
        array.dtype.byteorder == "=" and not LITTLE_ENDIAN_HOST
    ):
        array = array.astype(little_endian(array.dtype))
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.nbytes != nbytes:
        raise CheckpointError(
            f"{show(key)} changed size while being saved ({nbytes} bytes "
            f"planned, {flat.nbytes} found)."
        )
    if nbytes:
        f.write(flat.view(np.uint8).data)
