"""GGUF, the container of llama.cpp's control vectors, read and written by hand.

Reading executes nothing and is bounded before work proportional to what
the file claims: the header is walked with every length checked against
the bytes left (an array of 2^60 items in a 100-byte file is refused at
once), within its first ``MAX_GGUF_HEADER_BYTES``, at most
``MAX_GGUF_STRINGS`` strings and ``MAX_GGUF_TENSORS`` tensor entries. The
rules are the ones ggml's own reader (``ggml/src/gguf.cpp``,
``gguf_init_from_file_impl``, llama.cpp ``0c1e570``) enforces: version 2
or 3, little-endian, unique non-empty keys, no arrays of arrays, a
``general.alignment`` that is a uint32 power of two, unique tensor names
shorter than 64 bytes, at most 4 dimensions, none negative, data laid out
in order from the aligned start of the data section, each tensor padded to
the alignment, the last one too (ggml reads the whole padded section). The
``gguf`` package's reader follows an array's count without checking it
against the file, so steerc does not use it on files it is given (the
tests use it, and its writer, as the reference).

Only F32 tensors have their data placed and read: a control vector holds
nothing else (llama.cpp refuses any other type), so other types are
described, with their positions unchecked, for the caller to refuse.

>>> import os, tempfile, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "x.gguf")
>>> with open(path, "wb") as fh:
...     _ = fh.write(gguf_bytes([("general.architecture", STRING, "controlvector")],
...                             [("direction.1", np.ones(4, dtype=np.float32))]))
>>> h = read_header(path)
>>> h.metadata["general.architecture"], [(t.name, t.type_name, t.shape) for t in h.tensors]
('controlvector', [('direction.1', 'F32', (4,))])
>>> read_floats(path, h.tensors[0]).tolist()
[1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import mmap
import os
import struct

from steerc.core.limits import MAX_GGUF_HEADER_BYTES, MAX_GGUF_STRINGS, MAX_GGUF_TENSORS
from steerc.core.record import frozen

MAGIC = b"GGUF"
VERSION = 3
ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_NAME_BYTES = 63  # ggml: a tensor name is shorter than GGML_MAX_NAME (64)
MAX_DIMS = 4  # GGML_MAX_DIMS

# Metadata value types (gguf_type).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
INTEGER_TYPES = frozenset({UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64})

# ggml tensor types: F32 (the one steerc reads and writes), and names for messages.
F32 = 0
TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
    12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}


class GGUFError(ValueError):
    """A file that is not a well-formed GGUF, or one over steerc's limits."""


class OtherArchitecture(GGUFError):
    """``general.architecture`` is not the one asked for; ``.arch`` is what the file says."""

    def __init__(self, arch: str):
        super().__init__(f"general.architecture is `{arch}`")
        self.arch = arch


@frozen
class GGUFArray:
    """An array value, described but not decoded (steerc needs none)."""

    item_type: int
    length: int


@frozen
class GGUFTensor:
    name: str
    type_id: int
    shape: tuple[int, ...]  # numpy order: ggml's ne reversed
    offset: int  # absolute position of the data in the file

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type_id, f"type {self.type_id}")


@frozen
class GGUFHeader:
    version: int
    metadata: dict  # key -> a str, int, float, bool or GGUFArray
    types: dict  # key -> its value type (UINT32, STRING, ...)
    tensors: tuple[GGUFTensor, ...]
    data_start: int
    alignment: int


# ---------------------------------------------------------------- reading


