"""How ``steerc check`` prints what it found: ``--format text|json|sarif|github``.

A report is the diagnostics of one program, or of a ``steer.toml`` or a
model that programs use, with the texts their spans point into. Every
format prints every report, in order, at most MAX_REPEATS diagnostics of a
code a report (see :func:`steerc.diagnostics.capped`); the counts cover all.
"""

from __future__ import annotations

import sys

from steerc.core.jsonio import dumps
from steerc.core.record import define, field
from steerc.diagnostics import capped, render_text, to_json_dict

FORMATS = ("text", "json", "sarif", "github")
FORMAT_HELP = ("how to print diagnostics: text (default), json (spec/json.md), sarif (SARIF 2.1.0) or github "
               "(GitHub Actions annotations); see spec/formats.md")


@define
class Report:
    diagnostics: list = field(factory=list)
    sources: dict = field(factory=dict)


def write(fmt: str, reports: list, files: list[str], out=None) -> tuple[int, int]:
    """Print ``reports`` (objects with ``diagnostics`` and ``sources``) in ``fmt``; (errors, warnings)."""
    out = out or sys.stdout
    every = [d for r in reports for d in r.diagnostics]
    errors = sum(d.is_error for d in every)
    warnings = len(every) - errors
    shown = [(d, r.sources) for r in reports for d in capped(r.diagnostics)]
    if fmt == "json":
        print_json({"diagnostics": [to_json_dict(d) for d, _ in shown], "files": files, "errors": errors,
                    "warnings": warnings}, out)
    elif fmt == "sarif":
        from steerc.diagnostics.sarif import to_sarif

        print_json(to_sarif(shown), out)
    else:
        if fmt == "github":
            from steerc.diagnostics.github import workflow_command

            out.writelines(workflow_command(d, sources) + "\n" for d, sources in shown)
        else:
            for r in reports:
                if r.diagnostics:
                    out.write("\n\n".join(render_text(d, r.sources) for d in capped(r.diagnostics)) + "\n\n")
        out.write(summary(len(files), errors, warnings) + "\n")
    return errors, warnings


def print_json(obj, out=None) -> None:
    """``obj`` as indented strict JSON (a float that is not finite as ``{"float": ...}``, spec/json.md)."""
    (out or sys.stdout).write(dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def summary(n_files: int, errors: int, warnings: int) -> str:
    def plural(n, word):
        return f"{n} {word}{'' if n == 1 else 's'}"

    return f"{plural(n_files, 'file')} checked: {plural(errors, 'error')}, {plural(warnings, 'warning')}"
