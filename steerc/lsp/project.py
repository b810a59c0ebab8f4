"""Which model a document is checked against.

The editor's ``initializationOptions.model`` wins (it is ``--model``);
else the nearest ``steer.toml`` at or above the document's folder that
sets ``model`` at its top level or in ``[check]``; else no model. A relative
path in ``steer.toml`` is relative to that file's folder, and a value that
names no file is passed on as it is (a model name such as ``smollm2``).

>>> import os, tempfile
>>> top = tempfile.mkdtemp()
>>> with open(os.path.join(top, "steer.toml"), "w") as fh:
...     _ = fh.write('[check]\\nmodel = "smollm2"\\n')
>>> os.makedirs(os.path.join(top, "sub"))
>>> model_setting(os.path.join(top, "sub")) == ("smollm2", os.path.join(os.path.realpath(top), "steer.toml"))
True
"""

from __future__ import annotations

import os

from steerc.paths import find_marker


def model_setting(start_dir: str) -> tuple[str, str] | None:
    """(the model, the steer.toml that names it) from the nearest steer.toml above ``start_dir``; None
    when there is none, it sets no model, or it cannot be read (a project that wants more of steer.toml
    replaces this one function)."""
    path = find_marker(start_dir)
    if path is None:
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader in the standard library
        return None
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, ValueError):
        return None
    check = data.get("check")
    value = data.get("model", check.get("model") if isinstance(check, dict) else None)
    if not isinstance(value, str) or not value:
        return None
    near = os.path.join(os.path.dirname(path), value)
    return (near if os.path.exists(near) else value), path


class FactsCache:
    """Model facts by path, read again when the file they came from changes.

    ``get`` gives (facts, None, {}) or, for a model that cannot be used, (None, the diagnostic
    ``steerc check --model`` reports, the sources it points into).
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple] = {}

    def get(self, model: str) -> tuple:
        stamp = _stamp(model)
        hit = self._cache.get(model)
        if hit is None or hit[0] != stamp:
            hit = self._cache[model] = (stamp, *_load(model))
        return hit[1:]


def _load(model: str) -> tuple:
    from steerc.cli import UsageError
    from steerc.cli.common import load_facts_or_diagnostic
    from steerc.diagnostics import Diagnostic

    try:
        return load_facts_or_diagnostic(model)
    except UsageError as exc:
        return None, Diagnostic.error("invalid-model", str(exc), None), {}


def without_model(diagnostic, model: str, origin: str):
    """``diagnostic`` (why ``model`` cannot be used) with a note saying where the model was named."""
    from attrs import evolve

    from steerc.diagnostics import Note

    note = Note(f"the model `{model}` is named by {origin}; the file was checked without a model")
    return evolve(diagnostic, notes=diagnostic.notes + (note,))


def _stamp(model: str):
    for path in (os.path.join(model, "config.json"), model):
        if os.path.isfile(path):
            st = os.stat(path)
            return path, st.st_mtime_ns, st.st_size
    return None
