"""``steerc fmt FILE|FOLDER|GLOB... [--check] [--diff]``: rewrite programs in the canonical layout."""

from __future__ import annotations

import difflib
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, NotAProgram, UsageError
from steerc.cli.common import read_text


def add_arguments(cmd) -> None:
    cmd.add_argument("files", nargs="+", metavar="FILE",
                     help=".steer files, folders (every .steer below) or quoted globs, as check takes them "
                          "('-': standard input to standard output)")
    cmd.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not formatted")
    cmd.add_argument("--diff", action="store_true", help="print what would change instead of writing")


def run(args) -> int:
    from steerc.cli.inputs import expand
    from steerc.core.source import Source
    from steerc.diagnostics import capped, render_text
    from steerc.frontend.fmt import MeaningChanged, format_source

    status = EXIT_OK
    counts = {"clean": 0, "changed": 0, "bad": 0}
    for path in expand(args.files, args):
        try:
            text = read_text(path)
        except NotAProgram as exc:  # its diagnostic, and the other files are formatted
            print(render_text(exc.diagnostic, {exc.source.name: exc.source}), file=sys.stderr)
            status = EXIT_ERRORS
            counts["bad"] += path != "-"
            continue
        source = Source("<stdin>" if path == "-" else path, text)
        try:
            formatted, diagnostics = format_source(source)
        except MeaningChanged:
            raise UsageError(f"formatting {path} would change what it means; nothing was written "
                             "(a bug in steerc fmt: please report it with the file)") from None
        if formatted is None:
            for d in capped(diagnostics):
                print(render_text(d, {source.name: source}), file=sys.stderr)
            status = EXIT_ERRORS
            counts["bad"] += path != "-"
            continue
        if path == "-":
            sys.stdout.write(formatted)
            continue
        counts["clean" if formatted == text else "changed"] += 1
        if formatted == text:
            continue
        elif args.check or args.diff:
            status = EXIT_ERRORS if args.check else status
            if args.diff:
                sys.stdout.writelines(difflib.unified_diff(
                    text.splitlines(True), formatted.splitlines(True), path, f"{path} (formatted)"))
            else:
                print(f"would reformat {path}")
        else:
            try:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(formatted)
            except OSError as exc:
                raise UsageError(f"cannot write {path}: {exc}") from None
            print(f"reformatted {path}")
    if any(counts.values()):
        print(tally(counts, dry=args.check or args.diff), file=sys.stderr)
    return status


def tally(counts: dict, dry: bool) -> str:
    """The last line, on standard error: how many files were looked at, and what became of them.

    >>> tally({"clean": 3, "changed": 0, "bad": 0}, dry=True)
    '3 files already formatted'
    >>> tally({"clean": 1, "changed": 1, "bad": 1}, dry=False)
    '1 file reformatted, 1 file already formatted, 1 file not formatted (errors above)'
    """
    def files(n: int) -> str:
        return f"{n} file{'' if n == 1 else 's'}"

    parts = []
    if counts["changed"]:
        parts.append(f"{files(counts['changed'])} {'would be reformatted' if dry else 'reformatted'}")
    if counts["clean"]:
        parts.append(f"{files(counts['clean'])} already formatted")
    if counts["bad"]:
        parts.append(f"{files(counts['bad'])} not formatted (errors above)")
    return ", ".join(parts)
