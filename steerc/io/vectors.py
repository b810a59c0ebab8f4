"""Reading steering vectors without ever executing a file.

``.safetensors`` files are read by hand: the JSON header first (keys, dtypes
and shapes are checked before any data is touched), then only the bytes of
the tensors asked for. ``.npy`` files go through ``numpy.load`` with
``allow_pickle=False``. ``.pt``/``.pth`` files load only through
``torch.load(weights_only=True)`` and only when torch is installed.
``.gguf`` files are llama.cpp control vectors, read by hand too
(:mod:`steerc.io.controlvector`, :mod:`steerc.io.gguf`). Any float dtype is
accepted (bf16 included) and read as float32.

The kinds of file are one table, :data:`READERS`: a :class:`Reader` per kind
(its name, the extensions that select it, its opener, one line saying what it
reads and how the "unknown format" help names it). :func:`open_vector_file`
dispatches through it and :data:`FORMATS` and that help are derived from it,
so a new source (an SAE folder, a BrainPatch archive) is one entry. Openers
import what is heavy (torch) only when their kind of file is read.

>>> import numpy as np, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "v.npy")
>>> np.save(path, np.arange(3, dtype=np.float16))
>>> f = open_vector_file(path)
>>> f.kind, f.tensors[""].shape
('npy', (3,))
>>> f.read("").dtype
dtype('float32')
>>> FORMATS
('.safetensors', '.npy', '.pt', '.pth', '.gguf')
"""

from __future__ import annotations

import os
import struct
from typing import Callable

import numpy as np
from attrs import frozen

from steerc.core.jsonio import JSONError
from steerc.core.jsonio import loads as loads_json
from steerc.core.limits import MAX_SAFETENSORS_HEADER
from steerc.diagnostics.codes import INVALID_VECTOR_FILE
from steerc.io.vectorfile import TensorInfo, VectorFile, VectorFileError

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
MAX_HEADER = MAX_SAFETENSORS_HEADER


@frozen
class Reader:
    """One kind of vector file: how it is recognised, opened and named to the user."""

    name: str  # the kind (VectorFile.kind of what it opens)
    extensions: tuple[str, ...]  # lower case, with the dot; a path whose extension is one of them is this kind
    open: Callable[[str], VectorFile]  # path -> VectorFile, or VectorFileError; never executes the file
    description: str  # one line: what it reads
    hint: str  # how "use ..." in the unknown-format help names it
    recognises: Callable[[str], bool] | None = None  # for sources no extension names (a folder, say)

    def accepts(self, path: str, ext: str) -> bool:
        return ext in self.extensions or (self.recognises is not None and self.recognises(path))


def _open_gguf(path: str) -> VectorFile:
    from steerc.io.controlvector import open_control_vector

    return open_control_vector(path)


def _readers() -> dict[str, Reader]:
    """The table, in the order the formats are listed to the user (the openers are defined below)."""
    return {r.name: r for r in (
        Reader("safetensors", (".safetensors",), _open_safetensors,
               "safetensors, read by hand: the header is checked before any data is touched", ".safetensors"),
        Reader("npy", (".npy",), _open_npy, "one NumPy array, read with allow_pickle=False", ".npy (no pickle)"),
        Reader("pt", (".pt", ".pth"), _open_torch, "a tensor or a dict of tensors, torch.load(weights_only=True)",
               "a .pt file saved with torch.save of tensors"),
        Reader("gguf", (".gguf",), _open_gguf, "a llama.cpp control vector, read by hand",
               "a llama.cpp control vector (.gguf)"),
    )}


def formats() -> tuple[str, ...]:
    """Every extension the table reads, in its order."""
    return tuple(ext for r in READERS.values() for ext in r.extensions)


def reader_for(path: str) -> Reader | None:
    """The table's entry for ``path``: the first whose extension or test accepts it."""
    ext = os.path.splitext(path)[1].lower()
    return next((r for r in READERS.values() if r.accepts(path, ext)), None)


def open_vector_file(path: str) -> VectorFile:
    reader = reader_for(path)
    if reader is not None:
        return reader.open(path)
    ext = os.path.splitext(path)[1].lower()
    hints = [r.hint for r in READERS.values()]
    raise VectorFileError(
        INVALID_VECTOR_FILE,
        f"unknown vector format `{ext or os.path.basename(path)}`",
        help="use " + (", ".join(hints[:-1]) + ", or " + hints[-1] if len(hints) > 1 else "".join(hints)),
    )


