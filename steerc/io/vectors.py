"""Reading steering vectors without ever executing a file.

``.safetensors`` files are read by hand: the JSON header first (keys, dtypes
and shapes are checked before any data is touched), then only the bytes of
the tensors asked for. ``.npy`` files go through ``numpy.load`` with
``allow_pickle=False``, but for a plain float array, whose header and data
are read by hand. ``.pt``/``.pth`` files load only through
``torch.load(weights_only=True)`` and only when torch is installed.
``.gguf`` files are llama.cpp control vectors, read by hand too
(:mod:`steerc.io.controlvector`, :mod:`steerc.io.gguf`). Any float dtype is
accepted (bf16 included) and read as float32.

The kinds of file are one table, :data:`READERS`: a :class:`Reader` per kind
(its name, the extensions that select it, its opener, one line saying what it
reads and how the "unknown format" help names it). :func:`open_vector_file`
dispatches through it and :data:`FORMATS` and that help are derived from it,
so a new source (an SAE folder, a BrainPatch archive) is one entry. Openers
import what is heavy only when their kind of file is read: torch for ``.pt``,
numpy for a ``.npy`` that is not a plain float array; safetensors, GGUF and
plain ``.npy`` files hand over their tensors' bytes (``VectorFile(raw=...)``),
which ``steerc check`` reads without numpy.

>>> import numpy as np, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "v.npy")
>>> np.save(path, np.arange(3, dtype=np.float16))
>>> f = open_vector_file(path)
>>> f.kind, f.tensors[""].shape
('npy', (3,))
>>> f.read("").dtype
dtype('float32')
>>> FORMATS
('.safetensors', '.npy', '.pt', '.pth', '.gguf', '.brainpatch')
"""

from __future__ import annotations

import math
import os
import struct
import sys
from typing import Callable

from steerc.core.jsonio import JSONError
from steerc.core.jsonio import loads as loads_json
from steerc.core.limits import MAX_SAFETENSORS_HEADER
from steerc.core.record import frozen
from steerc.diagnostics.codes import INVALID_VECTOR_FILE
from steerc.io.vectorfile import TensorInfo, VectorFile, VectorFileError

_ST_DTYPES = {"F16": "<f2", "BF16": "bf16", "F32": "<f4", "F64": "<f8"}  # the float dtypes, as byte formats
SAFETENSORS_FLOATS = _ST_DTYPES  # the same, for the readers that seek into a safetensors file (steerc.io.sae)
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


def _open_brainpatch(path: str) -> VectorFile:
    from steerc.io.brainpatch import open_brainpatch

    return open_brainpatch(path)


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
        Reader("brainpatch", (".brainpatch",), _open_brainpatch,
               "a BrainPatch archive's vectors, by key (the archive checked whole: members, checksums, manifest)",
               "a BrainPatch archive (.brainpatch)"),
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

    def raw(name: str) -> tuple[bytes, str]:
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
            data = fh.read(end - begin)
        if len(data) != end - begin:  # the file was cut short since its header was read
            raise VectorFileError(INVALID_VECTOR_FILE, f"the data of tensor `{name}` runs past the end of the file")
        return data, _ST_DTYPES[dtype]

    meta = header.get("__metadata__")
    meta = {k: v for k, v in meta.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(meta, dict) else None
    return VectorFile(path, "safetensors", tensors, metadata=meta, raw=raw)


# ----------------------------------------------------------------------- npy


def _npy_header(path: str) -> tuple:
    """(shape, dtype) from a .npy file's header, without reading its data."""
    import numpy as np

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


_NPY_MAGIC = b"\x93NUMPY"
_NPY_FLOATS = {"f2": "float16", "f4": "float32", "f8": "float64"}
_NPY_MAX_HEADER = 10_000  # numpy's limit on a header it reads without allow_pickle


def _npy_plain(path: str) -> tuple[tuple[int, ...], str, int] | None:
    """(shape, byte format, data offset) of a .npy file that is a plain float array, read without numpy;
    None for any other (numpy then reads its header, and says what is wrong with it).

    Plain: format version 1.0 or 2.0, a header of at most 10,000 characters that is a dict literal of
    exactly ``descr``, ``fortran_order`` and ``shape``, a little- or big-endian float16, float32 or
    float64 ``descr``, a shape of non-negative ints, in C order unless it has at most one dimension.
    numpy reads every such file, and reads it the same way.
    """
    import ast

    with open(path, "rb") as fh:
        head = fh.read(12)
        if head[:6] != _NPY_MAGIC or head[6:8] not in (b"\x01\x00", b"\x02\x00"):
            return None
        length = "<H" if head[6] == 1 else "<I"  # the header's length, after the magic and the version
        start = 8 + struct.calcsize(length)
        if len(head) < start:
            return None
        (size,) = struct.unpack_from(length, head, 8)
        if size > _NPY_MAX_HEADER:
            return None
        fh.seek(start)
        text = fh.read(size)
    if len(text) != size:
        return None
    try:
        d = ast.literal_eval(text.decode("latin1"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        return None
    descr, fortran, shape = d["descr"], d["fortran_order"], d["shape"]
    if not isinstance(descr, str) or len(descr) != 3 or descr[0] not in "<>" or descr[1:] not in _NPY_FLOATS \
            or not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape) \
            or fortran not in (False, True) or (fortran and len(shape) > 1):
        return None
    return shape, descr, start + size


def _npy_dtype_name(fmt: str) -> str:
    """numpy's name of a float format: ``float32``, or ``>f4`` when it is not this machine's byte order."""
    native = "<" if sys.byteorder == "little" else ">"
    return _NPY_FLOATS[fmt[1:]] if fmt[0] == native else fmt


def _open_npy(path: str) -> VectorFile:
    with open(path, "rb") as fh:
        if fh.read(4) == b"PK\x03\x04":
            raise VectorFileError(INVALID_VECTOR_FILE, "a .npz archive is not a .npy file")
    plain = _npy_plain(path)
    if plain is None:
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
    else:
        shape, fmt, offset = plain
        info = TensorInfo("", _npy_dtype_name(fmt), shape)

    def reader(_name: str):
        import numpy as np

        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt body
            raise VectorFileError(INVALID_VECTOR_FILE,
                                  f"not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]})") from None
        if not isinstance(arr, np.ndarray) or arr.shape != shape:
            raise VectorFileError(INVALID_VECTOR_FILE, "not a readable .npy file")
        return arr

    def raw(name: str) -> tuple[bytes, str]:
        size = math.prod(shape) * int(fmt[2])
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:  # a truncated body: numpy's reading says how, as without this path
            reader(name)
            raise VectorFileError(INVALID_VECTOR_FILE, "not a readable .npy file")
        return data, fmt

    return VectorFile(path, "npy", {"": info}, reader, raw=raw if plain is not None else None)


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
