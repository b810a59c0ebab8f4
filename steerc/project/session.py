"""What a check of one file is set up with, alike for the command line and the language server: the
check options (the project's ``steer.toml`` params under the overrides given) and the model's facts, or
the diagnostic that says why the model cannot be used."""

from __future__ import annotations

import re

from steerc.core.source import Source
from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import INVALID_CONFIG
from steerc.passes.context import Options


class UnusableModel(ValueError):
    """A model path named outright (not by a steer.toml) that cannot be read as a model."""


def check_options(project=None, *, root=None, overrides=None, origins=None, sources=None, **extra) -> Options:
    """Options with ``project``'s params as defaults; ``origins`` and ``sources`` say where each
    override was written (for diagnostics)."""
    all_origins, all_sources = {}, {}
    if project is not None:
        all_origins.update(project.param_spans())
        all_sources.update(project.sources)
    all_origins.update(origins or {})
    all_sources.update(sources or {})
    return Options(root=root, overrides=dict(overrides or {}),
                   project_params=dict(project.params) if project else {}, origins=all_origins,
                   sources=all_sources, **extra)


def facts_or_diagnostic(path: str, project=None):
    """(facts, None, {}) or (None, an ``unknown-family`` or ``invalid-model`` diagnostic, its sources).

    A model that cannot be read raises :class:`UnusableModel`, or for the ``model`` of a ``project``'s
    steer.toml is an ``invalid-config`` diagnostic at its value.
    """
    from steerc.facts import FactsError, load_facts  # with a model only

    try:
        return load_facts(path), None, {}
    except FactsError as exc:
        if exc.code is None and project is None:
            raise UnusableModel(f"{path or 'an empty path'}: {exc}") from None
        if exc.code is None:
            return None, Diagnostic.error(INVALID_CONFIG, f"model {path}: {exc}", project.spans["model"],
                                          help="give a model folder, its config.json or a facts JSON"), \
                project.sources
        sources, span = {}, None
        if exc.file and exc.text is not None:
            src = Source(exc.file, exc.text, exc.file)
            sources[src.name] = src
            span = needle_span(src, exc.text, exc.needle)
        return None, Diagnostic.error(exc.code, exc.message, span), sources


def needle_span(src, text: str, needle: str | None):
    """The span of ``needle`` in a config: for a quoted key, of its value (the last occurrence of the
    key, which is the one a JSON reader keeps)."""
    if not needle:
        return None
    if needle.startswith('"') and needle.endswith('"'):
        value = r'("(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|true|false|null|\[|\{)'
        matches = list(re.finditer(re.escape(needle) + r"\s*:\s*" + value, text))
        if matches:
            m = matches[-1]
            end = m.end(1) if m.group(1) not in ("[", "{") else m.start(1) + 1
            return src.span(m.start(1), end)
    at = text.find(needle)
    return src.span(at, at + len(needle)) if at >= 0 else None
