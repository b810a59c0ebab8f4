"""An opened vector file, whatever its format: the tensors it holds (names, dtypes, shapes), read on demand
as read-only float32 (or float64) arrays, and the error a file that cannot be read safely raises.

Every opener (:mod:`steerc.io.vectors` for safetensors, .npy and .pt; :mod:`steerc.io.controlvector` for
llama.cpp's GGUF) returns a :class:`VectorFile`.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
from attrs import frozen

from steerc.diagnostics.codes import INVALID_VECTOR_FILE

_ROW = re.compile(r"[0-9]{1,6}", re.ASCII)


class VectorFileError(Exception):
    """A file that cannot be read as vectors; ``code`` is a diagnostic code."""

    def __init__(self, code: str, message: str, help: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.help = help


@frozen
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]


class VectorFile:
    """An opened vector file: the tensors it holds, read on demand."""

    def __init__(self, path: str, kind: str, tensors: dict[str, TensorInfo], reader, metadata: dict | None = None):
        self.path = path
        self.kind = kind
        self.tensors = tensors
        self.metadata = metadata  # a safetensors file's string-to-string metadata, when it has one
        self._reader = reader
        self._cache: dict = {}  # name -> float32 array, ("f8", name) -> float64 array
        self._memo: dict = {}
        self._names: list[str] | None = None
        self._rows: dict[str, dict[int, str]] | None = None
        self.meta: dict = {}  # what a format says about the model (a control vector's hint and layer count)

    def memo(self, key, make):
        """``make()``, computed once per file and key (what many loads of one file share)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def names(self) -> list[str]:
        """The tensor names, sorted (computed once: a file may hold many, and be loaded many times)."""
        if self._names is None:
            self._names = sorted(self.tensors)
        return self._names

    def rows(self, key: str) -> dict[int, str]:
        """The per-layer rows ``<key>.<i>`` of a keyed bank: layer index -> tensor name.

        ``i`` is one to six ASCII digits (``bank.07`` is row 7); names are indexed once per file.
        """
        if self._rows is None:
            self._rows = {}
            for name in self.tensors:
                head, dot, tail = name.rpartition(".")
                if dot and _ROW.fullmatch(tail):
                    self._rows.setdefault(head, {})[int(tail)] = name
        return self._rows.get(key, {})

    def read64(self, name: str, before=None) -> np.ndarray:
        """The tensor ``name`` as a read-only float64 array, made once per file (loads share it).

        ``before(count)`` is called with its number of entries before it is first read.
        """
        key = ("f8", name)
        if key not in self._cache:
            if before is not None:
                before(math.prod(self.tensors[name].shape))
            arr = self.read(name).astype(np.float64)
            arr.setflags(write=False)
            self._cache[key] = arr
            self._cache.pop(name, None)  # keep one copy
        return self._cache[key]

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a read-only float32 array (finite values only)."""
        if name not in self._cache:
            arr = np.asarray(self._reader(name), dtype=np.float32)
            if not np.all(np.isfinite(arr)):
                raise VectorFileError(
                    INVALID_VECTOR_FILE,
                    f"tensor `{name or os.path.basename(self.path)}` holds NaN or infinite values",
                )
            arr.setflags(write=False)
            self._cache[name] = arr
        return self._cache[name]