# ---------------------------------------------------------------- safetensors


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """(header, data_start) of a safetensors file, validated as the format requires.

    The header is a JSON object of at most MAX_SAFETENSORS_HEADER bytes starting
    with ``{``, with unique keys, an optional ``__metadata__`` mapping strings to
    strings, and one entry per tensor whose byte ranges tile the data that follows
    exactly: in order, from offset 0, without overlaps or holes, to the end of the file.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise _bad("file is too short to be safetensors")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise _bad("safetensors header length is out of range")
        blob = fh.read(n)
    if not blob.startswith(b"{"):
        raise _bad("safetensors header does not start with `{`")
    try:
        header = loads_json(blob, max_bytes=MAX_HEADER, unique_keys=True)
    except JSONError as exc:
        raise _bad(f"safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _bad("safetensors header is not a JSON object")
    if "__metadata__" in header:
        meta = header["__metadata__"]
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise _bad("safetensors `__metadata__` must map strings to strings")
    data_len = size - 8 - n
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = _check_entry(name, entry, data_len)
        ranges.append((begin, end, name))
    ranges.sort()
    expected = 0
    for begin, end, name in ranges:
        if begin < expected:
            raise _bad(f"safetensors entry `{name}` overlaps the tensor before it")
        if begin > expected:
            raise _bad(f"safetensors entry `{name}` leaves a hole of {begin - expected:,} bytes before it")
        expected = end
    if expected != data_len:
        raise _bad(f"the tensors of this safetensors file cover {expected:,} of its {data_len:,} data bytes")
    return header, 8 + n


def _bad(message: str) -> VectorFileError:
    return VectorFileError(INVALID_VECTOR_FILE, message)


def _check_entry(name: str, entry, data_len: int) -> tuple[int, int]:
    bad = VectorFileError(INVALID_VECTOR_FILE, f"safetensors entry `{name}` is malformed")
    if not isinstance(entry, dict):
        raise bad
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ST_ALL_DTYPES or not isinstance(shape, list) \
            or not isinstance(offsets, list):
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
    return begin, end


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
                INVALID_VECTOR_FILE,
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

    meta = header.get("__metadata__")
    meta = {k: v for k, v in meta.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(meta, dict) else None
    return VectorFile(path, "safetensors", tensors, reader, meta)


# ----------------------------------------------------------------------- npy


def _npy_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a .npy file's header, without reading its data."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(fh)
            else:  # 3.0 is written only for structured dtypes, never float arrays
                raise ValueError(f"format version {version[0]}.{version[1]}")
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds for malformed headers
        if isinstance(exc, ValueError) and "zip" in str(exc).lower():
            raise VectorFileError(INVALID_VECTOR_FILE, "a .npz archive is not a .npy file") from None
        raise VectorFileError(INVALID_VECTOR_FILE,
                              f"not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]})") from None
    return tuple(int(s) for s in shape), dtype


def _open_npy(path: str) -> VectorFile:
    with open(path, "rb") as fh:
        if fh.read(4) == b"PK\x03\x04":
            raise VectorFileError(INVALID_VECTOR_FILE, "a .npz archive is not a .npy file")
    shape, dtype = _npy_header(path)
    if dtype.hasobject:
        raise VectorFileError(
            INVALID_VECTOR_FILE,
            "this .npy file holds Python objects (it needs pickle, which steerc never uses)",
            help="save a plain float array: np.save(path, vector.astype(np.float32))",
        )
    if dtype.kind != "f":
        raise VectorFileError(
            INVALID_VECTOR_FILE, f"array has dtype {dtype}; steering vectors must be floating point"
        )
    info = TensorInfo("", str(dtype), shape)

    def reader(_name: str) -> np.ndarray:
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt body
            raise VectorFileError(INVALID_VECTOR_FILE,
                                  f"not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]})") from None
        if not isinstance(arr, np.ndarray) or arr.shape != shape:
            raise VectorFileError(INVALID_VECTOR_FILE, "not a readable .npy file")
        return arr

    return VectorFile(path, "npy", {"": info}, reader)


# ----------------------------------------------------------------------- torch


def _open_torch(path: str) -> VectorFile:
    try:
        import torch
    except ImportError:
        raise VectorFileError(
            INVALID_VECTOR_FILE,
            "reading a .pt file needs PyTorch, which is not installed",
            help="install steerc[hf], or convert the file to .safetensors",
        ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a weights-only load is the file's fault
        raise VectorFileError(
            INVALID_VECTOR_FILE,
            f"not loadable as weights only ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
            help="save tensors only (torch.save({'joy': tensor}, path)) or use .safetensors",
        ) from None
    if isinstance(obj, torch.Tensor):
        found = {"": obj}
    elif isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        found = dict(obj)
    else:
        raise VectorFileError(INVALID_VECTOR_FILE, "a .pt file must hold a tensor or a dict of named tensors")
    for name, t in found.items():
        if not t.is_floating_point():
            raise VectorFileError(INVALID_VECTOR_FILE, f"tensor `{name}` is not floating point")
    tensors = {name: TensorInfo(name, str(t.dtype), tuple(t.shape)) for name, t in found.items()}
    return VectorFile(path, "pt", tensors, lambda name: found[name].detach().float().numpy())


READERS: dict[str, Reader] = _readers()
FORMATS = formats()
