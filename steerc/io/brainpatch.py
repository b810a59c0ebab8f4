"""BrainPatch archives (``.brainpatch``, BrainPatch 1.2's format 1.0), read as hostile input and written as
BrainPatch's own ``save_patch`` writes them.

A ``.brainpatch`` is a ZIP of exactly ``manifest.json``, ``vectors.safetensors``, ``checksums.json`` and an
optional ``README.md`` (``brainpatch/patch/format.py`` and ``patch/loader.py`` of brainpatch 1.2.0).
:func:`read_archive` checks, before it decompresses anything: every member's name (no absolute path, no
``..``, no backslash or drive letter, no name given twice, no member outside that set, no folder entry),
its kind (no link, no special file, nothing encrypted), its method (stored or DEFLATE), its size (at most
256 MiB a member, 512 MiB in all) and its compression ratio (at most 200) — BrainPatch's bounds —; then
reads each member (at most its declared size, CRC checked), verifies ``checksums.json`` (the sha256 of
every other member), and checks the manifest field by field against BrainPatch's schema, strictly typed
(where BrainPatch's ``int()`` would read ``"layer": 3.7`` as 3, steerc refuses it). The vectors are read
by hand (the safetensors rules of :mod:`steerc.io.vectors`, BrainPatch's four float dtypes, 1-D of
``hidden_size``, finite). Nothing is executed. Every problem is an :class:`ArchiveError` (a
:class:`~steerc.io.vectorfile.VectorFileError` with code ``invalid-foreign-file``) that names the member
and, in the manifest, the JSON pointer of the field, so a caller can put a caret under it.

:func:`archive_bytes` writes an archive byte for byte as ``save_patch`` does: the manifest as
``json.dumps(..., indent=2, sort_keys=True)`` and a newline, the vectors by BrainPatch's safetensors writer
(tensors sorted by name, compact sorted header, ``__metadata__ {"format": "brainpatch-vectors-v1"}``),
``checksums.json`` with an indent of 2, entries sorted by name, dated 1980-01-01, DEFLATE, mode 0644.

>>> import numpy as np
>>> manifest = {"name": "joy", "base_model": {"model_id": "m", "hidden_size": 2, "num_layers": 4},
...             "interventions": [{"layer": 1, "vector": "joy", "coefficient": 2.0}]}
>>> blob = archive_bytes(full_manifest(manifest), {"joy": ("F16", np.array([1.0, -0.5], np.float32))})
>>> patch = read_archive_bytes(blob, "joy.brainpatch")
>>> patch.name, patch.interventions[0].layer, patch.vectors["joy"].dtype, patch.vectors["joy"].values.tolist()
('joy', 1, 'F16', [1.0, -0.5])
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass, field

from steerc.core.jsonio import JSONError
from steerc.core.jsonio import loads as loads_json
from steerc.diagnostics.codes import INVALID_FOREIGN_FILE
from steerc.io.vectorfile import TensorInfo, VectorFile, VectorFileError

SUFFIX = ".brainpatch"
MANIFEST, VECTORS, CHECKSUMS, README = "manifest.json", "vectors.safetensors", "checksums.json", "README.md"
MEMBERS = (MANIFEST, VECTORS, CHECKSUMS, README)
REQUIRED = (MANIFEST, VECTORS, CHECKSUMS)  # BrainPatch's loader verifies checksums unless told not to

# BrainPatch's bounds on a hostile archive (brainpatch/patch/loader.py).
MAX_MEMBER_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 512 * 1024 * 1024
MAX_COMPRESSION_RATIO = 200
MAX_MEMBERS = 16  # more entries than a patch can hold are refused before any is looked at
MAX_HEADER_BYTES = 16 * 1024 * 1024  # BrainPatch's safetensors reader refuses a longer header

# The manifest (brainpatch/patch/format.py).
FORMAT_VERSION = "1.0"
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}", re.ASCII)
HOOKS = ("residual_post",)
SITES = ("all", "prompt", "continuation")
ABSOLUTE_MAX_STRENGTH = 1024.0
EVIDENCE_LEVELS = ("none", "correlational", "interventional", "controlled_interventional", "replicated")
COMPATIBILITY_STATES = ("verified", "experimental", "implemented", "unsupported")
VECTORS_FORMAT = "brainpatch-vectors-v1"
DTYPES = {"F16": "<f2", "BF16": "bf16", "F32": "<f4", "F64": "<f8"}  # BrainPatch's tensors.py, as byte formats
_SIZES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
TOP_KEYS = ("format_version", "name", "description", "base_model", "interventions", "schedule", "evidence_level",
            "evaluation", "compatibility", "provenance", "max_abs_strength", "default_strength", "license",
            "authors")
BASE_KEYS = ("model_id", "revision", "architecture", "hidden_size", "num_layers", "torch_dtype")
INTERVENTION_KEYS = ("layer", "hook", "vector", "coefficient", "site", "id")


class ArchiveError(VectorFileError):
    """A ``.brainpatch`` that cannot be read safely: ``member`` is the archive member at fault (None: the
    archive itself), ``pointer`` the JSON pointer of the manifest field (None: the member as a whole)."""

    def __init__(self, message: str, member: str | None = None, pointer: str | None = None,
                 help: str | None = None):
        super().__init__(INVALID_FOREIGN_FILE, message, help=help)
        self.member, self.pointer = member, pointer
        self.text: str | None = None  # the manifest's text, when ``pointer`` points into it


@dataclass(frozen=True)
class Vector:
    dtype: str  # F16 | BF16 | F32 | F64, as stored
    values: object  # float32 numpy array (F64 rounded to float32, as BrainPatch's runtime uses it)


@dataclass(frozen=True)
class Intervention:
    layer: int
    vector: str
    coefficient: float
    site: str  # all | prompt | continuation
    id: str | None
    index: int  # its place in the manifest's list


@dataclass(frozen=True)
class Patch:
    """A checked ``.brainpatch``: its manifest's fields, its vectors, and the texts diagnostics point into."""

    path: str
    name: str
    description: str
    base_model: dict
    interventions: tuple[Intervention, ...]
    schedule: tuple[tuple[int, float], ...] | None  # (index, multiplier), sorted
    default_strength: float
    max_abs_strength: float
    metadata: dict  # evidence_level, evaluation, compatibility, provenance, license, authors
    vectors: dict[str, Vector]
    readme: str | None
    manifest_text: str
    sha256: str = field(default="")  # of the archive's bytes


