"""The project a document is checked in (its steer.toml), and which model it is checked against.

The editor's ``initializationOptions.model`` wins (it is ``--model``);
else the ``model`` under ``[defaults]`` of the nearest ``steer.toml`` at or
above the document's folder, read by :mod:`steerc.project` as ``steerc
check`` reads it (a relative path is relative to that file's folder; a
value that names no file is a model name such as ``smollm2``); else no
model.

>>> import os, tempfile
>>> top = tempfile.mkdtemp()
>>> with open(os.path.join(top, "steer.toml"), "w") as fh:
...     _ = fh.write('[defaults]\\nmodel = "smollm2"\\n')
>>> os.makedirs(os.path.join(top, "sub"))
>>> project = project_setting(os.path.join(top, "sub"))
>>> (project.model, project.file) == ("smollm2", os.path.join(os.path.realpath(top), "steer.toml"))
True
"""

from __future__ import annotations

import os

from steerc.diagnostics.codes import INVALID_MODEL


def project_setting(start_dir: str):
    """The project of the nearest steer.toml at or above ``start_dir`` (read and checked as ``steerc check``
    reads it, its diagnostics included); None when there is none."""
    from steerc.core.paths import find_marker
    from steerc.project import project_at

    path = find_marker(start_dir)
    return project_at(os.path.dirname(path)) if path is not None else None


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
    from steerc.diagnostics import Diagnostic
    from steerc.project.session import UnusableModel, facts_or_diagnostic

    try:
        return facts_or_diagnostic(model)
    except UnusableModel as exc:
        return None, Diagnostic.error(INVALID_MODEL, str(exc), None), {}


def without_model(diagnostic, model: str, origin: str):
    """``diagnostic`` (why ``model`` cannot be used) with a note saying where the model was named."""
    from steerc.core.record import evolve
    from steerc.diagnostics import Note

    note = Note(f"the model `{model}` is named by {origin}; the file was checked without a model")
    return evolve(diagnostic, notes=diagnostic.notes + (note,))


def _stamp(model: str):
    for path in (os.path.join(model, "config.json"), model):
        if os.path.isfile(path):
            st = os.stat(path)
            return path, st.st_mtime_ns, st.st_size
    return None
