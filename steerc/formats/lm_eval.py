"""lm-eval-harness's ``steered`` model: its CSV steering config (``steer_path=x.csv``) as a Steer program.

lm-eval 0.4.13 (``lm_eval/models/hf_steered.py``, ``SteeredModel``) reads a steering config two ways: a ``.pt``
/ ``.pth`` file, which it opens with ``torch.load(weights_only=False)`` — a pickle, which runs code as it
loads; steerc refuses it unread — and a CSV whose rows each take one SAE feature's decoder row:

============================  ======================================================================
CSV column                    meaning (lm-eval's ``derive_steer_config``)
============================  ======================================================================
``loader``                    ``sae_lens`` (``SAE.from_pretrained(sparse_model, sae_id)``) or
                              ``sparsify`` (default when the column is absent)
``action``                    ``add`` (default when absent): ``h + c · W_dec[i]``; ``clamp``: the
                              component of ``h − b_dec`` along ``û = W_dec[i]/‖W_dec[i]‖`` set to ``c``
``sparse_model``              the sae_lens release (or a Hugging Face repo id)
``sae_id``                    the SAE's id in that release
``hookpoint``                 a module of ``model.base_model`` whose **output** is steered (every
                              position); empty: the SAE's ``hook_name``
``feature_index``             ``i``
``steering_coefficient``      ``c``
``head_index``, ``description``  not read by lm-eval's CSV path (``description`` becomes a comment)
============================  ======================================================================

Each row becomes an intervention: ``add c * s[i]``, or ``clamp s[i] to c + dot(b_dec, û)`` (the same
projection clamp, taken around the origin: spec/language.md 9.1.3), with ``s`` the SAE as a SAELens folder.
lm-eval loads SAEs from the hub by release; steerc reads folders, so the release and id name a folder under
``--sae-root DIR``: ``DIR/<release>/<sae_id>`` (a release that is a repo id ``owner/name`` is the folder
``owner--name``; an id's ``/`` are folders). The hookpoints are module names of a Llama-style model:
``layers.L`` is ``resid_post[L]``, ``layers.L.self_attn`` (and its ``o_proj``) ``attn_out[L]``,
``layers.L.mlp`` (and its ``down_proj``) ``mlp_out[L]``, ``embed_tokens`` ``resid_pre[0]``. lm-eval keeps
one row per hookpoint (a dict: the last row replaces the earlier ones), so steerc keeps that row too and says
which it dropped.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re

from steerc.diagnostics.codes import FILE_NOT_FOUND, INVALID_FOREIGN_FILE
from steerc.formats import ForeignFileError, Imported
from steerc.formats.text import comment, literal

MAX_BYTES = 1 << 20  # a steering config is a few rows; 1 MiB is thousands
MAX_ROWS = 4096
MAX_FIELD = 4096
COLUMNS = ("loader", "action", "sparse_model", "hookpoint", "feature_index", "steering_coefficient", "head_index",
           "sae_id", "description")
REQUIRED = ("sparse_model", "hookpoint", "feature_index", "steering_coefficient")
HOOKPOINTS = (  # lm-eval's module name (of model.base_model) -> steerc's site
    (re.compile(r"layers\.(\d+)"), "resid_post"),
    (re.compile(r"layers\.(\d+)\.self_attn(?:\.o_proj)?"), "attn_out"),
    (re.compile(r"layers\.(\d+)\.mlp(?:\.down_proj)?"), "mlp_out"),
)
SITE_HOOKPOINTS = {"resid_post": "layers.{}", "attn_out": "layers.{}.self_attn", "mlp_out": "layers.{}.mlp"}
_SEGMENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*")


def is_pickle(head: bytes) -> bool:
    """Whether ``head`` starts as a pickle or a torch.save ZIP does (``.pt`` named otherwise)."""
    return head[:1] == b"\x80" or head[:4] == b"PK\x03\x04"


def convert(path: str, stem: str, sae_root: str | None = None, out_dir: str | None = None) -> Imported:
    """The CSV at ``path`` as a program; ``sae_root`` holds the SAE folders its rows name, and the program
    names them relative to ``out_dir`` (the folder the program is written to)."""
    if os.path.splitext(path)[1].lower() in (".pt", ".pth"):
        raise ForeignFileError(INVALID_FOREIGN_FILE, "a .pt steering config is a pickle (lm-eval opens it with "
                               "torch.load(weights_only=False), which runs code as it loads); steerc never "
                               "unpickles a file",
                               help="write the config as lm-eval's CSV (loader, action, sparse_model, hookpoint, "
                                    "feature_index, steering_coefficient, sae_id), or its vectors as a "
                                    ".safetensors file that a .steer program loads")
    text, source = _read(path)
    rows = _rows(text, source)
    return _program(rows, source, path, sae_root, out_dir or os.getcwd())


# ------------------------------------------------------------------ reading


def _read(path: str):
    from steerc.core.source import Source

    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"cannot read the steering config ({exc.strerror or exc})") \
            from None
    if len(data) > MAX_BYTES:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"the steering config is over {MAX_BYTES >> 20} MiB; an "
                               "lm-eval steering CSV is a few rows")
    if is_pickle(data[:8]):
        raise ForeignFileError(INVALID_FOREIGN_FILE, "this file is a pickle (a torch.save file), not lm-eval's "
                               "CSV; steerc never unpickles a file",
                               help="write the config as lm-eval's CSV steering config")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"the steering config is not UTF-8 text (byte {exc.start})") \
            from None
    if "\x00" in text:
        raise ForeignFileError(INVALID_FOREIGN_FILE, "the steering config holds a NUL byte: not a CSV")
    return text, Source(path, text)


class _Row:
    def __init__(self, number: int, cells: dict[str, tuple[str, int, int]]):
        self.number, self.cells = number, cells  # column -> (text, start, end) in the file

    def text(self, column: str) -> str:
        return self.cells[column][0].strip() if column in self.cells else ""


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]


def _rows(text: str, source) -> list[_Row]:
    """Each data row's cells with their places in the file (a CSV field's quotes are the field's)."""
    starts = _line_starts(text)
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        table = []
        for record in reader:
            if len(table) > MAX_ROWS:
                raise ForeignFileError(INVALID_FOREIGN_FILE, f"the steering config has over {MAX_ROWS:,} rows")
            table.append((reader.line_num, record))
    except csv.Error as exc:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"not a well-formed CSV: {exc}") from None
    if not table or not any(c.strip() for c in table[0][1]):
        raise ForeignFileError(INVALID_FOREIGN_FILE, "the steering config is empty: lm-eval's CSV starts with "
                               f"its header ({', '.join(COLUMNS[:6])}, ...)")
    header_line, header = table[0]
    names = [h.strip() for h in header]
    where = _cells_of(text, starts, 1, header)
    for column in REQUIRED:
        if column not in names:
            raise ForeignFileError(INVALID_FOREIGN_FILE, f"the header has no `{column}` column (lm-eval reads "
                                   f"{', '.join(REQUIRED)})", source=source, span=source.span(0, len(text.split('\n')[0].rstrip('\r')) or 1))
    for i, name in enumerate(names):
        if name and names.index(name) != i:
            raise ForeignFileError(INVALID_FOREIGN_FILE, f"the header names `{name}` twice", source=source,
                                   span=source.span(*where[i][1:]))
    out = []
    previous_line = header_line
    for line_num, record in table[1:]:
        first_line = previous_line + 1
        previous_line = line_num
        if not any(c.strip() for c in record):
            continue  # pandas skips blank lines
        if len(record) > len(names):  # pandas would take the first column as the rows' index: all shifted
            cells = _cells_of(text, starts, first_line, record)
            raise ForeignFileError(INVALID_FOREIGN_FILE, f"row {len(out) + 1} has {len(record)} fields; the header "
                                   f"names {len(names)}", source=source, span=source.span(*cells[len(names)][1:]))
        cells = _cells_of(text, starts, first_line, record)
        for cell in cells:
            if len(cell[0]) > MAX_FIELD:
                raise ForeignFileError(INVALID_FOREIGN_FILE, f"a field of over {MAX_FIELD:,} characters",
                                       source=source, span=source.span(cell[1], cell[1] + 1))
        named = {name: cells[i] if i < len(cells) else ("", cells[-1][2], cells[-1][2])
                 for i, name in enumerate(names) if name}
        out.append(_Row(len(out) + 1, named))
    if not out:
        raise ForeignFileError(INVALID_FOREIGN_FILE, "the steering config has a header and no rows: it steers "
                               "nothing", source=source, span=source.span(0, max(1, len(text.split("\n")[0]))))
    return out


