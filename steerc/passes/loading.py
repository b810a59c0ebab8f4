"""Loading the vectors (and matrices) named by ``load(...)``, and the SAE folders of ``sae(...)``, under the
path policy.

Each file is opened once per check (a program with 10,000 interventions
reading one file reads its header once). Keys and shapes are checked from
the header before any tensor data is read. A llama.cpp control vector
(``.gguf``) is a bank of its ``direction.<N>`` rows unless ``key=`` picks
one; with a model, the model it says it was made for must be this one.

A check that wants only diagnostics reads a small tensor without numpy (see
:func:`python_floats`); values are the same either way.
"""

from __future__ import annotations

import math
import os

from steerc.core.limits import MAX_HIDDEN, MAX_LAYERS, MAX_VALUES
from steerc.diagnostics.codes import INVALID_VECTOR_FILE, MISSING_KEY, MODEL_MISMATCH, SHAPE_MISMATCH
from steerc.io import floats
from steerc.io.provenance import provenance
from steerc.io.vectorfile import VectorFile, VectorFileError
from steerc.io.vectors import FORMATS, open_vector_file
from steerc.ir import nodes as ir
from steerc.ir.values import PerLayer
from steerc.passes.context import CheckContext, Fault
from steerc.passes.files import resolve_path


def open_file(ctx: CheckContext, path: ir.Str) -> VectorFile:
    real = resolve_path(ctx, path, "vector file")
    cached = ctx.file_cache.get(real)
    if cached is None:
        try:
            cached = open_vector_file(real)
        except VectorFileError as exc:
            cached = exc
        except OSError as exc:
            cached = VectorFileError(INVALID_VECTOR_FILE, f"cannot read the file ({exc.strerror})")
        ctx.file_cache[real] = cached
    if isinstance(cached, VectorFileError):
        ctx.error(cached.code, cached.message, path.span, help=cached.help)
        raise Fault
    return cached


def load_vector(ctx: CheckContext, call: ir.Call):
    """Fold ``load(path, key=..., per_layer=...)`` to an array or a PerLayer bank."""
    path = call.args[0]
    kwargs = {k.name: k.value for k in call.kwargs}
    key_node = kwargs.get("key")
    per_layer = bool(kwargs["per_layer"].value) if "per_layer" in kwargs else False
    f = open_file(ctx, path)
    _record_origin(ctx, f, call)
    key = key_node.value if key_node is not None else None
    where = key_node.span if key_node is not None else path.span
    try:
        if f.kind == "gguf":  # read by steerc.io.controlvector, imported by then
            from steerc.io import controlvector as cv

            _fits_model(ctx, f, path)
            if key in (None, cv.PREFIX):
                _no_single_vector(ctx, kwargs.get("per_layer"), path)
                return _bank(ctx, f, cv.PREFIX, where, path)
        if per_layer:
            return _bank(ctx, f, key, where, path)
        name = _pick(ctx, f, key, where, path)
        info = f.tensors[name]
        if len(info.shape) == 1:
            _width_ok(ctx, info.shape[0], name or path.value, where)
        if len(info.shape) != 1:
            ctx.error(
                SHAPE_MISMATCH,
                f"`{name or path.value}` has shape {list(info.shape)}; a vector has one dimension",
                where,
                help="add `per_layer=true` to use a [layers, width] tensor as one row per layer"
                if len(info.shape) == 2
                else None,
            )
            raise Fault
        return _read(ctx, f, name, where)
    except VectorFileError as exc:
        ctx.error(exc.code, exc.message, where, help=exc.help)
        raise Fault from None


