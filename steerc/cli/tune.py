"""``steerc tune PROGRAM --model M --data ITEMS.jsonl --sweep NAME=a:b:n... (--maximize|--minimize) METRIC``
``[--subject-to "METRIC OP NUMBER"]... [--dry-run]``: eval with a rule; the winner's params go into the
project's steer.toml ``[params]`` (spec/eval.md §8).

    steerc tune examples/smollm2/joy.steer --model smollm2 --data examples/smollm2/joy_eval.jsonl \\
        --sweep strength=0:8:5 --maximize behavior --subject-to "kl<=0.3"
"""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_OK, UsageError
from steerc.cli import eval as eval_cli
from steerc.cli.common import argument_spans, checked_project, fail_with
from steerc.cli.report import print_json


def add_arguments(cmd) -> None:
    eval_cli.add_arguments(cmd, several=False)
    goal = cmd.add_mutually_exclusive_group(required=True)
    goal.add_argument("--maximize", metavar="METRIC", help="the metric to raise: behavior, behavior_change, "
                                                           "win_rate (METRIC.low: its interval's lower end)")
    goal.add_argument("--minimize", metavar="METRIC", help="the metric to lower: kl, perplexity, perplexity_ratio")
    cmd.add_argument("--subject-to", action="append", default=[], metavar='"METRIC OP NUMBER"',
                     help='a bound every candidate must meet, OP one of <= < >= > (repeatable), e.g. "kl<=0.1" '
                          'or "kl.high<=0.1"')
    cmd.add_argument("--dry-run", action="store_true", help="say what would be chosen; write nothing")


def _span(args, flag: str, index: int, start: int, end: int):
    """(the command line as a Source, the span of characters ``start``-``end`` of ``flag``'s ``index``-th value;
    the whole value when ``end`` is None)."""
    src, spans = argument_spans(args, flag)
    if not 0 <= index < len(spans):
        return src, src.span(0, len(src.text))
    span = spans[index]
    shown = src.text[span.start:span.end]
    value = (getattr(args, flag.lstrip("-").replace("-", "_")) or "")
    value = value[index] if isinstance(value, list) else value
    if end is None:
        start, end = 0, len(value)
    inner = span.start + (1 if shown != value and shown[1:-1] == value else 0)
    return src, src.span(inner + start, inner + max(end, start + 1)) if shown in (value, f"'{value}'") else span


def _diagnostic(args, message: str, flag: str, index: int, start: int, end: int | None, help=None,
                notes=()) -> int:
    """An error under ``flag``'s ``index``-th value (characters ``start``-``end`` of it); ``notes`` are
    (``--subject-to`` index, message) pairs, each pointing at its bound."""
    from steerc.diagnostics import Diagnostic, Note
    from steerc.diagnostics.codes import INVALID_VALUE

    src, span = _span(args, flag, index, start, end)
    notes = tuple(Note(text, _span(args, "--subject-to", k, 0, None)[1]) for k, text in notes)
    return fail_with(args, [Diagnostic.error(INVALID_VALUE, message, span, help=help, notes=notes)],
                     {src.name: src})


def run(args) -> int:
    from steerc.eval import grid
    from steerc.eval.tune import RuleError, choose, explain, no_winner, parse_rule, summary

    try:
        rule = parse_rule(args.maximize, args.minimize, args.subject_to)
    except RuleError as exc:
        return _diagnostic(args, exc.message, exc.flag, exc.index, exc.start, exc.end, exc.help)
    if not args.sweep:
        raise UsageError("tune needs at least one --sweep NAME=a:b:n: the values to choose from")

    def before_load(items):
        """The rule's metrics need items the data has, and the winner must be writable: both are known now,
        before the model loads (the sweep has been read, so its first point stands in for the winner)."""
        behaviour, cost = items.counts()
        have = {"behaviour": behaviour, "cost": cost}
        for kind, uses in rule.needs().items():
            if not have[kind]:
                flag, index, term = uses[0]
                return _diagnostic(args, f"{term.metric} is measured on {kind} items, and {args.data} has none",
                                   flag, index, 0, len(term.text), help="add them to the data, or choose another metric")
        if args.dry_run:
            return None
        edited = params_edit(args, args.files[0], grid(args.sweep)[0], "tune")
        return edited if isinstance(edited, int) else None

    doc = eval_cli.scored(args, before_load=before_load)
    if isinstance(doc, int):
        return doc
    choice = choose(doc, rule)
    if choice.best is None:
        why = no_winner(doc, rule, choice)
        return _diagnostic(args, why.message, why.flag, why.index, 0, None, help=why.help, notes=why.others)
    chosen = doc["points"][choice.best]
    swept = {k: v for k, v in chosen["params"].items()
             if any(s.partition("=")[0].strip() == k for s in args.sweep)}
    wrote = None
    if not args.dry_run:
        wrote = params_write(args, args.files[0], swept, "tune")
        if isinstance(wrote, int):
            return wrote
    if args.format == "json":
        print_json({"format": "steerc.tune/1", "tune": summary(doc, rule, choice, wrote), "eval": doc})
        return EXIT_OK
    from steerc.eval.report import table

    sys.stdout.write(table(doc))
    print("\n".join(explain(doc, rule, choice)))
    where = ", ".join(f"{k} = {v:g}" for k, v in swept.items())
    print(f"would write {where} to steer.toml [params] (--dry-run)" if wrote is None
          else f"wrote {where} to {wrote} [params]")
    if args.plot is not None:
        print(f"plot: {args.plot}")  # as eval says it: the file written
    return EXIT_OK


def params_edit(args, program: str, values: dict, command: str):
    """(the steer.toml path of ``program``'s project, its text with ``values`` in ``[params]``, whether it starts
    with a byte-order mark), or an exit code after saying why it cannot be written (``command`` names who
    writes). Everything that could make the write fail (steer.toml's form, its links, its permissions) is
    found here, so a command calls this before its long work, and :func:`params_write` calls it again on the
    file as it is then."""
    from steerc.core.source import Source, normalize_newlines
    from steerc.project import MARKER, display_name
    from steerc.project.edit import EditError, set_params
    from steerc.project.write import WriteError, read, target

    project = checked_project(args, program)
    path = project.file or os.path.join(project.root, MARKER)
    shown = display_name(path)
    try:
        target(path)
        text, bom = read(path)
    except WriteError as exc:
        raise UsageError(f"{command} cannot write its params into {shown}: it {exc}") from None
    try:
        return path, set_params(text, values), bom
    except EditError as exc:
        if exc.span is None:
            raise UsageError(f"{command} cannot write its params into {shown}: {exc.message}") from None
        from steerc.diagnostics import Diagnostic
        from steerc.diagnostics.codes import INVALID_CONFIG

        src = Source(shown, normalize_newlines(text), path)
        return fail_with(args, [Diagnostic.error(INVALID_CONFIG, f"{command} cannot write its params into "
                                                 f"{shown}: {exc.message}", src.span(*exc.span), help=exc.help)],
                         {src.name: src})


def params_write(args, program: str, values: dict, command: str):
    """Write ``values`` into the steer.toml of ``program``'s project (made at the project root when there is
    none), keeping its other bytes, its links and its mode (:mod:`steerc.project.write`): the path as shown,
    or an exit code after saying why not."""
    from steerc.project import display_name
    from steerc.project.write import WriteError, write

    edited = params_edit(args, program, values, command)
    if isinstance(edited, int):
        return edited
    path, text, bom = edited
    try:
        write(path, text, bom)
    except WriteError as exc:
        raise UsageError(f"{command} cannot write its params into {display_name(path)}: it {exc}") from None
    return display_name(path)