def _cells_of(text: str, starts: list[int], line: int, record: list[str]) -> list[tuple[str, int, int]]:
    """``record``'s fields with (start, end) offsets, found by scanning the record's text from its line."""
    pos = starts[line - 1] if line - 1 < len(starts) else len(text)
    out = []
    for value in record:
        start = pos
        if pos < len(text) and text[pos] == '"':
            pos += 1
            while pos < len(text):
                if text[pos] == '"' and pos + 1 < len(text) and text[pos + 1] == '"':
                    pos += 2
                elif text[pos] == '"':
                    pos += 1
                    break
                else:
                    pos += 1
        while pos < len(text) and text[pos] not in ",\r\n":
            pos += 1
        out.append((value, start, max(pos, start + 1) if start < len(text) else start))
        pos += 1  # the comma
    return out


# ------------------------------------------------------------------ meaning


class _Cell(ForeignFileError):
    pass


def _at(row: _Row, column: str, source, message: str, help: str | None = None, code: str = INVALID_FOREIGN_FILE):
    _, start, end = row.cells.get(column, ("", 0, 1))
    end = max(end, start + 1)
    return ForeignFileError(code, message, help, source, source.span(min(start, len(source.text)),
                                                                      min(end, max(len(source.text), 1))))


def _site(row: _Row, source) -> tuple[str, int]:
    hook = row.text("hookpoint")
    if not hook:
        raise _at(row, "hookpoint", source, f"row {row.number} has no hookpoint: lm-eval then hooks the SAE's "
                  "hook_name (such as blocks.8.hook_resid_post), a TransformerLens name that is no module of a "
                  "Hugging Face model, and fails to steer", help="write the module, such as layers.8 for the "
                  "output of decoder layer 8")
    for pattern, site in HOOKPOINTS:
        m = pattern.fullmatch(hook)
        if m is not None:
            return site, _layer(m.group(1), row, source)
    if hook == "embed_tokens":
        return "resid_pre", 0
    hint = " (lm-eval names modules of model.base_model: drop the `model.` prefix)" \
        if hook.startswith("model.") else ""
    raise _at(row, "hookpoint", source, f"hookpoint `{_shown(hook)}` is no module steerc maps to a site{hint}",
              help="steerc maps layers.L (resid_post[L]), layers.L.self_attn (attn_out[L]), layers.L.mlp "
                   "(mlp_out[L]) and embed_tokens (resid_pre[0]); spec/formats.md")


