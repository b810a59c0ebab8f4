"""Values of the data commands (eval, tune, derive, capture) checked before any model loads: seeds, bootstrap
resamples, and the files they write (``-o``, ``--plot``).

A bad number is argparse's usage error (exit 2, naming the flag); a path that cannot be written is an
``invalid-value`` diagnostic under the flag's value on the command line (exit 1), so that a run of minutes
never ends in a traceback at its last step, and nothing is left behind.
"""

from __future__ import annotations

import argparse
import math
import os

from steerc.core.limits import MAX_RESAMPLES, MAX_SEED
from steerc.core.paths import where_to_write

NAME_MAX = 255  # bytes in one folder entry's name (Linux, macOS)


def seed(text: str) -> int:
    """An argparse type: a seed, an integer from 0 to MAX_SEED (spec/eval.md §5, spec/derive.md §4).

    >>> seed("7"), seed("4294967295")
    (7, 4294967295)
    >>> seed("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: a seed is an integer from 0 to 4294967295, not -1
    """
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer from 0 to {MAX_SEED}, not {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"a seed is an integer from 0 to {MAX_SEED}, not {_short(text)}")
    return value


def resamples(text: str) -> int:
    """An argparse type: bootstrap resamples, a whole number from 1 to MAX_RESAMPLES, written as an integer or
    in exponent form (``1e4``).

    >>> resamples("2000"), resamples("1e4")
    (2000, 10000)
    >>> resamples("1e12")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: at most 100000 resamples (an interval's percentiles are stable long before), not 1e12
    """
    words = f"a whole number of resamples from 1 to {MAX_RESAMPLES}"
    try:
        value = int(text.strip())
    except ValueError:  # not an integer, or one of more digits than Python converts (a huge one)
        digits = text.strip().lstrip("+")
        if digits.isdigit():
            raise argparse.ArgumentTypeError(f"at most {MAX_RESAMPLES} resamples, not {_short(text)}") from None
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{words}, not {_short(text)!r}") from None
        if not (math.isfinite(number) and number.is_integer()):
            raise argparse.ArgumentTypeError(f"{words}, not {_short(text)}") from None
        value = int(number)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{words}, not {_short(text)}")
    if value > MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(f"at most {MAX_RESAMPLES} resamples (an interval's percentiles are stable "
                                         f"long before), not {_short(text)}")
    return value


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------------------------------ output files


def output_problem(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (None: it can): an empty path, one that names a folder, a
    file used as a folder, or a folder the user cannot write in. Missing folders are fine: the write makes
    them (their nearest existing ancestor must be a folder the user can write in).

    >>> output_problem(""), output_problem("out/")
    ('an empty path names no file', 'out/ names a folder, not a file')
    """
    if path == "":
        return "an empty path names no file"
    if "\0" in path:
        return "a path cannot hold a NUL character"
    if path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
        return f"{path} names a folder, not a file"
    if os.path.isdir(path):
        return f"{path} is a folder, not a file"
    if len(os.fsencode(os.path.basename(path))) > NAME_MAX:
        return f"the file name is longer than the {NAME_MAX} bytes a folder entry holds"
    if os.path.lexists(path) and not os.path.isfile(path) and not os.path.islink(path):
        return f"{path} is not a regular file"
    return where_to_write(os.path.dirname(os.path.abspath(path)), holding=os.path.basename(path))


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(args, flags: tuple[str, ...], path: str, inputs: tuple[str, ...] = ()) -> None:
    """Refuse (an ``invalid-value`` diagnostic under the flag's value; exit 1) an output ``path`` that cannot
    be written, or that is one of the command's ``inputs`` (its data, its program)."""
    problem, help = output_problem(path), "give a file in a folder you can write in"
    if problem is None:
        same = next((i for i in inputs if i and same_file(path, i)), None)
        if same is not None:
            problem = (f"{path} is this command's input{'' if same == path else f' {same}'}: writing it would "
                       "destroy it")
            help = "write to another file"
    if problem is not None:
        raise SystemExit(refuse(args, flags, problem, help=help))


def plot_path(args, path: str, flags: tuple[str, ...] = ("--plot",), inputs: tuple[str, ...] = ()) -> str:
    """``--plot``'s path as it will be written (``NAME``: ``NAME.png``), checked before the run: matplotlib
    installed (else a usage error), a format it writes here (its extension), and a file that can be written."""
    from steerc.cli import UsageError

    try:
        from steerc.eval.report import DEFAULT_FORMAT, figure_format, plot_formats, try_format

        formats = plot_formats()
    except ImportError:
        raise UsageError(f"{flags[0]} needs matplotlib: pip install 'steerc[plot]'") from None
    if path and not os.path.splitext(path)[1] and not path.endswith(("/", os.sep)) and not os.path.isdir(path):
        path += "." + DEFAULT_FORMAT
    fmt = figure_format(path)
    if fmt not in formats:
        raise SystemExit(refuse(args, flags, f"matplotlib does not write .{fmt} files",
                                help=f"name the plot with one of {', '.join('.' + f for f in formats)}"))
    why = try_format(fmt)
    if why is not None:
        raise SystemExit(refuse(args, flags, f"matplotlib cannot write .{fmt} here: {why}",
                                help=f"use .{DEFAULT_FORMAT}, .pdf or .svg"))
    check_output(args, flags, path, inputs)
    return path


def refuse(args, flags: tuple[str, ...], message: str, help: str | None = None) -> int:
    """Print an ``invalid-value`` error under the last value of any of ``flags`` (the one argparse kept)."""
    from steerc.cli.common import argument_spans, fail_with
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE

    src, spans = None, []
    for flag in flags:
        src, found = argument_spans(args, flag)
        spans += found
    span = max(spans, key=lambda s: s.start) if spans else src.span(0, len(src.text))
    return fail_with(args, [Diagnostic.error(INVALID_VALUE, f"{flags[0]}: {message}", span, help=help)],
                     {src.name: src})