def load_matrix(ctx: CheckContext, call: ir.Call):
    """Fold the ``load(path, key=...)`` of a ``matrix`` declaration to a 2-D float64 array.

    The tensor's shape is checked from the header before any of its data is read: two dimensions, none
    empty, no wider than a model. A matrix is always read with numpy (its uses, such as ``loreft``'s
    orthonormality check, are matrix products).
    """
    path = call.args[0]
    key_node = next((k.value for k in call.kwargs if k.name == "key"), None)
    f = open_file(ctx, path)
    key = key_node.value if key_node is not None else None
    where = key_node.span if key_node is not None else path.span
    try:
        if f.kind == "gguf":
            ctx.error(SHAPE_MISMATCH, f"`{path.value}` is a control vector: one vector per layer, not a matrix",
                      where, help="load a matrix from a .safetensors, .npy or .pt file")
            raise Fault
        name = _pick(ctx, f, key, where, path)
        label = name or path.value
        shape = f.tensors[name].shape
        if len(shape) != 2:
            ctx.error(SHAPE_MISMATCH, f"`{label}` has shape {list(shape)}; a matrix has two dimensions", where,
                      help="declare a one-dimensional tensor with `vector NAME = load(...)`"
                      if len(shape) == 1 else None)
            raise Fault
        if 0 in shape:
            ctx.error(SHAPE_MISMATCH, f"`{label}` has shape {list(shape)}: a matrix with no entries", where)
            raise Fault
        if max(shape) > MAX_HIDDEN:
            ctx.error(SHAPE_MISMATCH, f"`{label}` has shape {list(shape)}; no model steerc reads is wider than "
                      f"{MAX_HIDDEN:,}", where, help="a matrix for a site is [rows, the site's width]")
            raise Fault
        return f.read64(name, before=lambda count: ctx.spend(count, where))
    except VectorFileError as exc:
        ctx.error(exc.code, exc.message, where, help=exc.help)
        raise Fault from None


def load_sae(ctx: CheckContext, call: ir.Call):
    """The :class:`~steerc.io.sae.SAE` of ``sae("folder")``: the folder inside the project root (as every
    file a program names), its ``cfg.json`` and its weights' header read and checked; no tensor data is read
    here (a feature's row or column is read when a program uses it). Every fault is at the path."""
    from steerc.io.sae import CONFIG, WEIGHTS, SaeError, read_sae

    path = call.args[0]
    real = resolve_path(ctx, path, "SAE folder", folder=True)
    key = ("sae", real)
    cached = ctx.file_cache.get(key)
    if cached is None:
        try:
            cached = read_sae(real, root=ctx.root)
        except SaeError as exc:
            cached = exc
        except OSError as exc:
            cached = SaeError(INVALID_VECTOR_FILE, f"cannot read the SAE folder ({exc.strerror})")
        ctx.file_cache[key] = cached
    if isinstance(cached, SaeError):
        message = cached.message
        if cached.file in (CONFIG, WEIGHTS) and f"`{cached.file}`" not in message:
            message = f"`{cached.file}`: {message}"
        ctx.error(cached.code, f"the SAE folder `{path.value}`: {message}", path.span, help=cached.help)
        raise Fault
    return cached


def sae_row(ctx: CheckContext, sae, index: int, span):
    """``W_dec[index]`` of ``sae`` as a float64 vector (only that row is read), paid for as any vector is."""
    from steerc.io.sae import SaeError

    ctx.spend(sae.d_in, span)
    try:
        row = sae.decoder_row(index)
    except SaeError as exc:
        ctx.error(exc.code, exc.message, span, help=exc.help)
        raise Fault from None
    except OSError as exc:  # the file went away or became unreadable since its header was read
        ctx.error(INVALID_VECTOR_FILE, f"cannot read `W_dec[{index}]` of the SAE ({exc.strerror})", span)
        raise Fault from None
    if python_floats(ctx):
        return floats.Floats(float(x) for x in row)
    import numpy as np

    return np.asarray(row, dtype=np.float64)


def _record_origin(ctx: CheckContext, f: VectorFile, call: ir.Call) -> None:
    """Remember what ``steerc derive`` recorded about the file, for the provenance pass.

    A control vector's rows are for ``resid_post[N]`` (llama.cpp adds ``direction.N`` to layer ``N``'s
    output), a bank unless ``key=`` picks one row; it records no model the provenance pass could compare.
    """
    if f.kind == "gguf":
        from steerc.io import controlvector as cv

        key = next((k.value.value for k in call.kwargs if k.name == "key"), None)
        ctx.origins[id(call)] = {"site": "resid_post", "per_layer": key in (None, cv.PREFIX)}
    elif getattr(f, "metadata", None):
        origin = f.memo("provenance", lambda: provenance(f.metadata))
        if origin is not None:
            ctx.origins[id(call)] = origin