# ------------------------------------------------------------------- reading


def read_archive(path: str) -> Patch:
    """The checked patch at ``path`` (ArchiveError for anything malformed or unsafe; OSError to read it)."""
    import os

    size = os.path.getsize(path)
    if size > MAX_TOTAL_BYTES + MAX_HEADER_BYTES:
        raise ArchiveError(f"the archive is {size:,} bytes, more than a BrainPatch can hold")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        patch = _read(fh, path)
        fh.seek(0)
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return _replace_sha(patch, digest.hexdigest())


def read_archive_bytes(blob: bytes, path: str) -> Patch:
    """The checked patch of an archive's bytes (``path`` only names it)."""
    return _replace_sha(_read(io.BytesIO(blob), path), hashlib.sha256(blob).hexdigest())


def _read(stream, path: str) -> Patch:
    try:
        with zipfile.ZipFile(stream) as zf:
            infos = _checked_entries(zf)
            raw = {info.filename: _read_member(zf, info) for info in infos}
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError, NotImplementedError,
            RuntimeError, OSError, IndexError, KeyError, struct.error, OverflowError) as exc:
        raise ArchiveError(f"not a readable ZIP archive ({type(exc).__name__}: {str(exc)[:160]})") from None
    for name in REQUIRED:
        if name not in raw:
            raise ArchiveError(f"the archive has no `{name}`",
                               help="a BrainPatch holds manifest.json, vectors.safetensors and checksums.json")
    _verify_checksums(raw)
    try:
        text = raw[MANIFEST].decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError("manifest.json is not UTF-8", MANIFEST) from None
    try:
        data = loads_json(text, unique_keys=True)
    except JSONError as exc:
        raise ArchiveError(f"manifest.json is not JSON ({exc})", MANIFEST) from None
    readme = None
    if README in raw:
        try:
            readme = raw[README].decode("utf-8")
        except UnicodeDecodeError:
            raise ArchiveError("README.md is not UTF-8", README) from None
    vectors = _vectors(raw[VECTORS])
    try:
        return _manifest(data, text, path, vectors, readme)
    except ArchiveError as exc:
        exc.text = text
        raise


