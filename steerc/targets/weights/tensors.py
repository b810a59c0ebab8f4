"""safetensors read and written tensor by tensor, so that a model larger than memory folds in bounded memory.

Reading memory-maps each file and parses its header (8 bytes of little-endian header length, the JSON
header, then the data); a tensor the fold leaves alone is copied as its bytes, in blocks, bit for bit, and
never becomes a tensor. Writing streams each shard: its header first (names sorted, data contiguous in
that order, as the ``safetensors`` library lays them out), then each tensor's bytes. Shards follow
transformers' names and index (``model-00001-of-00002.safetensors``, ``model.safetensors.index.json``).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable

from steerc.core.record import frozen

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
COPY_BLOCK = 16 << 20
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
              "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class WeightsError(Exception):
    """A checkpoint the target cannot read (one line for the user), with its diagnostic code and help."""

    def __init__(self, message: str, code: str = "model-without-weights",
                 help: str = "give --model a folder of safetensors weights (as save_pretrained writes it) or a "
                             ".gguf"):
        super().__init__(message)
        self.code, self.help = code, help


@frozen
class Entry:
    name: str
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    path: str  # the file that holds it
    begin: int  # absolute offset of its data in that file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: str) -> tuple[dict, int]:
    """(the header's tensors, where the data starts) of one safetensors file."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise WeightsError(f"{path} is not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES:
            raise WeightsError(f"{path} is not a safetensors file (a header of {n:,} bytes)")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise WeightsError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path} is not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    return header, 8 + n


def entries(folder: str) -> dict[str, Entry]:
    """Every tensor of a model folder's safetensors (one file, or the shards its index names)."""
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise WeightsError(f"{index} is not a safetensors index (no weight_map)") from None
    elif os.path.isfile(os.path.join(folder, SINGLE)):
        files = [SINGLE]
    else:
        found = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        if not found:
            raise WeightsError(f"{folder} holds no safetensors weights (steerc reads no pickled .bin files)")
        files = found
    out: dict[str, Entry] = {}
    for name in files:
        path = os.path.join(folder, name)
        if os.path.basename(name) != name or not os.path.isfile(path):
            raise WeightsError(f"{index}: {name!r} is not a file of the folder")
        header, start = read_header(path)
        size = os.path.getsize(path)
        for tensor, info in header.items():
            try:
                dtype, shape, (a, b) = info["dtype"], tuple(int(x) for x in info["shape"]), info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise WeightsError(f"{path}: the header entry of {tensor!r} is malformed") from None
            if not (0 <= a <= b and start + b <= size):
                raise WeightsError(f"{path}: {tensor!r} lies outside the file")
            out[tensor] = Entry(tensor, dtype, shape, path, start + a, start + b)
    return out


class Reader:
    """The tensors of a folder, each memory-mapped on demand (one map per file, kept while reading)."""

    def __init__(self, folder: str):
        self.entries = entries(folder)
        self._maps: dict[str, mmap.mmap] = {}
        self._files: list = []

    def tensor(self, name: str):
        """A float tensor (a copy of the mapped bytes, in its own dtype)."""
        import torch

        e = self.entries[name]
        if e.dtype not in TORCH_DTYPES:
            raise WeightsError(f"{name} is {e.dtype}: the weights target folds float32, float16, bfloat16 and "
                               "float64 weights (a quantized checkpoint is dequantized first)")
        m = self._map(e.path)
        dtype = getattr(torch, TORCH_DTYPES[e.dtype])
        if e.nbytes == 0:
            return torch.zeros(e.shape, dtype=dtype)
        return torch.frombuffer(m, dtype=dtype, count=e.nbytes // ITEM_BYTES[e.dtype],
                                offset=e.begin).reshape(e.shape).clone()

    def copy(self, name: str, out) -> None:
        """Write the tensor's bytes to ``out`` as they are, in blocks."""
        e = self.entries[name]
        m = self._map(e.path)
        for a in range(e.begin, e.end, COPY_BLOCK):
            out.write(m[a:min(a + COPY_BLOCK, e.end)])

    def _map(self, path: str) -> mmap.mmap:
        if path not in self._maps:
            fh = open(path, "rb")
            self._files.append(fh)
            self._maps[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[path]

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        for fh in self._files:
            fh.close()
        self._maps, self._files = {}, []


@frozen
class Out:
    """One tensor to write: its header and how to write its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    write: Callable  # write(file) -> None


def tensor_out(name: str, tensor) -> Out:
    """An :class:`Out` of a torch tensor (its bytes in its dtype, row-major)."""
    import torch

    names = {v: k for k, v in TORCH_DTYPES.items()}
    dtype = names[str(tensor.dtype).removeprefix("torch.")]
    data = tensor.contiguous()
    nbytes = data.numel() * data.element_size()

    def write(fh):
        if nbytes:
            fh.write(data.view(torch.uint8).numpy().tobytes() if data.dim() else
                     data.reshape(1).view(torch.uint8).numpy().tobytes())

    return Out(name, dtype, tuple(data.shape), nbytes, write)


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def plan_shards(outs: list[Out], max_bytes: int) -> list[list[Out]]:
    """The tensors in name order, cut into shards of at most ``max_bytes`` of data (a larger tensor alone)."""
    shards: list[list[Out]] = [[]]
    size = 0
    for o in sorted(outs, key=lambda o: o.name):
        if shards[-1] and size + o.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(o)
        size += o.nbytes
    return shards


def header_bytes(outs: list[Out]) -> bytes:
    """The header of one file: the tensors in order, their data contiguous; padded with spaces to 8 bytes."""
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for o in outs:
        header[o.name] = {"dtype": o.dtype, "shape": list(o.shape), "data_offsets": [at, at + o.nbytes]}
        at += o.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_file(path: str, outs: list[Out]) -> None:
    """One safetensors file, written to a temporary name beside it and renamed into place."""
    import tempfile

    from steerc.core.paths import new_file_mode

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
    try:
        os.fchmod(fd, new_file_mode())  # as open() would make it: other users' servers read the folder
        with os.fdopen(fd, "wb") as fh:
            fh.write(header_bytes(outs))
            for o in outs:
                before = fh.tell()
                o.write(fh)
                if fh.tell() - before != o.nbytes:
                    raise WeightsError(f"{o.name}: wrote {fh.tell() - before} bytes of {o.nbytes}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def index_bytes(shards: list[list[Out]], names: list[str]) -> bytes:
    total = sum(o.nbytes for shard in shards for o in shard)
    weight_map = {o.name: name for shard, name in zip(shards, names) for o in shard}
    return (json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
            + "\n").encode("utf-8")