def _fits_model(ctx: CheckContext, f: VectorFile, path: ir.Str) -> None:
    """A control vector's hint and layers against the model (``model-mismatch`` at the path)."""
    from steerc.io import controlvector as cv

    facts = ctx.facts
    if facts is None:
        return
    hint = f.meta.get("model_hint")
    if hint is not None and not cv.hint_fits(hint, facts):
        ctx.error(
            MODEL_MISMATCH,
            f"`{path.value}` is a control vector for a `{hint}` model ({cv.HINT_KEY}), but the model is "
            f"`{facts.model_type or facts.family}`",
            path.span,
            help="use a control vector made for this model",
        )
        raise Fault
    top = max(f.rows(cv.PREFIX))
    if top >= facts.layers:
        count = f.meta.get("layer_count")
        counted = f" and {cv.COUNT_KEY} = {count:,}" if count is not None else ""
        ctx.error(
            MODEL_MISMATCH,
            f"`{path.value}` has a direction for layer {top} (`{cv.PREFIX}.{top}`{counted}), but the model has "
            f"{facts.layers} layers (0 .. {facts.layers - 1})",
            path.span,
            help="it was made for a model with more layers; use a control vector made for this model",
        )
        raise Fault


def _no_single_vector(ctx: CheckContext, per_layer, path: ir.Str) -> None:
    from steerc.io import controlvector as cv

    if per_layer is not None and not per_layer.value:
        ctx.error(
            SHAPE_MISMATCH,
            f"`{path.value}` is a control vector: one `{cv.PREFIX}.<layer>` vector per layer, not one vector",
            per_layer.span,
            help=f"drop `per_layer=false` to use it as a bank, or pick one layer's vector with "
                 f'key="{cv.PREFIX}.N"',
        )
        raise Fault


def _pick(ctx: CheckContext, f: VectorFile, key: str | None, where, path: ir.Str) -> str:
    names = f.names
    if f.kind == "npy":
        if key is not None:
            ctx.error(
                MISSING_KEY,
                f"a .npy file holds one unnamed array; there is no key `{key}`",
                where,
                help="drop `key=`, or use a .safetensors file for named vectors",
            )
            raise Fault
        return ""
    if key is None:
        if len(names) == 1:
            return names[0]
        ctx.error(
            MISSING_KEY,
            f"`{path.value}` holds {len(names)} tensors; say which with `key=`",
            where,
            help=f"keys: {_listing(names)}",
        )
        raise Fault
    if key not in f.tensors:
        row = _missing_row(f, key, path.value)
        if row is not None:
            ctx.error(MISSING_KEY, row[0], where, help=row[1])
            raise Fault
        ctx.error(
            MISSING_KEY,
            f"no tensor `{key}` in `{path.value}`",
            where,
            help=ctx.suggest(key, lambda: names) or f"keys: {_listing(names)}",
        )
        raise Fault
    return key


def _missing_row(f: VectorFile, key: str, file: str) -> tuple[str, str] | None:
    """(message, help) for ``<bank>.<i>`` where the file has rows ``<bank>.<j>`` but not ``i``: the rows
    there are (``mean_diff.40`` of a 30-row bank: rows 0 to 29), rather than the nearest spelling."""
    head, dot, tail = key.rpartition(".")
    if not dot or not tail.isdigit() or not tail.isascii():
        return None
    rows = sorted(f.rows(head))
    if not rows:
        return None
    spans, start = [], rows[0]
    for prev, cur in zip(rows, rows[1:] + [None]):
        if cur != prev + 1:
            spans.append(f"{start} to {prev}" if prev > start else str(start))
            start = cur
    listed = ", ".join(spans[:6]) + (", ..." if len(spans) > 6 else "")
    count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    return (f"no row {int(tail)} in the bank `{head}` of `{file}`: its rows are {listed} ({count})",
            f'pick a row it has (key="{head}.{rows[len(rows) // 2]}"), or give every layer its own row with '
            f'key="{head}", per_layer=true')