def _layer(digits: str, row: _Row, source) -> int:
    if len(digits) > 4:
        raise _at(row, "hookpoint", source, f"layer {digits[:12]} is past any model's layers")
    return int(digits)


def _whole(row: _Row, column: str, source) -> int:
    text = row.text(column)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise _at(row, column, source, f"row {row.number}'s {column} `{_shown(text)}` is not a whole number "
                  "from 0 on")
    if value >= 1 << 31:
        raise _at(row, column, source, f"row {row.number}'s {column} {text} is past any SAE's features")
    return int(value)


def _float(row: _Row, column: str, source) -> float:
    text = row.text(column)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > 3.4028234663852886e38:
        raise _at(row, column, source, f"row {row.number}'s {column} `{_shown(text)}` is not a finite number "
                  "that fits float32")
    return value


def _shown(text: str) -> str:
    from steerc.core.text import shown

    text = shown(text)
    return text if len(text) <= 60 else text[:57] + "..."


def _sae_folder(row: _Row, source, sae_root: str | None) -> tuple[str, str, str]:
    """(release, sae_id, folder) of the row's SAE, the folder under ``sae_root``."""
    release, sae_id = row.text("sparse_model"), row.text("sae_id")
    if not release:
        raise _at(row, "sparse_model", source, f"row {row.number} names no sparse_model (the sae_lens release)")
    if not sae_id:
        raise _at(row, "sae_id", source if "sae_id" in row.cells else source,
                  f"row {row.number} has no sae_id: sae_lens loads an SAE by release and id")
    parts = [release.replace("/", "--"), *sae_id.split("/")]
    if release.count("/") > 1 or any(not _SEGMENT.fullmatch(p) or p in (".", "..") for p in parts):
        bad = "sparse_model" if not all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts[:1]) \
            or release.count("/") > 1 else "sae_id"
        raise _at(row, bad, source, f"row {row.number}'s {bad} `{_shown(row.text(bad))}` is not a release and "
                  "id steerc maps to a folder (letters, digits, `_.-`, and `/` between parts)")
    relative = os.path.join(*parts)
    if sae_root is None:
        raise _at(row, "sparse_model", source, f"row {row.number} steers with the SAE `{release}` / `{sae_id}`, "
                  "which lm-eval downloads by release; steerc reads SAE folders and downloads nothing",
                  help=f"save the SAE as a SAELens folder (SAE.save_model) at DIR/{relative} and give "
                       "--sae-root DIR", code=FILE_NOT_FOUND)
    folder = os.path.join(sae_root, relative)
    if not os.path.isfile(os.path.join(folder, "cfg.json")):
        raise _at(row, "sparse_model", source, f"row {row.number}'s SAE `{release}` / `{sae_id}` is not under "
                  f"--sae-root: {folder} holds no cfg.json",
                  help=f"save it there as a SAELens folder (SAE.save_model): {relative}/cfg.json and "
                       "sae_weights.safetensors", code=FILE_NOT_FOUND)
    return release, sae_id, folder


