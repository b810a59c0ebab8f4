"""``steer.toml``: the mark of a project root, and defaults for the command line.

A project is the folder of a ``steer.toml`` (see :mod:`steerc.core.paths`). The
file may be empty, or hold::

    [defaults]
    model = "models/tiny-llama"   # a model folder, config.json or facts JSON, relative to this
                                  # file's folder; or a model name (smollm2)
    target = "vllm"               # hf, vllm or serve

    [params]
    strength = 2                  # the value of `param strength` in every program below that declares it

The command line wins over ``steer.toml``, which wins over the program's
own defaults: ``--model`` > ``model``, ``--target`` > ``target``, ``--set
strength=3`` > ``[params] strength`` > ``param strength = 1``. A name under
``[params]`` that a program does not declare is left alone (the file serves
every program of the project). Anything else in the file, and a file that
is not TOML, is an ``invalid-config`` diagnostic pointing into it.

>>> import os, tempfile
>>> top = tempfile.mkdtemp()
>>> with open(os.path.join(top, "steer.toml"), "w") as fh:
...     _ = fh.write('[defaults]\\ntarget = "vllm"\\n[params]\\nstrength = 2\\n')
>>> p = project_at(top)
>>> p.target, p.params, p.diagnostics
('vllm', {'strength': 2.0}, ())
>>> with open(os.path.join(top, "steer.toml"), "w") as fh:
...     _ = fh.write('[defaults]\\ntraget = "vllm"\\n')
>>> d, = project_at(top).diagnostics
>>> d.code, d.message, (d.span.line, d.span.column, d.span.end_column), d.help
('invalid-config', '[defaults] has no key `traget`', (2, 1, 7), 'did you mean `target`?')
"""

from __future__ import annotations

import os
import re

from steerc.core.limits import FLOAT32_MAX, MAX_NESTING, MAX_NUMBER_CHARS, MAX_SOURCE_BYTES
from steerc.core.paths import MARKER, find_root
from steerc.core.record import field, frozen
from steerc.core.source import Source, Span, read_program
from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import INVALID_CONFIG, LIMIT_EXCEEDED
from steerc.diagnostics.suggest import did_you_mean
from steerc.project.locate import locate, long_number, scan, too_deep
from steerc.project.toml import tomllib

__all__ = ["Project", "display_name", "project_at", "project_of"]

DEFAULT_KEYS = ("model", "target")
TABLES = ("defaults", "params")
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOML_POSITION = re.compile(r" \(at (?:line (\d+), column (\d+)|end of document)\)$")


@frozen
class Project:
    """A project root and what its ``steer.toml`` sets (nothing, for a root without one)."""

    root: str  # absolute, symbolic links resolved
    file: str | None = None  # its steer.toml, absolute
    source: Source | None = None
    model: str | None = None  # an absolute path, or a model name
    target: str | None = None
    params: dict[str, float] = field(factory=dict)
    spans: dict[str, Span] = field(factory=dict)  # "model", "target", "params.NAME": where each value is
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)

    @property
    def sources(self) -> dict[str, Source]:
        return {self.source.name: self.source} if self.source is not None else {}

    def param_spans(self) -> dict[str, Span]:
        return {name: self.spans[f"params.{name}"] for name in self.params}


def project_of(path: str | None, root: str | None = None) -> Project:
    """The project of the program at ``path`` (None: standard input, found from the working directory);
    ``root`` (``--root``) names the root outright."""
    if root is None:
        root = find_root(os.path.dirname(os.path.abspath(path)) if path else os.getcwd())
    return project_at(root)


def project_at(root: str) -> Project:
    """The project whose root is ``root``, its ``steer.toml`` read and checked."""

    root = os.path.realpath(root)
    file = os.path.join(root, MARKER)
    if not os.path.isfile(file):
        return Project(root)
    name = display_name(file)
    try:
        text = read_program(file)
    except (OSError, UnicodeDecodeError) as exc:
        source = Source(name, "", file)
        problem = "is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else f"cannot be read ({exc})"
        return Project(root, file, source, diagnostics=(_error(f"steer.toml {problem}", source.span(0, 0)),))
    source = Source(name, text, file)
    if len(text) > MAX_SOURCE_BYTES:
        d = Diagnostic.error(LIMIT_EXCEEDED, f"steer.toml is larger than {MAX_SOURCE_BYTES:,} bytes",
                             source.span(0, 0))
        return Project(root, file, source, diagnostics=(d,))
    deep = too_deep(text, MAX_NESTING)
    if deep is not None:
        d = Diagnostic.error(LIMIT_EXCEEDED, f"steer.toml nests arrays or tables more than {MAX_NESTING} deep",
                             source.span(deep, deep + 1))
        return Project(root, file, source, diagnostics=(d,))
    long = long_number(text, MAX_NUMBER_CHARS)
    if long is not None:
        d = Diagnostic.error(LIMIT_EXCEEDED, f"a value in steer.toml is longer than {MAX_NUMBER_CHARS} characters",
                             source.span(*long), help="params are float32: 17 significant digits are more than enough")
        return Project(root, file, source, diagnostics=(d,))
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Project(root, file, source, diagnostics=(_syntax_error(source, str(exc)),))
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:  # the reader's own limits
        message = f"steer.toml cannot be read: {str(exc)[:200] or type(exc).__name__}"
        return Project(root, file, source, diagnostics=(_error(message, source.span(0, min(1, len(text)))),))
    return _Reader(root, source).read(data)


