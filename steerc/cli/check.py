"""``steerc check PATH... [--model PATH] [--root DIR] [--set K=V] [--target T] [--format F]``.

PATH is a file, a folder (its ``*.steer`` files, recursively) or a glob
(see :mod:`steerc.cli.inputs`). Each program gets its project: the nearest
``steer.toml`` above it, or ``--root``; the project's defaults (model,
target, params) apply where the command line gives none. A project's
``steer.toml`` diagnostics, and those of a model it names, are reported
once, before its first program.
"""

from __future__ import annotations

import os

from steerc.cli import EXIT_ERRORS, EXIT_OK, NotAProgram
from steerc.cli.common import (
    LazyChoices,
    add_program_options,
    chosen,
    model_facts,
    options_from,
    print_diagnostics,
    project_for,
    read_text,
)
from steerc.cli.report import FORMAT_HELP, FORMATS, Report, write


def add_arguments(cmd) -> None:
    cmd.add_argument("files", nargs="+", metavar="PATH",
                     help=".steer files, folders (their .steer files, recursively) or quoted globs "
                          "('examples/**/*.steer'); '-' reads standard input")
    add_program_options(cmd)
    cmd.add_argument("--target",
                     help="also check what this target can express (default: `target` in steer.toml)"
                     ).choices = LazyChoices(_target_names)  # the registry, only when --target is given
    cmd.add_argument("--format", choices=FORMATS, default="text", help=FORMAT_HELP)
    cmd.add_argument("--xgrammar", action="store_true",
                     help="also validate constraints with xgrammar (slower: it imports torch)")


def _target_names() -> tuple[str, ...]:
    from steerc.targets.registry import TARGET_NAMES

    return TARGET_NAMES


def run(args) -> int:
    from steerc.cli.inputs import expand

    files = expand(args.files, args)
    session = _Session(args)
    if args.model:  # one model for every program: if it cannot be used, nothing is checked against it
        session.facts, report = model_facts(args)
        if report is not None:
            if args.format == "text":
                print_diagnostics(report)
            else:
                write(args.format, [report], [])
            return EXIT_ERRORS
    results = [session.check(path) for path in files]
    errors, _ = write(args.format, session.reports, [r.source.name for r in results])
    return EXIT_ERRORS if errors else EXIT_OK


class _Session:
    """One ``check`` run: projects and models are read once each, their reports kept in order of first use."""

    def __init__(self, args):
        self.args = args
        self.facts = None
        self.projects: dict[str, tuple] = {}  # root -> (project, facts, Options)
        self.reports: list = []

    def check(self, path: str):
        from steerc.api import check_source

        project, facts, options = self._project(path)
        try:
            text = read_text(path)
        except NotAProgram as exc:  # its diagnostic, in every format, and the other files are checked
            from steerc.api import CheckResult

            result = CheckResult(exc.source, None, [exc.diagnostic], sources={exc.source.name: exc.source})
            self.reports.append(result)
            return result
        abspath = None if path == "-" else os.path.abspath(path)
        result = check_source(text, "<stdin>" if path == "-" else path, path=abspath, options=options, facts=facts,
                              diagnostics_only=True)  # the values are not printed: small ones fold without numpy
        target = chosen(self.args, project, "target")
        if target:
            from steerc.targets import check_target

            check_target(result, target)
        self.reports.append(result)
        return result

    def _project(self, path: str) -> tuple:
        project = project_for(self.args, path)
        if project.root not in self.projects:
            if project.diagnostics:
                self.reports.append(Report(list(project.diagnostics), project.sources))
            facts = self.facts
            if not self.args.model:
                facts, report = model_facts(self.args, project)
                if report is not None:  # its programs are checked without a model
                    self.reports.append(report)
            options = options_from(self.args, project, use_xgrammar=self.args.xgrammar)
            self.projects[project.root] = (project, facts, options)
        return self.projects[project.root]