def _open_sae(folder: str, row: _Row, source, cache: dict):
    from steerc.io.sae import SaeError, read_sae

    if folder not in cache:
        try:
            cache[folder] = read_sae(folder)
        except SaeError as exc:
            raise _at(row, "sparse_model", source, f"the SAE folder {folder}: {exc.message}", help=exc.help,
                      code=exc.code) from None
        except OSError as exc:
            raise _at(row, "sparse_model", source, f"cannot read the SAE folder {folder} "
                      f"({exc.strerror or exc})") from None
    return cache[folder]


def _program(rows: list[_Row], source, path: str, sae_root: str | None, out_dir: str) -> Imported:
    import numpy as np

    kept: dict[str, _Row] = {}
    notes, dropped = [], []
    for row in rows:
        loader = row.text("loader") if "loader" in row.cells else "sparsify"
        if loader == "sparsify":
            raise _at(row, "loader", source, f"row {row.number} loads a sparsify coder (loader "
                      f"{'sparsify, the default' if 'loader' not in row.cells else 'sparsify'}); steerc reads "
                      "SAELens folders only", help="save the SAE with sae_lens and write loader sae_lens")
        if loader != "sae_lens":
            raise _at(row, "loader", source, f"row {row.number}'s loader `{_shown(loader)}` is neither sae_lens "
                      "nor sparsify (lm-eval refuses it too)")
        action = row.text("action") if "action" in row.cells else "add"
        if action not in ("add", "clamp"):
            raise _at(row, "action", source, f"row {row.number}'s action `{_shown(action)}` is neither add nor "
                      "clamp (lm-eval refuses it too)")
        site = _site(row, source)
        if row.text("head_index"):
            notes.append(f"row {row.number}: head_index is not read by lm-eval's CSV path (it steers the whole "
                         "hookpoint); nor by this import")
        key = f"{site[0]}[{site[1]}]"
        if key in kept:
            dropped.append((kept[key].number, row.number, row.text("hookpoint")))
        kept[key] = row
    for old, new, hook in dropped:
        notes.append(f"row {old} is dropped: lm-eval keeps one row per hookpoint ({hook}), the last (row {new})")
    saes: dict[str, tuple[str, str, str]] = {}
    cache: dict = {}
    body = []
    for key, row in kept.items():
        release, sae_id, folder = _sae_folder(row, source, sae_root)
        sae = _open_sae(folder, row, source, cache)
        index = _whole(row, "feature_index", source)
        if index >= sae.d_sae:
            raise _at(row, "feature_index", source, f"row {row.number}'s feature {index} is out of range: the "
                      f"SAE has {sae.d_sae:,} features")
        c = _float(row, "steering_coefficient", source)
        if folder not in saes:
            saes[folder] = (f"s{len(saes)}", release, sae_id)
        name = saes[folder][0]
        action = row.text("action") if "action" in row.cells else "add"
        head = [f"# row {row.number}: {action} {c!r} x feature {index} at {row.text('hookpoint')}"]
        if row.text("description"):
            head.append("# " + comment(row.text("description")))
        if action == "add":
            op = f"add {c!r} * {name}[{index}]"
        else:
            row_vec = np.asarray(sae.decoder_row(index), dtype=np.float32)
            norm = float(np.linalg.norm(row_vec.astype(np.float64)))
            if norm == 0.0:
                raise _at(row, "feature_index", source, f"row {row.number}'s feature {index} has a zero decoder "
                          "row: it has no direction to clamp")
            b_dec = np.asarray(sae.tensor("b_dec"), dtype=np.float64)
            offset = float(b_dec @ (row_vec.astype(np.float64) / norm))
            head.append("# lm-eval clamps the component of h - b_dec: the target is c + dot(b_dec, u), "
                        "u the unit decoder row")
            op = f"clamp {name}[{index}] to {c!r} + {offset!r}"
        body.append("\n".join([*head, f"intervention row_{row.number} {{", f"  at {key}", f"  {op}", "}"]))
    decls = [f"# lm-eval sae_lens release {comment(r)}, sae_id {comment(i)}\n"
             f"sae {n} = sae({literal(_relative(folder, out_dir))})" for folder, (n, r, i) in saes.items()]
    header = (f"# imported from {comment(os.path.basename(path))}: lm-eval's `steered` model (its CSV steering "
              "config; lm-eval steers every position)")
    text = "\n\n".join(["steer 1", header, *decls, *body]) + "\n"
    return Imported(text, {}, tuple(notes))


def _relative(folder: str, out_dir: str) -> str:
    rel = os.path.relpath(os.path.abspath(folder), os.path.abspath(out_dir))
    return rel.replace(os.sep, "/")



__all__ = ["COLUMNS", "HOOKPOINTS", "SITE_HOOKPOINTS", "convert", "is_pickle"]
