"""Reading steering vectors without ever executing a file.

``.safetensors`` files are read by hand: the JSON header first (keys, dtypes
and shapes are checked before any data is touched), then only the bytes of
the tensors asked for. ``.npy`` files go through ``numpy.load`` with
``allow_pickle=False``. ``.pt``/``.pth`` files load only through
``torch.load(weights_only=True)`` and only when torch is installed. Any
float dtype is accepted (bf16 included) and read as float32.

>>> import numpy as np, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "v.npy")
>>> np.save(path, np.arange(3, dtype=np.float16))
>>> f = open_vector_file(path)
>>> f.kind, f.tensors[""].shape
('npy', (3,))
>>> f.read("").dtype
dtype('float32')
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
from attrs import frozen

_ST_DTYPES = {
    "F16": ("<f2", 2),
    "BF16": (None, 2),
    "F32": ("<f4", 4),
    "F64": ("<f8", 8),
}
_ST_ALL_DTYPES = {
    "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
    "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1,
}
MAX_HEADER = 100 * 1024 * 1024
FORMATS = (".safetensors", ".npy", ".pt", ".pth")


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

    def __init__(self, path: str, kind: str, tensors: dict[str, TensorInfo], reader):
        self.path = path
        self.kind = kind
        self.tensors = tensors
        self._reader = reader
        self._cache: dict[str, np.ndarray] = {}

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a read-only float32 array (finite values only)."""
        if name not in self._cache:
            arr = np.asarray(self._reader(name), dtype=np.float32)
            if not np.all(np.isfinite(arr)):
                raise VectorFileError(
                    "invalid-vector-file",
                    f"tensor `{name or os.path.basename(self.path)}` holds NaN or infinite values",
                )
            arr.setflags(write=False)
            self._cache[name] = arr
        return self._cache[name]


def open_vector_file(path: str) -> VectorFile:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".safetensors":
        return _open_safetensors(path)
    if ext == ".npy":
        return _open_npy(path)
    if ext in (".pt", ".pth"):
        return _open_torch(path)
    raise VectorFileError(
        "invalid-vector-file",
        f"unknown vector format `{ext or os.path.basename(path)}`",
        help="use .safetensors, .npy (no pickle) or a .pt file saved with torch.save of tensors",
    )


# ---------------------------------------------------------------- safetensors


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """(header, data_start) of a safetensors file, validated."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise VectorFileError("invalid-vector-file", "file is too short to be safetensors")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise VectorFileError("invalid-vector-file", "safetensors header length is out of range")
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VectorFileError("invalid-vector-file", f"safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise VectorFileError("invalid-vector-file", "safetensors header is not a JSON object")
    data_len = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        _check_entry(name, entry, data_len)
    return header, 8 + n


def _check_entry(name: str, entry, data_len: int) -> None:
    bad = VectorFileError("invalid-vector-file", f"safetensors entry `{name}` is malformed")
    if not isinstance(entry, dict):
        raise bad
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ST_ALL_DTYPES or not isinstance(shape, list) or not isinstance(offsets, list):
        raise bad
    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not all(is_int(s) and s >= 0 for s in shape) or len(offsets) != 2:
        raise bad
    begin, end = offsets
    if not (is_int(begin) and is_int(end) and 0 <= begin <= end <= data_len):
        raise bad
    count = 1
    for s in shape:  # Python ints: no overflow
        count *= s
    if end - begin != count * _ST_ALL_DTYPES[dtype]:
        raise bad


def _open_safetensors(path: str) -> VectorFile:
    header, data_start = read_safetensors_header(path)
    tensors = {
        name: TensorInfo(name, e["dtype"], tuple(e["shape"]))
        for name, e in header.items()
        if name != "__metadata__"
    }

    def reader(name: str) -> np.ndarray:
        entry = header[name]
        dtype = entry["dtype"]
        if dtype not in _ST_DTYPES:
            raise VectorFileError(
                "invalid-vector-file",
                f"tensor `{name}` has dtype {dtype}; steering vectors must be floating point",
            )
        begin, end = entry["data_offsets"]
        with open(path, "rb") as fh:
            fh.seek(data_start + begin)
            raw = fh.read(end - begin)
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_ST_DTYPES[dtype][0])
        return arr.reshape(entry["shape"])

    return VectorFile(path, "safetensors", tensors, reader)


# ----------------------------------------------------------------------- npy


def _open_npy(path: str) -> VectorFile:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as exc:
        msg = str(exc)
        if "pickle" in msg.lower() or "object" in msg.lower():
            raise VectorFileError(
                "invalid-vector-file",
                "this .npy file holds Python objects (it needs pickle, which steerc never uses)",
                help="save a plain float array: np.save(path, vector.astype(np.float32))",
            ) from None
        raise VectorFileError("invalid-vector-file", f"not a readable .npy file ({msg})") from None
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds for malformed headers
        raise VectorFileError("invalid-vector-file",
                              f"not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(arr, np.ndarray):
        raise VectorFileError("invalid-vector-file", "a .npz archive is not a .npy file")
    if arr.dtype.kind != "f":
        raise VectorFileError(
            "invalid-vector-file", f"array has dtype {arr.dtype}; steering vectors must be floating point"
        )
    info = TensorInfo("", str(arr.dtype), tuple(int(s) for s in arr.shape))
    return VectorFile(path, "npy", {"": info}, lambda _name: arr)


# ----------------------------------------------------------------------- torch


def _open_torch(path: str) -> VectorFile:
    try:
        import torch
    except ImportError:
        raise VectorFileError(
            "invalid-vector-file",
            "reading a .pt file needs PyTorch, which is not installed",
            help="install steerc[hf], or convert the file to .safetensors",
        ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a weights-only load is the file's fault
        raise VectorFileError(
            "invalid-vector-file",
            f"not loadable as weights only ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
            help="save tensors only (torch.save({'joy': tensor}, path)) or use .safetensors",
        ) from None
    if isinstance(obj, torch.Tensor):
        found = {"": obj}
    elif isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        found = dict(obj)
    else:
        raise VectorFileError("invalid-vector-file", "a .pt file must hold a tensor or a dict of named tensors")
    for name, t in found.items():
        if not t.is_floating_point():
            raise VectorFileError("invalid-vector-file", f"tensor `{name}` is not floating point")
    tensors = {name: TensorInfo(name, str(t.dtype), tuple(t.shape)) for name, t in found.items()}
    return VectorFile(path, "pt", tensors, lambda name: found[name].detach().float().numpy())
