"""Helpers the subcommands share: reading inputs, options, printing diagnostics."""

from __future__ import annotations

import math
import os
import sys

from steerc.cli import EXIT_ERRORS, NotAProgram, UsageError
from steerc.cli.report import Report, print_json
from steerc.core.jsonio import dumps as json_dumps  # strict JSON (spec/json.md)
from steerc.diagnostics.codes import MODEL_WITHOUT_WEIGHTS
from steerc.project.session import UnusableModel, check_options, facts_or_diagnostic


def read_text(path: str) -> str:
    """A program's text (``-``: standard input's bytes), decoded and its line ends normalized by
    ``steerc.core.source.decode_program``, as every path does; at most MAX_SOURCE_BYTES + 1 bytes are read.

    A longer file gives a text longer than the limit (never a shorter one), which the
    parser then refuses with a ``limit-exceeded`` diagnostic. Bytes that are not UTF-8 raise
    :class:`~steerc.cli.NotAProgram` with their ``invalid-encoding`` diagnostic.
    """
    from steerc.core.source import read_program, read_stream
    from steerc.diagnostics import not_utf8

    if path == "-":
        try:
            return read_stream(sys.stdin)
        except UnicodeDecodeError as exc:
            raise NotAProgram(*not_utf8("<stdin>", exc)) from None
        except OSError as exc:
            raise UsageError(f"cannot read standard input: {exc}") from None
    try:
        return read_program(path)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder, not a .steer file") from None
    except UnicodeDecodeError as exc:
        raise NotAProgram(*not_utf8(path, exc, os.path.abspath(path))) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


MODEL_HELP = "a Hugging Face model folder, its config.json, a facts JSON, or a model name (smollm2)"


