"""``steerc check FILE... [--model PATH] [--root DIR] [--set K=V] [--format text|json]``."""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK
from steerc.cli.common import add_program_options, facts_from, options_from, print_json, read_text, summary


def add_arguments(cmd) -> None:
    cmd.add_argument("files", nargs="+", metavar="FILE", help=".steer files ('-' reads standard input)")
    add_program_options(cmd)
    cmd.add_argument("--target", choices=("hf", "vllm", "serve", "llamacpp"),
                     help="also check what this target can express")
    cmd.add_argument("--format", choices=("text", "json"), default="text", help="how to print diagnostics")
    cmd.add_argument("--xgrammar", action="store_true",
                     help="also validate constraints with xgrammar (slower: it imports torch)")


def run(args) -> int:
    from steerc.api import check_source

    options = options_from(args, use_xgrammar=args.xgrammar)
    facts = facts_from(args)
    results = []
    for path in args.files:
        text = read_text(path)
        abspath = None if path == "-" else os.path.abspath(path)
        result = check_source(text, "<stdin>" if path == "-" else path, path=abspath, options=options, facts=facts)
        if args.target:
            from steerc.targets import check_target

            check_target(result, args.target)
        results.append(result)
    diagnostics = [d for r in results for d in r.diagnostics]
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    if args.format == "json":
        print_json({
            "diagnostics": [obj for r in results for obj in r.to_json()],
            "files": [r.source.name for r in results],
            "errors": errors,
            "warnings": warnings,
        })
    else:
        out = sys.stdout
        for r in results:
            if r.diagnostics:
                out.write(r.render() + "\n\n")
        out.write(summary(len(results), errors, warnings) + "\n")
    return EXIT_ERRORS if errors else EXIT_OK
