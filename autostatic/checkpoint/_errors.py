"""The error of a file that is no valid checkpoint, and how its messages quote what a
file holds: key paths, dtypes and shapes, and values read from hostile files."""

from typing import Any

import numpy as np


class CheckpointError(ValueError):
    """A file that is not a valid checkpoint, or that does not match the template."""


def show(key: str) -> str:
    """A key path for a message: a file's keys can be any length, and hold what no
    terminal prints (a lone surrogate, valid in JSON, is escaped as `\\ud800`)."""
    if not key:
        return "<root>"  # the key path of a tree that is a single array
    key = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key if len(key) <= 200 else f"{key[:180]}...({len(key)} chars)"


def describe(dtype: np.dtype | str, shape: tuple[int, ...]) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


def clip(value: Any, limit: int = 100) -> str:
    """`repr(value)`, shortened: messages quote values read from hostile files."""
    text = repr(value).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"