class _Cursor:
    """Bounded little-endian reads of a header; running past the file or the header limit is a GGUFError."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.at, self.strings = buf, size, 0, 0
        self.end = min(size, MAX_GGUF_HEADER_BYTES)

    def _past(self, what: str) -> GGUFError:
        if self.end < self.size:
            return GGUFError(f"{what} runs past the first {MAX_GGUF_HEADER_BYTES // (1 << 20)} MiB, where steerc "
                             "stops reading a GGUF header (a control vector's is a few hundred bytes)")
        return GGUFError(f"{what} runs past the end of the file (at byte {self.size:,})")

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.at + n > self.end:
            raise self._past("the header")
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += n
        return value

    def skip(self, n: int, what: str) -> None:
        if n > self.end - self.at:
            raise self._past(f"{what} ({n:,} bytes)")
        self.at += n

    def string(self, what: str, decode: bool = True):
        self.strings += 1
        if self.strings > MAX_GGUF_STRINGS:
            raise GGUFError(f"the header holds more than {MAX_GGUF_STRINGS:,} strings (a control vector holds a few)")
        n = self.take("<Q")
        start = self.at
        self.skip(n, what)
        if not decode:
            return None
        try:
            return bytes(self.buf[start:self.at]).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} is not UTF-8") from None


def read_header(path: str, expect_arch: str | None = None) -> GGUFHeader:
    """The metadata and tensor entries of a GGUF file, checked as ggml checks them.

    With ``expect_arch``, reading stops at a ``general.architecture`` that names
    another (:class:`OtherArchitecture`): a model's tokenizer is never walked.
    """
    size = os.path.getsize(path)
    if size < 24:
        raise GGUFError("the file is too short to be GGUF")
    with open(path, "rb") as fh:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, size), expect_arch)


def _parse(cur: _Cursor, expect_arch: str | None) -> GGUFHeader:
    if bytes(cur.buf[:4]) != MAGIC:
        raise GGUFError("it does not start with the GGUF magic bytes")
    cur.at = 4
    version = cur.take("<I")
    if version & 0xFFFF == 0:
        raise GGUFError("it is a big-endian GGUF (llama.cpp and steerc read little-endian ones)")
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} (llama.cpp reads versions 2 and 3)")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    if n_tensors > MAX_GGUF_TENSORS:
        raise GGUFError(f"it claims {n_tensors:,} tensors (steerc reads at most {MAX_GGUF_TENSORS:,})")
    metadata, types = _metadata(cur, n_kv, expect_arch)
    alignment = metadata.get("general.alignment", ALIGNMENT)
    if "general.alignment" in metadata and (types["general.alignment"] != UINT32 or alignment <= 0
                                            or alignment & (alignment - 1)):
        raise GGUFError("general.alignment must be a uint32 power of two")
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = _pad(cur.at, alignment)
    tensors = tuple(_place(infos, data_start, alignment, cur.size))
    return GGUFHeader(version, metadata, types, tensors, data_start, alignment)


def _metadata(cur: _Cursor, n_kv: int, expect_arch: str | None) -> tuple[dict, dict]:
    out: dict = {}
    types: dict = {}
    for i in range(n_kv):  # each pair takes at least 13 bytes: the cursor ends a false count
        key = cur.string(f"metadata key {i}")
        if not key:
            raise GGUFError(f"metadata key {i} is empty")
        if key in out:
            raise GGUFError(f"metadata key `{key}` is given twice")
        types[key] = vtype = cur.take("<I")
        out[key] = _array(cur, key) if vtype == ARRAY else _value(cur, vtype, key)
        if key == "general.architecture" and expect_arch is not None:
            if vtype != STRING:
                raise GGUFError("general.architecture is not a string")
            if out[key] != expect_arch:
                raise OtherArchitecture(out[key])
    return out, types


def _value(cur: _Cursor, vtype: int, key: str):
    if vtype == STRING:
        return cur.string(f"the value of `{key}`")
    fmt = _SCALAR.get(vtype)
    if fmt is None:
        raise GGUFError(f"metadata key `{key}` has the unknown value type {vtype}")
    value = cur.take(fmt)
    return bool(value) if vtype == BOOL else value


def _array(cur: _Cursor, key: str) -> GGUFArray:
    item, n = cur.take("<I"), cur.take("<Q")
    if item == STRING:
        if n * 8 > cur.size - cur.at:  # every string has an 8-byte length
            raise GGUFError(f"the array `{key}` claims {n:,} strings, more than the file can hold")
        for j in range(n):
            cur.string(f"item {j} of `{key}`", decode=False)
    elif item in _SCALAR:
        cur.skip(n * struct.calcsize(_SCALAR[item]), f"the array `{key}`")
    else:  # ggml refuses arrays of arrays and unknown types
        raise GGUFError(f"the array `{key}` has items of type {item}, which GGUF arrays cannot hold")
    return GGUFArray(item, n)


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, int, tuple[int, ...], int]:
    name = cur.string(f"the name of tensor {i}")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise GGUFError(f"tensor {i}'s name is longer than {MAX_NAME_BYTES} bytes")
    n_dims = cur.take("<I")
    if n_dims > MAX_DIMS:
        raise GGUFError(f"tensor `{name}` has {n_dims:,} dimensions (GGUF allows {MAX_DIMS})")
    ne = [cur.take("<q") for _ in range(n_dims)]
    if any(n < 0 for n in ne):
        raise GGUFError(f"tensor `{name}` has a negative dimension")
    type_id = cur.take("<I")
    offset = cur.take("<Q")
    return name, type_id, tuple(reversed(ne)), offset


def _place(infos, data_start: int, alignment: int, size: int) -> list[GGUFTensor]:
    """The tensors, with their data checked to lie in order, aligned and padded, inside the file (as ggml
    requires). From the first tensor that is not F32 on, positions are left unchecked (see above)."""
    seen: set[str] = set()
    out = []
    expected = 0
    for name, type_id, shape, offset in infos:
        if name in seen:
            raise GGUFError(f"tensor `{name}` is given twice")
        seen.add(name)
        out.append(GGUFTensor(name, type_id, shape, data_start + offset))
        if type_id != F32 or expected is None:
            expected = None
            continue
        if offset != expected:
            raise GGUFError(f"tensor `{name}` starts at data offset {offset:,}, not at {expected:,}")
        expected = offset + _pad(_count(shape) * 4, alignment)
        if data_start + expected > size:
            raise GGUFError(f"the data of tensor `{name}` runs past the end of the file")
    return out


def _count(shape) -> int:
    n = 1
    for s in shape:  # Python ints: no overflow
        n *= s
    return n


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def read_bytes(path: str, tensor: GGUFTensor) -> bytes:
    """An F32 tensor's data, little-endian float32 (placed by :func:`read_header`; a file changed since is a
    GGUFError)."""
    if tensor.type_id != F32:
        raise GGUFError(f"tensor `{tensor.name}` is {tensor.type_name}, not F32")
    count = _count(tensor.shape)
    with open(path, "rb") as fh:
        fh.seek(tensor.offset)
        raw = fh.read(count * 4)
    if len(raw) != count * 4:
        raise GGUFError(f"the data of tensor `{tensor.name}` runs past the end of the file")
    return raw


def read_floats(path: str, tensor: GGUFTensor):
    """An F32 tensor's values as a numpy array, shaped (see :func:`read_bytes`)."""
    import numpy as np

    return np.frombuffer(read_bytes(path, tensor), dtype="<f4").reshape(tensor.shape)