def display_name(path: str) -> str:
    """How diagnostics name a file steerc found itself: relative to the working directory when under it."""
    rel = os.path.relpath(path)
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _error(message: str, span: Span, **kw) -> Diagnostic:
    return Diagnostic.error(INVALID_CONFIG, message, span, **kw)


def _syntax_error(source: Source, message: str) -> Diagnostic:
    m = _TOML_POSITION.search(message)
    if m and m.group(1):
        start = source.offset(int(m.group(1)), int(m.group(2)))
    else:
        start = len(source.text)
    text = message[: m.start()] if m else message
    end = start + 1 if source.text[start : start + 1] not in ("", "\n") else start  # a caret, not a line break
    return _error(f"steer.toml is not valid TOML: {text[:1].lower()}{text[1:]}", source.span(start, end),
                  help="see spec/project.md for what steer.toml holds")


class _Reader:
    """Checks the parsed file against the schema, collecting values and diagnostics."""

    def __init__(self, root: str, source: Source):
        self.root, self.source = root, source
        self.spots = scan(source.text)
        self.values: dict[str, object] = {"params": {}}
        self.spans: dict[str, Span] = {}
        self.diagnostics: list[Diagnostic] = []

    def read(self, data: dict) -> Project:
        for key, value in data.items():
            if key not in TABLES:
                self.fail((key,), f"steer.toml has no `{key}` table: it takes [defaults] and [params]",
                          suggest=(key, TABLES))
            elif not isinstance(value, dict):
                self.fail((key,), f"`{key}` must be a table ([{key}]), got {_kind(value)}", value=True)
            else:
                getattr(self, f"_{key}")(value)
        return Project(self.root, self.source.path, self.source, self.values.get("model"),
                       self.values.get("target"), self.values["params"], self.spans, tuple(self.diagnostics))

    def _defaults(self, table: dict) -> None:
        for key, value in table.items():
            path = ("defaults", key)
            if key not in DEFAULT_KEYS:
                self.fail(path, f"[defaults] has no key `{key}`", suggest=(key, DEFAULT_KEYS),
                          help="it takes `model` and `target`")
            elif not isinstance(value, str) or not value:
                self.fail(path, f"`{key}` must be a non-empty string, got {_kind(value)}", value=True)
            elif key == "target":
                from steerc.targets.registry import TARGET_NAMES  # the registry, when a target is named

                if value in TARGET_NAMES:
                    self.keep(path, key, value)
                else:
                    self.fail(path, f"`target` must be one of {', '.join(TARGET_NAMES)}, got {_shown(value)}",
                              value=True, suggest=(value, TARGET_NAMES))
            else:
                self._model(path, value)

    def _model(self, path: tuple[str, ...], value: str) -> None:
        from steerc.facts.named import lookup, names

        resolved = os.path.normpath(os.path.join(self.root, value))
        if lookup(value, self.root) is not None:  # a folder that holds no model does not hide the name
            self.keep(path, "model", value)
        elif os.path.exists(resolved):
            self.keep(path, "model", resolved)
        else:
            self.fail(path, f"model {_shown(value)}: no such file or folder next to steer.toml, and not a model "
                      f"name ({names()})", value=True,
                      help="give a model folder, its config.json or a facts JSON, relative to steer.toml's folder")

    def _params(self, table: dict) -> None:
        import math


        for key, value in table.items():
            path = ("params", key)
            if not _PARAM_NAME.match(key):
                self.fail(path, f"`{key}` is not a param name (letters, digits and `_`, not starting with a digit)")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"param `{key}` must be a number, got {_kind(value)}", value=True)
            elif isinstance(value, float) and not math.isfinite(value):
                self.fail(path, f"param `{key}` must be a finite number, got {value}", value=True)
            elif abs(value) > FLOAT32_MAX:  # compared exactly: a huge int is never made a float
                self.fail(path, f"param `{key}` does not fit float32 (largest {FLOAT32_MAX:.6g})", value=True,
                          help="steering values are float32 on every target, as the model's activations are")
            else:
                self.values["params"][key] = float(value)
                self.spans[f"params.{key}"] = self.span(path, value=True)

    def keep(self, path: tuple[str, ...], key: str, value) -> None:
        self.values[key] = value
        self.spans[key] = self.span(path, value=True)

    def span(self, path: tuple[str, ...], value: bool = False) -> Span:
        at = locate(self.spots, path, value)
        if at is None:
            return self.source.whole_line(1)
        return self.source.span(*at)

    def fail(self, path: tuple[str, ...], message: str, value: bool = False, suggest=None, help=None) -> None:
        if suggest is not None:
            help = did_you_mean(*suggest) or help
        self.diagnostics.append(_error(message, self.span(path, value), help=help))


def _kind(value) -> str:
    """A TOML value's kind, for messages."""
    kinds = ((bool, "a boolean"), (str, "a string"), ((int, float), "a number"), (list, "an array"),
             (dict, "a table"))
    return next((name for t, name in kinds if isinstance(value, t)), "a date or time")


def _shown(value: str) -> str:
    import json

    return json.dumps(value if len(value) <= 80 else value[:77] + "...", ensure_ascii=False)
