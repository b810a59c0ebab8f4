"""Control-vector GGUF files for the tests, written the way their real writers write them.

* :func:`write_cvector_generator` — llama.cpp's ``tools/cvector-generator``
  (``export_gguf``, llama.cpp 0c1e570): ``general.architecture =
  controlvector``, ``controlvector.model_hint`` = the model GGUF's
  ``general.architecture`` (llama.cpp's name), ``controlvector.layer_count``
  an int32 = ``n_layer - 1``, then ``direction.1`` .. ``direction.(n_layer -
  1)``, F32 vectors of ``n_embd``, in that order. It reads layer ``i``'s
  output (``l_out-i``) for ``direction.(i+1)``; llama.cpp adds
  ``direction.N`` to layer ``N``'s output.
* :func:`write_repeng` — repeng's ``ControlVector.export_gguf``
  (``repeng/extract.py``): ``gguf.GGUFWriter(path, "controlvector")``,
  ``model_hint`` = the HF ``model_type``, ``layer_count`` a uint32 = the
  number of directions, ``direction.{layer}`` in the dict's order (its
  ``read_representations`` makes ``n_layer - 1`` down to 1), each the
  0-based decoder layer whose output it was read from and is added to.
* :func:`raw_gguf` — any bytes, for what no writer would write.

The ``gguf`` package's writer lays files out as ggml's ``gguf_write_to_file``
does (header, key-value pairs, tensor entries, 32-byte alignment, padded
data), so both writers' files come out of it.
"""

from __future__ import annotations

import struct

import numpy as np

STRING, UINT32, INT32, ARRAY = 8, 4, 5, 9
WIDTH = 64


def _writer(path: str, hint: str):
    import gguf

    w = gguf.GGUFWriter(path, "controlvector")
    w.add_string("controlvector.model_hint", hint)
    return w


def _close(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def directions(n_layer: int, n_embd: int, seed: int = 0) -> dict[int, np.ndarray]:
    """Seeded float32 directions for layers 1 .. n_layer - 1 (every layer llama.cpp steers)."""
    rng = np.random.default_rng(seed)
    return {layer: rng.normal(0.0, 1.0, n_embd).astype(np.float32) for layer in range(1, n_layer)}


def write_cvector_generator(path: str, dirs: dict[int, np.ndarray], arch: str = "llama") -> None:
    w = _writer(path, arch)
    w.add_int32("controlvector.layer_count", len(dirs))
    for layer in sorted(dirs):
        w.add_tensor(f"direction.{layer}", dirs[layer])
    _close(w)


def write_repeng(path: str, dirs: dict[int, np.ndarray], model_type: str = "llama") -> None:
    w = _writer(path, model_type)
    w.add_uint32("controlvector.layer_count", len(dirs))
    for layer in sorted(dirs, reverse=True):  # read_representations: range(-1, -n_layer, -1)
        w.add_tensor(f"direction.{layer}", dirs[layer])
    _close(w)


def pack_string(s: str | bytes) -> bytes:
    data = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(data)) + data


def kv_string(key: str, value: str) -> tuple[str, int, bytes]:
    return key, STRING, pack_string(value)


def kv(key: str, vtype: int, fmt: str, value) -> tuple[str, int, bytes]:
    return key, vtype, struct.pack(fmt, value)


def raw_gguf(kvs=(), tensors=(), data: bytes = b"", *, version: int = 3, magic: bytes = b"GGUF",
             n_tensors: int | None = None, n_kv: int | None = None, align: int = 32) -> bytes:
    """A GGUF from parts: ``kvs`` as (key, type, packed value), ``tensors`` as (name, ne, type, offset)
    with ``ne`` in ggml order, ``data`` placed at the aligned end of the header. Counts may lie."""
    out = bytearray(magic + struct.pack("<I", version))
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    for key, vtype, value in kvs:
        out += pack_string(key) + struct.pack("<I", vtype) + value
    for name, ne, ttype, offset in tensors:
        out += pack_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", n) for n in ne)
        out += struct.pack("<IQ", ttype, offset)
    out += bytes(-len(out) % align)
    return bytes(out) + data


def cv_kvs(hint: str = "llama", count: int | None = 1) -> list:
    """The metadata of a control vector: architecture, hint, and (unless None) an int32 layer count."""
    out = [kv_string("general.architecture", "controlvector"), kv_string("controlvector.model_hint", hint)]
    if count is not None:
        out.append(kv("controlvector.layer_count", INT32, "<i", count))
    return out


def f32(n: int, value: float = 0.5) -> bytes:
    """``n`` float32 values, padded to 32 bytes (one tensor's data)."""
    data = np.full(n, value, dtype="<f4").tobytes()
    return data + bytes(-len(data) % 32)


def vector_file(name: str = "direction.1", ne=(WIDTH,), ttype: int = 0, hint: str = "llama", count=1) -> bytes:
    return raw_gguf(cv_kvs(hint, count), [(name, list(ne), ttype, 0)], f32(min(max(int(np.prod(ne)), 0), WIDTH)))