def _replace_sha(patch: Patch, sha: str) -> Patch:
    from dataclasses import replace

    return replace(patch, sha256=sha)


def _checked_entries(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """Every entry's name, kind, method and size checked before any is decompressed."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ArchiveError(f"the archive has {len(infos):,} entries; a BrainPatch has at most {len(MEMBERS)}")
    seen, total = set(), 0
    for info in infos:
        name = info.filename
        shown = json.dumps(name)[1:-1]
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
            raise ArchiveError(f"archive member `{shown}` has an absolute path")
        if ".." in re.split(r"[/\\]", name):
            raise ArchiveError(f"archive member `{shown}` escapes the archive (`..`)")
        if info.is_dir():
            raise ArchiveError(f"archive member `{shown}` is a folder; a BrainPatch holds files only")
        if name not in MEMBERS:
            raise ArchiveError(f"archive member `{shown}` is not one a BrainPatch holds",
                               help="a BrainPatch holds exactly manifest.json, vectors.safetensors, checksums.json "
                                    "and an optional README.md")
        if name in seen:
            raise ArchiveError(f"archive member `{name}` is given twice", name)
        seen.add(name)
        mode = info.external_attr >> 16
        if mode and stat.S_IFMT(mode):
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"archive member `{name}` is a symbolic link", name)
            if not stat.S_ISREG(mode):
                raise ArchiveError(f"archive member `{name}` is not a regular file", name)
        if info.flag_bits & 0x1:
            raise ArchiveError(f"archive member `{name}` is encrypted", name)
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ArchiveError(f"archive member `{name}` uses compression method {info.compress_type}; "
                               "BrainPatch writes DEFLATE", name)
        if info.file_size > MAX_MEMBER_BYTES:
            raise ArchiveError(f"archive member `{name}` is {info.file_size:,} bytes, over BrainPatch's "
                               f"{MAX_MEMBER_BYTES:,}", name)
        if info.file_size and (info.compress_size == 0
                               or info.file_size / info.compress_size > MAX_COMPRESSION_RATIO):
            raise ArchiveError(f"archive member `{name}` expands {info.file_size:,} bytes from "
                               f"{info.compress_size:,} (a ratio over {MAX_COMPRESSION_RATIO}: a ZIP bomb?)", name)
        total += info.file_size
        if total > MAX_TOTAL_BYTES:
            raise ArchiveError(f"the archive expands to over {MAX_TOTAL_BYTES:,} bytes")
    return infos


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The member's bytes: no more than it declares (its CRC checked by zipfile at the end)."""
    with zf.open(info) as fh:
        data = fh.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise ArchiveError(f"archive member `{info.filename}` holds {len(data):,} bytes, not the {info.file_size:,} "
                           "it declares", info.filename)
    return data


def _verify_checksums(raw: dict[str, bytes]) -> None:
    try:
        recorded = loads_json(raw[CHECKSUMS], unique_keys=True)
    except JSONError as exc:
        raise ArchiveError(f"checksums.json is not JSON ({exc})", CHECKSUMS) from None
    if not isinstance(recorded, dict):
        raise ArchiveError("checksums.json is not a JSON object", CHECKSUMS)
    for name in sorted(raw):
        if name == CHECKSUMS:
            continue
        expected = recorded.get(name)
        if expected is None:
            raise ArchiveError(f"checksums.json has no entry for `{name}`", CHECKSUMS)
        actual = hashlib.sha256(raw[name]).hexdigest()
        if expected != actual:
            raise ArchiveError(f"`{name}` does not match its checksum: checksums.json records "
                               f"{str(expected)[:64]}, the member's sha256 is {actual}", name,
                               help="the archive is corrupt or was modified after it was written")


# ------------------------------------------------------------------- vectors


def _vectors(blob: bytes) -> dict[str, Vector]:
    """The tensors of ``vectors.safetensors``: BrainPatch's float dtypes, the data tiled exactly, finite."""
    import numpy as np

    def bad(message: str) -> ArchiveError:
        return ArchiveError(f"vectors.safetensors: {message}", VECTORS)

    if len(blob) < 8:
        raise bad("too short to be safetensors")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(blob):
        raise bad("its header length is out of range")
    head = blob[8:8 + n]
    if not head.startswith(b"{"):
        raise bad("its header does not start with `{`")
    try:
        header = loads_json(head, max_bytes=MAX_HEADER_BYTES, unique_keys=True)
    except JSONError as exc:
        raise bad(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("`__metadata__` must map strings to strings")
    data = blob[8 + n:]
    spans, out = [], {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor `{name}` is malformed")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise bad(f"tensor `{name}` has dtype {str(dtype)[:20]}; BrainPatch stores F16, BF16, F32 or F64")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise bad(f"tensor `{name}` has a malformed shape")
        if len(shape) != 1:
            raise bad(f"tensor `{name}` has shape {shape}; a BrainPatch vector is 1-D")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets):
            raise bad(f"tensor `{name}` has malformed data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end <= len(data) or end - begin != shape[0] * _SIZES[dtype]:
            raise bad(f"tensor `{name}`'s data_offsets do not fit its shape and the data")
        spans.append((begin, end, name))
        raw = data[begin:end]
        if dtype == "BF16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=DTYPES[dtype])
        with np.errstate(over="ignore", invalid="ignore"):
            values = values.astype(np.float32)
        if not np.all(np.isfinite(values)):
            raise bad(f"tensor `{name}` holds NaN or infinite values (or values past float32)")
        values.setflags(write=False)
        out[name] = Vector(dtype, values)
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected:
            raise bad(f"tensor `{name}` overlaps another or leaves a hole before it")
        expected = end
    if expected != len(data):
        raise bad(f"its tensors cover {expected:,} of its {len(data):,} data bytes")
    return out


# ------------------------------------------------------------------ manifest


def _manifest(data, text: str, path: str, vectors: dict[str, Vector], readme: str | None) -> Patch:
    def bad(message: str, pointer: str = "", help: str | None = None) -> ArchiveError:
        return ArchiveError(message, MANIFEST, pointer, help=help)

    if not isinstance(data, dict):
        raise bad("the manifest is not a JSON object")
    for key in data:
        if key not in TOP_KEYS:
            raise bad(f"the manifest has a key BrainPatch 1.0 does not define: `{key}`", f"/{_escape(key)}",
                      help="steerc will not guess what it means; remove it")
    for key in ("name", "base_model", "interventions"):
        if key not in data:
            raise bad(f"the manifest has no `{key}`")
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise bad(f"format_version {json.dumps(version)[:40]} is not BrainPatch's {FORMAT_VERSION}",
                  "/format_version")
    name = data["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad("`name` must be 1 to 64 of a-z, 0-9, `.`, `_`, `-`, starting with a letter or digit", "/name")
    description = _string(data, "description", "", bad)
    base = _base_model(data["base_model"], bad)
    interventions = _interventions(data["interventions"], base, vectors, bad)
    schedule = _schedule(data.get("schedule"), bad)
    max_abs = _number(data, "max_abs_strength", 8.0, bad)
    if not 0 < max_abs <= ABSOLUTE_MAX_STRENGTH:
        raise bad(f"max_abs_strength must be in (0, {ABSOLUTE_MAX_STRENGTH:g}]", "/max_abs_strength")
    default = _number(data, "default_strength", 1.0, bad)
    if abs(default) > max_abs:
        raise bad(f"default_strength {default!r} exceeds max_abs_strength {max_abs!r}", "/default_strength")
    level = data.get("evidence_level", "none")
    if level not in EVIDENCE_LEVELS:
        raise bad(f"evidence_level must be one of {', '.join(EVIDENCE_LEVELS)}", "/evidence_level")
    metadata = {"evidence_level": level, "license": _string(data, "license", "Apache-2.0", bad)}
    authors = data.get("authors", [])
    if not isinstance(authors, list) or not all(isinstance(a, str) for a in authors):
        raise bad("`authors` must be a list of strings", "/authors")
    metadata["authors"] = authors
    for key in ("evaluation", "compatibility", "provenance"):
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise bad(f"`{key}` must be an object", f"/{key}")
        metadata[key] = value
    for backend, entry in metadata["compatibility"].items():
        if not isinstance(entry, dict) or entry.get("status") not in COMPATIBILITY_STATES:
            raise bad(f"compatibility[{json.dumps(backend)[:40]}].status must be one of "
                      f"{', '.join(COMPATIBILITY_STATES)}", f"/compatibility/{_escape(backend)}")
    return Patch(path, name, description, base, interventions, schedule, default, max_abs, metadata, vectors,
                 readme, text)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _string(data: dict, key: str, default, bad, where: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise bad(f"`{key}` must be a string", f"{where}/{key}")
    return value


def _number(data: dict, key: str, default: float, bad, where: str = "") -> float:
    value = data.get(key, default)
    if not _is_number(value):
        raise bad(f"`{key}` must be a number", f"{where}/{key}")
    return float(value)


def _base_model(base, bad) -> dict:
    if not isinstance(base, dict):
        raise bad("`base_model` must be an object", "/base_model")
    for key in base:
        if key not in BASE_KEYS:
            raise bad(f"base_model has a key BrainPatch 1.0 does not define: `{key}`", f"/base_model/{_escape(key)}")
    if "model_id" not in base:
        raise bad("base_model has no `model_id`", "/base_model")
    out = {"model_id": _string(base, "model_id", "", bad, "/base_model")}
    if not out["model_id"]:
        raise bad("base_model.model_id must not be empty", "/base_model/model_id")
    out["architecture"] = _string(base, "architecture", "", bad, "/base_model")
    for key in ("revision", "torch_dtype"):
        value = base.get(key)
        if value is not None and not isinstance(value, str):
            raise bad(f"base_model.{key} must be a string or null", f"/base_model/{key}")
        out[key] = value
    for key, limit in (("hidden_size", 65_536), ("num_layers", 1024)):
        value = base.get(key, 0)
        if not _is_int(value) or not 0 < value <= limit:
            raise bad(f"base_model.{key} must be a whole number from 1 to {limit:,}", f"/base_model/{key}")
        out[key] = value
    return out


def _interventions(items, base: dict, vectors: dict[str, Vector], bad) -> tuple[Intervention, ...]:
    if not isinstance(items, list):
        raise bad("`interventions` must be a list", "/interventions")
    if not items:
        raise bad("a BrainPatch declares at least one intervention", "/interventions")
    out, ids = [], set()
    for i, item in enumerate(items):
        where = f"/interventions/{i}"
        if not isinstance(item, dict):
            raise bad("an intervention must be an object", where)
        for key in item:
            if key not in INTERVENTION_KEYS:
                raise bad(f"an intervention has a key BrainPatch 1.0 does not define: `{key}`",
                          f"{where}/{_escape(key)}")
        for key in ("layer", "vector"):
            if key not in item:
                raise bad(f"intervention {i} has no `{key}`", where)
        layer = item["layer"]
        if not _is_int(layer) or not 0 <= layer < base["num_layers"]:
            raise bad(f"`layer` must be a whole number from 0 to {base['num_layers'] - 1} (base_model.num_layers "
                      f"is {base['num_layers']})", f"{where}/layer")
        hook = item.get("hook", "residual_post")
        if hook not in HOOKS:
            raise bad("`hook` must be \"residual_post\", the only hook BrainPatch 1.0 applies", f"{where}/hook")
        key = item["vector"]
        if not isinstance(key, str) or not key:
            raise bad("`vector` must be a non-empty string", f"{where}/vector")
        if key not in vectors:
            raise bad(f"vector `{key}` is not in vectors.safetensors", f"{where}/vector",
                      help=f"it holds: {', '.join(sorted(vectors))[:200] or 'nothing'}")
        width = vectors[key].values.shape[0]
        if width != base["hidden_size"]:
            raise bad(f"vector `{key}` has {width} values, not base_model.hidden_size {base['hidden_size']}",
                      f"{where}/vector")
        coefficient = _number(item, "coefficient", 1.0, bad, where)
        if abs(coefficient) > ABSOLUTE_MAX_STRENGTH:
            raise bad(f"a coefficient's magnitude is at most {ABSOLUTE_MAX_STRENGTH:g}", f"{where}/coefficient")
        site = item.get("site", "all")
        if site not in SITES:
            raise bad("`site` must be \"all\", \"prompt\" or \"continuation\"", f"{where}/site")
        ident = item.get("id")
        if ident is not None and not isinstance(ident, str):
            raise bad("`id` must be a string", f"{where}/id")
        if ident:
            if ident in ids:
                raise bad(f"intervention id `{ident}` is given twice", f"{where}/id")
            ids.add(ident)
        out.append(Intervention(layer, key, coefficient, site, ident, i))
    return tuple(out)


def _schedule(schedule, bad) -> tuple[tuple[int, float], ...] | None:
    if schedule is None:
        return None
    if not isinstance(schedule, dict) or not schedule:
        raise bad("`schedule` must be null or a non-empty object of index: multiplier", "/schedule")
    out = {}
    for key, value in schedule.items():
        if not re.fullmatch(r"0|[1-9][0-9]{0,9}", key, re.ASCII):
            raise bad(f"schedule key `{key[:20]}` is not a whole number >= 0 (a token index)",
                      f"/schedule/{_escape(key)}")
        if not _is_number(value):
            raise bad(f"schedule value at {key} must be a number", f"/schedule/{_escape(key)}")
        out[int(key)] = float(value)
    return tuple(sorted(out.items()))


# ------------------------------------------------------------------- the reader seat


def open_brainpatch(path: str) -> VectorFile:
    """A ``.brainpatch`` as a vector file (``load("x.brainpatch", key="joy")``): the archive checked whole, its
    vectors by their keys, as float32 (what BrainPatch's runtime adds)."""
    try:
        patch = read_archive(path)
    except ArchiveError as exc:
        where = f"{exc.member}: " if exc.member and not exc.message.startswith(exc.member) else ""
        raise VectorFileError(exc.code, f"{where}{exc.message}" if where else exc.message, help=exc.help) from None
    tensors = {name: TensorInfo(name, v.dtype, tuple(v.values.shape)) for name, v in patch.vectors.items()}
    file = VectorFile(path, "brainpatch", tensors, lambda name: patch.vectors[name].values,
                      metadata={"brainpatch.name": patch.name, "brainpatch.model_id": patch.base_model["model_id"]})
    file.meta["hidden"] = patch.base_model["hidden_size"]
    return file


def recognises(path: str) -> bool:
    return path.lower().endswith(SUFFIX)


# ------------------------------------------------------------------- writing


def full_manifest(manifest: dict) -> dict:
    """``manifest`` with every key BrainPatch's ``Manifest.to_dict`` writes, defaults filled as it fills them."""
    base = manifest["base_model"]
    ivs = []
    for iv in manifest["interventions"]:
        out = {"layer": iv["layer"], "hook": iv.get("hook", "residual_post"), "vector": iv["vector"],
               "coefficient": iv.get("coefficient", 1.0)}
        if iv.get("site", "all") != "all":
            out["site"] = iv["site"]
        if iv.get("id"):
            out["id"] = iv["id"]
        ivs.append(out)
    return {
        "format_version": manifest.get("format_version", FORMAT_VERSION),
        "name": manifest["name"],
        "description": manifest.get("description", ""),
        "base_model": {"model_id": base["model_id"], "revision": base.get("revision"),
                       "architecture": base.get("architecture", ""), "hidden_size": base.get("hidden_size", 0),
                       "num_layers": base.get("num_layers", 0), "torch_dtype": base.get("torch_dtype")},
        "interventions": ivs,
        "schedule": manifest.get("schedule"),
        "evidence_level": manifest.get("evidence_level", "none"),
        "evaluation": manifest.get("evaluation", {}),
        "compatibility": manifest.get("compatibility", {}),
        "provenance": manifest.get("provenance", {}),
        "max_abs_strength": manifest.get("max_abs_strength", 8.0),
        "default_strength": manifest.get("default_strength", 1.0),
        "license": manifest.get("license", "Apache-2.0"),
        "authors": list(manifest.get("authors", [])),
    }


def encode(values, dtype: str) -> bytes:
    """A float32 vector's bytes in ``dtype`` as BrainPatch's writer encodes them (bf16: round to nearest even)."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float32)
    if dtype == "BF16":
        bits = arr.view(np.uint32).astype(np.uint64)
        return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF).astype("<u2").tobytes()
    return arr.astype(DTYPES[dtype]).tobytes()


def safetensors_bytes(tensors: dict[str, tuple[str, object]], metadata: dict[str, str] | None) -> bytes:
    """BrainPatch's ``tensors.dump``: tensors sorted by name, a compact sorted header, no padding."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    body = bytearray()
    for name in sorted(tensors):
        dtype, values = tensors[name]
        raw = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": [len(raw) // _SIZES[dtype]], "data_offsets": [len(body),
                                                                                               len(body) + len(raw)]}
        body += raw
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return struct.pack("<Q", len(head)) + head + bytes(body)


def archive_bytes(manifest: dict, vectors: dict[str, tuple[str, object]], readme: str | None = None) -> bytes:
    """The bytes ``save_patch(Manifest.from_dict(manifest), vectors, path, readme=readme)`` writes (``manifest``
    as :func:`full_manifest` gives it; ``vectors``: key -> (dtype, float32 values))."""
    members = {
        MANIFEST: (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"),
        VECTORS: safetensors_bytes(vectors, {"format": VECTORS_FORMAT}),
    }
    if readme:
        members[README] = readme.encode("utf-8")
    checksums = {name: hashlib.sha256(blob).hexdigest() for name, blob in sorted(members.items())}
    members[CHECKSUMS] = (json.dumps(checksums, indent=2, sort_keys=True) + "\n").encode("utf-8")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16
            zf.writestr(info, members[name])
    return out.getvalue()


__all__ = ["ArchiveError", "Intervention", "Patch", "Vector", "archive_bytes", "encode", "full_manifest",
           "open_brainpatch", "read_archive", "read_archive_bytes", "recognises", "safetensors_bytes"]