# ---------------------------------------------------------------- writing


def _pack_string(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _pack_value(vtype: int, value) -> bytes:
    if vtype == STRING:
        return _pack_string(value)
    return struct.pack(_SCALAR[vtype], value)


def gguf_bytes(metadata, tensors) -> bytes:
    """A GGUF v3 file: ``metadata`` as (key, type, value), ``tensors`` as (name, float32 array).

    The layout is the ``gguf`` package's ``GGUFWriter`` (and ggml's
    ``gguf_write_to_file``): the header, the key-value pairs in order, the
    tensor entries, padding to 32 bytes, then each tensor's little-endian data
    padded to 32 bytes. The same arguments give the same bytes.
    """
    import numpy as np

    out = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(tensors), len(metadata)))
    for key, vtype, value in metadata:
        out += _pack_string(key) + struct.pack("<I", vtype) + _pack_value(vtype, value)
    blobs = []
    offset = 0
    for name, array in tensors:
        data = np.ascontiguousarray(array, dtype="<f4")
        out += _pack_string(name) + struct.pack("<I", data.ndim)
        out += b"".join(struct.pack("<Q", n) for n in reversed(data.shape))
        out += struct.pack("<IQ", F32, offset)
        blob = data.tobytes()
        blobs.append(blob + bytes(_pad(len(blob), ALIGNMENT) - len(blob)))
        offset += len(blobs[-1])
    out += bytes(_pad(len(out), ALIGNMENT) - len(out))
    return bytes(out) + b"".join(blobs)