HUGE = 2 ** 63 - 1
# Files steerc refuses (`invalid-vector-file`): name -> (bytes, what steerc's message says). Their
# control vectors are WIDTH wide; tests/llamacpp says which of them llama.cpp loads nonetheless.
HOSTILE = {
    "empty": (b"", "too short"),
    "zeros": (bytes(64), "magic"),
    "big_endian": (vector_file()[:4] + struct.pack(">I", 3) + vector_file()[8:], "big-endian"),
    "version_1": (raw_gguf(cv_kvs(), version=1), "version 1"),
    "version_4": (raw_gguf(cv_kvs(), version=4), "version 4"),
    "huge_tensor_count": (raw_gguf(cv_kvs(), n_tensors=HUGE), "tensors"),
    "huge_kv_count": (raw_gguf(cv_kvs(), n_kv=HUGE), "metadata key 3 is empty"),  # it reads on into the padding
    "huge_string": (raw_gguf([("general.architecture", STRING, struct.pack("<Q", HUGE) + b"x")]), "past the end"),
    "huge_array": (raw_gguf([("a", 9, struct.pack("<IQ", 0, HUGE))]), "past the end"),
    "huge_string_array": (raw_gguf([("a", 9, struct.pack("<IQ", STRING, 2 ** 40))]), "strings"),
    "array_of_arrays": (raw_gguf([("a", 9, struct.pack("<IQ", 9, 1))]), "type 9"),
    "unknown_value_type": (raw_gguf([("a", 99, b"")]), "value type 99"),
    "empty_key": (raw_gguf([("", UINT32, struct.pack("<I", 1))]), "empty"),
    "duplicate_key": (raw_gguf(cv_kvs() + [kv_string("controlvector.model_hint", "llama")]), "twice"),
    "not_utf8_key": (raw_gguf([(b"\xff\xfe", UINT32, struct.pack("<I", 1))]), "UTF-8"),
    "architecture_not_a_string": (raw_gguf([kv("general.architecture", UINT32, "<I", 7)]), "not a string"),
    "hint_not_a_string": (raw_gguf([kv_string("general.architecture", "controlvector"),
                                    kv("controlvector.model_hint", UINT32, "<I", 7)],
                                   [("direction.1", [WIDTH], 0, 0)], f32(WIDTH)), "model_hint` must be a string"),
    "count_not_an_integer": (raw_gguf(cv_kvs(count=None) + [kv_string("controlvector.layer_count", "1")],
                                      [("direction.1", [WIDTH], 0, 0)], f32(WIDTH)), "must be an integer"),
    "count_not_the_directions": (vector_file(count=3), "holds 1 directions"),
    "alignment_not_uint32": (raw_gguf(cv_kvs() + [kv_string("general.alignment", "32")]), "alignment"),
    "alignment_not_a_power_of_two": (raw_gguf(cv_kvs() + [kv("general.alignment", UINT32, "<I", 24)]), "alignment"),
    "too_many_dims": (vector_file(ne=(WIDTH, 1, 1, 1, 1)), "dimensions"),
    "negative_dim": (vector_file(ne=(-1,)), "negative"),
    "huge_dim": (vector_file(ne=(2 ** 62,)), "past the end"),
    "long_name": (vector_file(name="direction." + "1" * 60), "longer than 63"),
    "duplicate_tensor": (raw_gguf(cv_kvs(count=2), [("direction.1", [WIDTH], 0, 0), ("direction.1", [WIDTH], 0, 256)],
                                  f32(WIDTH) * 2), "given twice"),
    "offset_hole": (raw_gguf(cv_kvs(), [("direction.1", [WIDTH], 0, 32)], f32(WIDTH + 8)), "data offset 32"),
    "data_past_end": (raw_gguf(cv_kvs(), [("direction.1", [WIDTH], 0, 0)], f32(WIDTH)[:-40]), "past the end"),
    "f16": (vector_file(ttype=1), "is F16"),
    "q4_0": (vector_file(ttype=2), "is Q4_0"),
    "unknown_type": (vector_file(ttype=999), "type 999"),
    "direction_0": (vector_file(name="direction.0"), "layer 0"),
    "two_names_one_layer": (raw_gguf(cv_kvs(count=2), [("direction.1", [WIDTH], 0, 0), ("direction.01", [WIDTH], 0, 256)],
                                     f32(WIDTH) * 2), "both for layer 1"),
    "not_a_direction": (vector_file(name="token_embd.weight"), "not a direction"),
    "stoi_reads_loosely": (vector_file(name="direction.1x"), "not a direction"),
    "signed_layer": (vector_file(name="direction.+1"), "not a direction"),
    "no_layer_a_model_has": (vector_file(name="direction.999999"), "no model"),
    "two_dimensional": (vector_file(ne=(1, WIDTH)), "one vector"),
    "scalar": (vector_file(ne=()), "one vector"),
    "lengths_differ": (raw_gguf(cv_kvs(count=2), [("direction.1", [WIDTH], 0, 0), ("direction.2", [8], 0, 256)],
                                f32(WIDTH) + f32(8)), "different lengths"),
    "empty_directions": (vector_file(ne=(0,)), "empty"),
    "no_directions": (raw_gguf(cv_kvs(count=0)), "no `direction.<layer>`"),
    "nan": (raw_gguf(cv_kvs(), [("direction.1", [WIDTH], 0, 0)], f32(WIDTH, float("nan"))), "NaN"),
    "other_architecture": (raw_gguf([kv_string("general.architecture", "llama")]), "`llama` model"),
}