def _bank(ctx: CheckContext, f: VectorFile, key: str | None, where, path: ir.Str) -> PerLayer:
    label = key or os.path.splitext(os.path.basename(path.value))[0]
    name = key if key is not None else ("" if f.kind == "npy" or len(f.tensors) != 1 else next(iter(f.tensors)))
    if name in f.tensors:
        info = f.tensors[name]
        if len(info.shape) != 2:
            ctx.error(
                SHAPE_MISMATCH,
                f"a per-layer bank is a [layers, width] tensor; `{label}` has shape {list(info.shape)}",
                where,
            )
            raise Fault
        rows, width = info.shape
        most = _most_rows(ctx)
        if rows > most:  # before anything is read or allocated
            limit = (f", but the model has {most} layers" if ctx.facts is not None
                     else f"; no model steerc reads has more than {most:,} layers")
            ctx.error(
                SHAPE_MISMATCH,
                f"`{label}` has {rows:,} rows{limit}",
                where,
                help="a per-layer bank has one row per layer of the model it is made for",
            )
            raise Fault
        _width_ok(ctx, width, label, where)
        data = _read(ctx, f, name, where)
        return PerLayer(f.memo(("bank", name), lambda: _rows_of(data, rows, width)), rows, label)
    if key is None:
        ctx.error(
            MISSING_KEY,
            f"`{path.value}` holds {len(f.tensors)} tensors and no single [layers, width] bank; say which with `key=`",
            where,
            help=f"keys: {_listing(f.names)}",
        )
        raise Fault
    most = _most_rows(ctx)
    # Only rows a model can have: `<key>.<i>` with i a layer index below the bound.
    rows = {i: n for i, n in f.rows(key).items() if i < most}
    if not rows:
        ctx.error(
            MISSING_KEY,
            f"no tensor `{key}` and no per-layer keys `{key}.0`, `{key}.1`, ... in `{path.value}`",
            where,
            help=ctx.suggest(key or "", lambda: f.names) or f"keys: {_listing(f.names)}",
        )
        raise Fault
    widths = {f.tensors[n].shape for n in rows.values()}
    if len(widths) != 1 or len(next(iter(widths))) != 1:
        ctx.error(SHAPE_MISMATCH, f"the rows `{key}.<i>` are not vectors of one length", where)
        raise Fault
    _width_ok(ctx, next(iter(widths))[0], f"{key}.<i>", where)
    # Rows are shared by every load of this bank (folded values are never changed in place).
    return PerLayer(f.memo(("rows", key, most), lambda: {i: _read(ctx, f, n, where) for i, n in sorted(rows.items())}),
                    None, label)


def _read(ctx: CheckContext, f: VectorFile, name: str, where):
    """A tensor as float64, read once per file and paid for once (see MAX_VALUES): a numpy array, or
    :class:`~steerc.io.floats.Floats` while :func:`python_floats` says so."""
    count = math.prod(f.tensors[name].shape)
    return f.read64(name, before=lambda count: ctx.spend(count, where), python=python_floats(ctx, count))


def _rows_of(data, count: int, width: int) -> dict:
    """Layer index -> row of a ``[count, width]`` tensor (a 2-D numpy array, or Floats of its entries)."""
    if isinstance(data, floats.Floats):
        return dict(enumerate(floats.rows(data, count, width)))
    return {i: data[i] for i in range(count)}


def python_floats(ctx: CheckContext, more: int = 0) -> bool:
    """Whether folding computes in plain Python (:mod:`steerc.io.floats`) rather than numpy: when only the
    diagnostics are wanted and the vector entries computed so far, with ``more``, are at most PYTHON_MAX.

    Past that, numpy's import costs less than the Python loops would, and everything after is numpy's."""
    return ctx.diagnostics_only and MAX_VALUES - ctx.values_left + more <= floats.PYTHON_MAX


def _most_rows(ctx: CheckContext) -> int:
    """How many rows a bank may have: the model's layers, or any model's without one."""
    return ctx.facts.layers if ctx.facts is not None else MAX_LAYERS


def _width_ok(ctx: CheckContext, width: int, label: str, where) -> None:
    if width > MAX_HIDDEN:
        ctx.error(
            SHAPE_MISMATCH,
            f"`{label}` has {width:,} entries; no model steerc reads is wider than {MAX_HIDDEN:,}",
            where,
            help="steering vectors must be made for the model (as wide as its hidden size)",
        )
        raise Fault


def _listing(names) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


__all__ = ["FORMATS", "load_matrix", "load_sae", "load_vector", "sae_row", "open_file", "python_floats", "resolve_path"]
