"""``steerc parse FILE --emit ast|ir``."""

from __future__ import annotations

import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK
from steerc.cli.common import read_text


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file ('-' reads standard input)")
    cmd.add_argument("--emit", choices=("ast", "ir"), default="ir",
                     help="ast: the Lark parse tree; ir: the program IR as JSON (default)")


def run(args) -> int:
    from steerc.core.source import Source
    from steerc.diagnostics import Diagnostics, capped, render_text

    text = read_text(args.file)
    source = Source("<stdin>" if args.file == "-" else args.file, text)
    diagnostics = Diagnostics()
    if args.emit == "ast":
        from steerc.frontend.parser import SyntaxDiagnostic, parse_tree

        try:
            tree, _ = parse_tree(source)
        except SyntaxDiagnostic as exc:
            diagnostics.add(exc.diagnostic)
        else:
            sys.stdout.write(tree.pretty())
    else:
        from steerc.frontend import parse
        from steerc.ir.serialize import dumps

        program = parse(source, diagnostics)
        if program is not None and not diagnostics.has_errors:
            sys.stdout.write(dumps(program))
    for d in capped(list(diagnostics)):
        print(render_text(d, {source.name: source}), file=sys.stderr)
    return EXIT_ERRORS if diagnostics.has_errors else EXIT_OK
