"""``steerc facts PATH [--backend hf|vllm]``: a model's layout facts and site table as JSON."""

from __future__ import annotations

import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK
from steerc.cli.common import load_facts_or_diagnostic
from steerc.cli.report import print_json


def add_arguments(cmd) -> None:
    cmd.add_argument("path", metavar="PATH",
                     help="a Hugging Face model folder, its config.json, a facts JSON, or a model name (smollm2)")
    cmd.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="whose module names to print")


def run(args) -> int:
    from steerc.facts import facts_document

    facts, diagnostic, sources = load_facts_or_diagnostic(args.path)
    if diagnostic is not None:
        from steerc.diagnostics import render_text

        print(render_text(diagnostic, sources), file=sys.stderr)
        return EXIT_ERRORS
    print_json(facts_document(facts, args.backend))
    return EXIT_OK