def add_program_options(cmd, model_help: str = MODEL_HELP, model_required: bool = False) -> None:
    """--model, --root and --set. A required --model may come from steer.toml instead (see `required`)."""
    where = "required: here or as `model` in steer.toml" if model_required else "default: `model` in steer.toml"
    cmd.add_argument("--model", metavar="PATH", help=f"{model_help} ({where})")
    cmd.add_argument("--root", metavar="DIR", help="project root for paths in the program (default: nearest steer.toml)")
    cmd.add_argument(
        "--set",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override a param: --set strength=6 (repeatable; wins over steer.toml's [params])",
    )


class LazyChoices:
    """An option's ``choices`` read from a registry when argparse first needs them (a value to check, help or
    an error to print), not when the parser is built: ``steerc check`` without ``--target`` never imports the
    target registry. ``load()`` returns the names.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="p")
    >>> parser.add_argument("--pick").choices = LazyChoices(lambda: ("a", "b"))
    >>> parser.parse_args(["--pick", "b"]).pick, "{a,b}" in parser.format_help()
    ('b', True)
    """

    def __init__(self, load):
        self._load = load

    def __contains__(self, value) -> bool:
        return value in self._load()

    def __iter__(self):
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def parse_overrides(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set takes NAME=VALUE, got {item!r}")
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--set {name}: {value!r} is not a number") from None
        if not math.isfinite(number):
            raise UsageError(f"--set {name}: the value must be finite")
        out[name.strip()] = number
    return out


def options_from(args, project=None, **extra):
    """The check Options of the command line, with the defaults of ``project`` (its ``steer.toml``)."""
    overrides = parse_overrides(getattr(args, "overrides", []))
    origins, sources = {}, {}
    if overrides:
        src, spans = argument_spans(args, "--set")
        items = getattr(args, "overrides", [])
        if len(spans) == len(items):
            origins.update((item.partition("=")[0].strip(), span) for item, span in zip(items, spans))
            sources[src.name] = src
    return check_options(project, root=root_of(args), overrides=overrides, origins=origins, sources=sources,
                         **extra)


def facts_from(args, project=None):
    """The ModelFacts for --model, else for the ``model`` of ``project``'s steer.toml; None without either.

    An unreadable --model is a usage error (exit 2); a model of a family steerc
    does not know is a diagnostic (``unknown-family``), printed in the
    command's ``--format``, and exits 1, as does an unreadable steer.toml
    ``model`` (``invalid-config``, at its value).
    """
    facts, report = model_facts(args, project)
    if report is not None:
        if getattr(args, "format", "text") == "json":
            from steerc.diagnostics import to_json_dict

            print_json({"diagnostics": [to_json_dict(d) for d in report.diagnostics], "files": [], "errors": 1,
                        "warnings": 0})
        else:
            print_diagnostics(report)
        raise SystemExit(1)
    return facts


def model_facts(args, project=None):
    """(facts, None), (None, None) without a model, or (None, a Report of why the model cannot be used)."""
    if getattr(args, "model", None) is not None:  # `--model ''` names no model: an error, never "no model"
        facts, diagnostic, sources = load_facts_or_diagnostic(args.model)
    elif project is not None and project.model:
        facts, diagnostic, sources = load_facts_or_diagnostic(project.model, project)
    else:
        return None, None
    return facts, None if diagnostic is None else Report([diagnostic], sources)


def chosen(args, project, key: str, default=None):
    """``--KEY`` from the command line, else ``KEY`` from ``project``'s steer.toml, else ``default``."""
    value = getattr(args, key, None)
    if value is None and project is not None:
        value = getattr(project, key)
    return default if value is None else value


def required(args, project, key: str) -> str:
    """``chosen`` for an option the command cannot do without: a usage error when neither gives it."""
    value = chosen(args, project, key)
    if value is None:
        raise UsageError(f"--{key} is required (on the command line, or as `{key}` under [defaults] in steer.toml)")
    return value


def checked_project(args, path: str):
    """``project_for``, its steer.toml's diagnostics printed on standard error; exits 1 when they are errors."""
    project = project_for(args, path)
    if project.diagnostics:
        print_diagnostics(Report(list(project.diagnostics), project.sources))
    if not project.ok:
        raise SystemExit(1)
    return project


def project_for(args, path: str):
    """The project (``steer.toml``) of the program at ``path`` ('-': standard input) under ``--root``."""
    from steerc.project import project_of

    return project_of(None if path == "-" else path, root_of(args))


def root_of(args) -> str | None:
    """``--root``, checked to be a folder; None when not given."""
    root = getattr(args, "root", None)
    if root is not None and not os.path.isdir(root):
        raise UsageError(f"--root {root}: no such folder")
    return root


def print_diagnostics(report, file=None) -> None:
    """Render a report's diagnostics as text, on standard error unless ``file`` says otherwise."""
    from steerc.diagnostics import capped, render_text

    for d in capped(report.diagnostics):
        print(render_text(d, report.sources), file=file or sys.stderr)


def load_facts_or_diagnostic(path: str, project=None):
    """(facts, None, {}) or (None, the diagnostic why the model cannot be used, its sources)
    (:func:`steerc.project.session.facts_or_diagnostic`); a bare path that cannot be read is a usage error,
    and a bundled name a folder shadows gets a note on standard error."""
    from steerc.facts.named import shadowing  # with a model only (steerc.facts is read with it)

    taken = shadowing(path)
    if taken is not None:
        print(f"note: {taken}", file=sys.stderr)
    try:
        return facts_or_diagnostic(path, project)
    except UnusableModel as exc:
        raise UsageError(str(exc)) from None


def argument_source(args, flag: str):
    """(a ``<command line>`` Source, the span of ``flag``'s value in it), for diagnostics about an argument.

    >>> import argparse
    >>> src, span = argument_source(argparse.Namespace(argv=["run", "x.steer", "--model", "m"], command="run"),
    ...                             "--model")
    >>> src.text, (span.column, span.end_column)
    ('steerc run x.steer --model m', (28, 29))
    """
    src, spans = argument_spans(args, flag)
    return src, spans[0] if spans else src.span(0, len(src.text))


def argument_spans(args, flag: str):
    """(a ``<command line>`` Source, the span of each value of ``flag`` in it, in order).

    >>> import argparse
    >>> src, spans = argument_spans(argparse.Namespace(argv=["check", "--set", "a=1", "--set=b=2"]), "--set")
    >>> [src.text[s.start:s.end] for s in spans]
    ['a=1', 'b=2']
    """
    import shlex

    from steerc.core.source import Source

    words = ["steerc", *(getattr(args, "argv", None) or [])]
    text, places = "", []
    for i, word in enumerate(words):
        quoted = shlex.quote(word)
        at = len(text) + (1 if text else 0)
        text = f"{text} {quoted}" if text else quoted
        if i > 0 and words[i - 1] == flag:
            places.append((at, at + len(quoted)))
        elif word.startswith(flag + "="):
            quote = int(quoted != word)  # shlex.quote wrapped the word in '...'
            places.append((at + len(flag) + 1 + quote, at + len(quoted) - quote))
    src = Source("<command line>", text)
    return src, [src.span(a, max(b, a + 1)) for a, b in places]


def argument_word(args, word: str):
    """(a ``<command line>`` Source, the span of the first argument that is ``word``), for a diagnostic about a
    positional argument (a file or a glob); the whole line when it is not found.

    >>> import argparse
    >>> src, span = argument_word(argparse.Namespace(argv=["check", "a.steer", "p/**/*.steer"]), "p/**/*.steer")
    >>> src.text[span.start:span.end]
    "'p/**/*.steer'"
    """
    import shlex

    from steerc.core.source import Source

    words = ["steerc", *(getattr(args, "argv", None) or [])]
    text = " ".join(shlex.quote(w) for w in words)
    src = Source("<command line>", text)
    at = len(shlex.quote(words[0]))
    for w in words[1:]:
        quoted = shlex.quote(w)
        at += 1
        if w == word:
            return src, src.span(at, at + len(quoted))
        at += len(quoted)
    return src, src.span(0, len(text))


def config_facts(model_path: str):
    """The model's layout from its config alone (:func:`steerc.runtime.models.config_source`), or None where
    it cannot be read without the weights; a config that fails to read is left to the load, which says why."""
    from steerc.facts import FactsError, load_facts
    from steerc.facts.named import shadowing
    from steerc.runtime.models import config_source

    taken = shadowing(model_path)
    if taken is not None:
        print(f"note: {taken}", file=sys.stderr)
    source = config_source(model_path)
    if source is None:
        return None
    try:
        return load_facts(source)
    except FactsError:
        return None


# ------------------------------------------------- data commands (derive, eval)


def fail_with(args, diagnostics, sources) -> int:
    """Print ``diagnostics`` as every command does (at most MAX_REPEATS per code, the last counting the rest)."""
    from steerc.diagnostics import capped, to_json_dict

    if getattr(args, "format", "text") == "json":  # commands without --format print text
        print(json_dumps({"diagnostics": [to_json_dict(d) for d in capped(diagnostics)]}, indent=2))
    else:
        print_diagnostics(Report(list(diagnostics), sources))
    return EXIT_ERRORS


def data_source(path: str):
    """A data file as a Source (a missing or unreadable one is a usage error)."""
    from steerc.derive.data import read_source

    try:
        return read_source(path)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def model_path_for(args) -> str:
    """The weights to load for --model (one without weights is a `model-without-weights` diagnostic)."""
    from steerc.runtime.models import ModelNotRunnable, runnable_path

    try:
        path = runnable_path(args.model)
    except ModelNotRunnable as problem:
        from steerc.diagnostics import Diagnostic, Note

        source, span = argument_source(args, "--model")
        raise SystemExit(fail_with(args, [Diagnostic.error(MODEL_WITHOUT_WEIGHTS, problem.message, span,
                                                           help=problem.help,
                                                           notes=tuple(Note(n) for n in problem.notes))],
                                   {source.name: source}))
    if not os.path.exists(path):
        from steerc.facts.named import not_found

        raise UsageError(f"--model {args.model}: {not_found(args.model)}")
    return path


def load_unchecked(path: str, command: str = "derive"):
    """(model, tokenizer) of ``path`` (without torch, or unloadable: a usage error)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError(f"`steerc {command}` needs torch and transformers: pip install 'steerc[hf]'") from None
    from steerc.runtime.models import load_model

    try:
        return load_model(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load {path}: {exc}") from None
