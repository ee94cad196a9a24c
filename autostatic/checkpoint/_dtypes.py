"""The dtypes of a checkpoint: every dtype read or written, its safetensors name, how a
dtype without one is stored (as raw bytes, recorded in `__metadata__`), and which bytes
are valid values of a dtype.

Only the standard safetensors dtypes are written, so other tools read our files; dtypes
without a safetensors name travel as raw bytes (design.md, "Format", has the
layout).
"""

import dataclasses

import ml_dtypes
import numpy as np

from ._errors import show

METADATA_DTYPES = "autostatic.dtypes"  # the `__metadata__` key of raw-stored dtypes

_NUMPY_DTYPE_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
_ML_DTYPE_NAMES = (
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4", "int2", "uint2",
    "int1", "uint1", "complex32", "bcomplex32",
)  # fmt: skip


def _known_dtypes() -> dict[str, np.dtype]:
    known = {name: np.dtype(name) for name in _NUMPY_DTYPE_NAMES}
    for name in _ML_DTYPE_NAMES:
        scalar_type = getattr(ml_dtypes, name, None)  # older ml_dtypes lack some
        if scalar_type is not None:
            known[name] = np.dtype(scalar_type)
    return known


# Every dtype this library reads or writes, by numpy name. Names read from a file are
# only ever looked up here, never passed to np.dtype.
KNOWN_DTYPES = _known_dtypes()

_SAFETENSORS_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL", "complex64": "C64",
}  # fmt: skip
_SAFETENSORS_NAMES = {k: v for k, v in _SAFETENSORS_NAMES.items() if k in KNOWN_DTYPES}
FROM_SAFETENSORS = {v: KNOWN_DTYPES[k] for k, v in _SAFETENSORS_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class Storage:
    """How a dtype is stored: a safetensors dtype, plus a trailing axis if raw."""

    name: str  # safetensors dtype name
    extra_axis: int | None  # trailing axis length for raw storage; None if none
    raw: bool  # recorded in __metadata__


def known_dtype_name(dtype: np.dtype) -> str | None:
    """The name under which `dtype` is in `KNOWN_DTYPES`, if it is (any byte order)."""
    known = KNOWN_DTYPES.get(dtype.name)
    if known is None:
        return None
    if known == dtype or (dtype.byteorder in "<>" and known == dtype.newbyteorder("=")):
        return dtype.name
    return None


def storage_of(name: str) -> Storage:
    st_name = _SAFETENSORS_NAMES.get(name)
    if st_name is not None:
        return Storage(st_name, None, raw=False)
    if name == "complex128":
        return Storage("F64", 2, raw=True)
    itemsize = KNOWN_DTYPES[name].itemsize
    return Storage("U8", itemsize if itemsize > 1 else None, raw=True)


def little_endian(dtype: np.dtype) -> np.dtype:
    # Only numpy's own multi-byte types have a byte order to choose; ml_dtypes are
    # native, which is little-endian on every platform JAX runs on.
    if (
        dtype.byteorder in "=<>"
        and dtype.itemsize > 1
        and dtype.name in _NUMPY_DTYPE_NAMES
    ):
        return dtype.newbyteorder("<")
    return dtype


def invalid_bytes_message(key: str, array: np.ndarray) -> str | None:
    """Why `array`'s bytes are no valid values of its dtype, if they are not.

    Only bool can be wrong in a way that goes unnoticed: numpy and XLA read a byte 2 as
    True in one operation and as 2 in another (`sum`), so such a file would load as
    silently wrong values.
    """
    if array.dtype != np.bool_ or array.size == 0:
        return None
    as_bytes = array.reshape(-1).view(np.uint8)
    bad = np.flatnonzero(as_bytes > 1)
    if not bad.size:
        return None
    return (
        f"{show(key)}: bool tensor holds bytes other than 0 and 1 ({bad.size} of "
        f"{array.size}; byte {int(as_bytes[bad[0]])} at element {int(bad[0])}). The "
        "file is corrupt; nothing was loaded"
    )
