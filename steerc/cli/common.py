"""Helpers the subcommands share: reading inputs, options, printing diagnostics."""

from __future__ import annotations

import json
import math
import os
import sys

from steerc.cli import UsageError


def read_text(path: str) -> str:
    """A program's text, as text mode reads it (newlines translated); at most MAX_SOURCE_BYTES are read.

    A longer file gives a text longer than the limit (never a shorter one), which the
    parser then refuses with a ``limit-exceeded`` diagnostic.
    """
    from steerc.limits import MAX_SOURCE_BYTES
    from steerc.source import read_program

    if path == "-":
        return sys.stdin.read(MAX_SOURCE_BYTES + 1)
    try:
        return read_program(path)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder, not a .steer file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


MODEL_HELP = "a Hugging Face model folder, its config.json, a facts JSON, or a model name (smollm2)"


def add_program_options(cmd, model_help: str = MODEL_HELP, model_required: bool = False) -> None:
    cmd.add_argument("--model", metavar="PATH", help=model_help, required=model_required)
    cmd.add_argument("--root", metavar="DIR", help="project root for paths in the program (default: nearest steer.toml)")
    cmd.add_argument(
        "--set",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override a param: --set strength=6 (repeatable)",
    )


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


def options_from(args, **extra):
    from steerc.passes.context import Options

    root = getattr(args, "root", None)
    if root is not None and not os.path.isdir(root):
        raise UsageError(f"--root {root}: no such folder")
    return Options(root=root, overrides=parse_overrides(getattr(args, "overrides", [])), **extra)


def facts_from(args):
    """The ModelFacts for --model; None when absent.

    An unreadable model is a usage error (exit 2); a model of a family steerc
    does not know is a diagnostic (``unknown-family``), printed in the
    command's ``--format``, and exits 1.
    """
    path = getattr(args, "model", None)
    if not path:
        return None
    facts, diagnostic, sources = load_facts_or_diagnostic(path)
    if diagnostic is not None:
        if getattr(args, "format", "text") == "json":
            from steerc.diagnostics import to_json_dict

            print_json({"diagnostics": [to_json_dict(diagnostic)], "files": [], "errors": 1, "warnings": 0})
        else:
            from steerc.diagnostics import render_text

            print(render_text(diagnostic, sources), file=sys.stderr)
        raise SystemExit(1)
    return facts


def load_facts_or_diagnostic(path: str):
    """(facts, None, {}) or (None, an ``unknown-family`` diagnostic, its sources)."""
    from steerc.diagnostics import Diagnostic
    from steerc.facts import FactsError, load_facts
    from steerc.source import Source

    try:
        return load_facts(path), None, {}
    except FactsError as exc:
        if exc.code is None:
            raise UsageError(f"{path}: {exc}") from None
        sources, span = {}, None
        if exc.file and exc.text is not None:
            src = Source(exc.file, exc.text, exc.file)
            sources[src.name] = src
            span = _needle_span(src, exc.text, exc.needle)
        return None, Diagnostic.error(exc.code, exc.message, span), sources


def _needle_span(src, text: str, needle: str | None):
    """The span of ``needle`` in a config: for a quoted key, of its value (the last occurrence of the
    key, which is the one a JSON reader keeps)."""
    import re

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


def argument_source(args, flag: str):
    """(a ``<command line>`` Source, the span of ``flag``'s value in it), for diagnostics about an argument.

    >>> import argparse
    >>> src, span = argument_source(argparse.Namespace(argv=["run", "x.steer", "--model", "m"], command="run"),
    ...                             "--model")
    >>> src.text, (span.column, span.end_column)
    ('steerc run x.steer --model m', (28, 29))
    """
    import shlex

    from steerc.source import Source

    argv = list(getattr(args, "argv", None) or [])
    words = ["steerc", *argv]
    text, start, end = "", None, None
    for i, word in enumerate(words):
        quoted = shlex.quote(word)
        at = len(text) + (1 if text else 0)
        text = f"{text} {quoted}" if text else quoted
        if start is None and i > 0 and words[i - 1] == flag:
            start, end = at, at + len(quoted)
        elif start is None and word.startswith(flag + "="):
            start, end = at + len(flag) + 1, at + len(quoted)
    src = Source("<command line>", text)
    if start is None:
        start, end = 0, len(text)
    return src, src.span(start, max(end, start + 1))


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def summary(n_files: int, errors: int, warnings: int) -> str:
    def plural(n, word):
        return f"{n} {word}{'' if n == 1 else 's'}"

    return f"{plural(n_files, 'file')} checked: {plural(errors, 'error')}, {plural(warnings, 'warning')}"
