"""``steerc explain FILE --model PATH [--target T] [--format text|json]``."""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK
from steerc.cli.common import (
    add_program_options,
    checked_project,
    chosen,
    facts_from,
    options_from,
    print_json,
    read_text,
    required,
)
from steerc.project import TARGET_NAMES


def add_arguments(cmd) -> None:
    cmd.add_argument("file", metavar="FILE", help="a .steer file")
    add_program_options(cmd, model_required=True)
    cmd.add_argument("--target", choices=TARGET_NAMES,
                     help="whose hooks to show (default: `target` in steer.toml, else hf)")
    cmd.add_argument("--format", choices=("text", "json"), default="text",
                     help="text for reading (default), json for tools (spec/json.md)")


def run(args) -> int:
    from steerc.api import check_source
    from steerc.explain import explain, render
    from steerc.targets import check_target

    project = checked_project(args, args.file)
    required(args, project, "model")
    facts = facts_from(args, project)
    target = chosen(args, project, "target", "hf")
    result = check_source(read_text(args.file), args.file, path=os.path.abspath(args.file),
                          options=options_from(args, project), facts=facts)
    check_target(result, target)
    if not result.ok:
        print(result.render(), file=sys.stderr)
        return EXIT_ERRORS
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    doc = explain(result, target)
    if args.format == "json":
        print_json(doc)
    else:
        sys.stdout.write(render(doc))
    return EXIT_OK
