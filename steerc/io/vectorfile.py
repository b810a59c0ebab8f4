"""An opened vector file, whatever its format: the tensors it holds (names, dtypes, shapes), read on demand
as read-only float32 (or float64) arrays, and the error a file that cannot be read safely raises.

Every opener (:mod:`steerc.io.vectors` for safetensors, .npy and .pt; :mod:`steerc.io.controlvector` for
llama.cpp's GGUF) returns a :class:`VectorFile`. An opener gives a ``reader`` (a tensor's name -> its values
as a numpy array), or ``raw`` (a tensor's name -> its bytes and their format, one of
:data:`steerc.io.floats.FORMATS`), from which the file reads both numpy arrays and, for a check that wants
no numpy, :class:`~steerc.io.floats.Floats`. numpy is imported when an array is first made, not before.
"""

from __future__ import annotations

import math
import os
import re

from steerc.core.record import frozen
from steerc.diagnostics.codes import INVALID_VECTOR_FILE
from steerc.io import floats

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

    def __init__(self, path: str, kind: str, tensors: dict[str, TensorInfo], reader=None,
                 metadata: dict | None = None, raw=None):
        self.path = path
        self.kind = kind
        self.tensors = tensors
        self.metadata = metadata  # a safetensors file's string-to-string metadata, when it has one
        self._raw = raw  # name -> (bytes, format), or None: only the reader knows the values
        self._reader = reader if reader is not None else self._from_raw
        self._cache: dict = {}  # name -> float32 array, ("f8", name) -> float64 array, ("py", name) -> Floats
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

    def read64(self, name: str, before=None, python: bool = False):
        """The tensor ``name`` as read-only float64 values, made once per file (loads share them).

        A numpy array of the tensor's shape; with ``python``, :class:`~steerc.io.floats.Floats` of its
        entries in order (its rows one after another) when the format gives its bytes, read without numpy
        (else the numpy array). Either is made from the other when that was read first: the values are the
        same. ``before(count)`` is called with its number of entries before it is first read.
        """
        key, other = (("py", name), ("f8", name)) if python and self._raw is not None else \
            (("f8", name), ("py", name))
        if key in self._cache:
            return self._cache[key]
        if other in self._cache:
            if python:  # a numpy array was read first (the reader has no bytes to give)
                return self._cache[other]
            made = self._array64(self._cache[other], self.tensors[name].shape)
        else:
            if before is not None:
                before(math.prod(self.tensors[name].shape))
            made = self._python(name) if key[0] == "py" else self._array64(self.read(name))
            self._cache.pop(name, None)  # keep one copy
        self._cache[key] = made
        return made

    @staticmethod
    def _array64(values, shape=None):
        """A read-only float64 copy of ``values`` (in ``shape``: Floats are flat)."""
        import numpy as np

        arr = np.array(values, dtype=np.float64)
        if shape is not None:
            arr = arr.reshape(shape)
        arr.setflags(write=False)
        return arr

    def _python(self, name: str) -> floats.Floats:
        raw, fmt = self._raw(name)
        values = floats.decode(raw, fmt)
        if not floats.finite(values):
            raise self._not_finite(name)
        return values

    def read(self, name: str):
        """The tensor ``name`` as a read-only float32 numpy array (finite values only)."""
        if name not in self._cache:
            import numpy as np

            with np.errstate(over="ignore", invalid="ignore"):  # past float32 is inf, refused just below
                arr = np.asarray(self._reader(name), dtype=np.float32)
            if not np.all(np.isfinite(arr)):
                raise self._not_finite(name)
            arr.setflags(write=False)
            self._cache[name] = arr
        return self._cache[name]

    def _not_finite(self, name: str) -> VectorFileError:
        return VectorFileError(INVALID_VECTOR_FILE,
                               f"tensor `{name or os.path.basename(self.path)}` holds NaN or infinite values")

    def _from_raw(self, name: str):
        """The reader of a format that gives its bytes: numpy's reading of them, in the tensor's shape."""
        import numpy as np

        raw, fmt = self._raw(name)
        if fmt == "bf16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=fmt)
        return values.reshape(self.tensors[name].shape)
