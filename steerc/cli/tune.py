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


def _diagnostic(args, message: str, flag: str, index: int, start: int, end: int, help=None) -> int:
    """An error under ``flag``'s ``index``-th value (characters ``start``-``end`` of it)."""
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE

    src, spans = argument_spans(args, flag)
    if 0 <= index < len(spans):
        span = spans[index]
        shown = src.text[span.start:span.end]
        value = (getattr(args, flag.lstrip("-").replace("-", "_")) or "")
        value = value[index] if isinstance(value, list) else value
        inner = span.start + (1 if shown != value and shown[1:-1] == value else 0)
        span = src.span(inner + start, inner + max(end, start + 1)) if shown in (value, f"'{value}'") else span
    else:
        span = src.span(0, len(src.text))
    return fail_with(args, [Diagnostic.error(INVALID_VALUE, message, span, help=help)], {src.name: src})


def run(args) -> int:
    from steerc.eval.tune import RuleError, choose, explain, parse_rule, summary

    try:
        rule = parse_rule(args.maximize, args.minimize, args.subject_to)
    except RuleError as exc:
        return _diagnostic(args, exc.message, exc.flag, exc.index, exc.start, exc.end, exc.help)
    if not args.sweep:
        raise UsageError("tune needs at least one --sweep NAME=a:b:n: the values to choose from")

    def items_hold_the_rule(items):
        behaviour, cost = items.counts()
        have = {"behaviour": behaviour, "cost": cost}
        for kind, uses in rule.needs().items():
            if not have[kind]:
                flag, index, term = uses[0]
                return _diagnostic(args, f"{term.metric} is measured on {kind} items, and {args.data} has none",
                                   flag, index, 0, len(term.text), help="add them to the data, or choose another metric")
        return None

    doc = eval_cli.scored(args, before_load=items_hold_the_rule)
    if isinstance(doc, int):
        return doc
    choice = choose(doc, rule)
    if choice.best is None:
        bound = rule.bounds[0]
        best = min((p for p in doc["points"] if bound.term.of(p) is not None), default=None,
                   key=lambda p: bound.term.of(p) if bound.op in ("<", "<=") else -bound.term.of(p))
        nearest = f": the nearest was {bound.term.text} {bound.term.of(best):.4g} at " \
                  f"{', '.join(f'{k}={v:g}' for k, v in best['params'].items())}" if best else ""
        if len(rule.bounds) > 1:
            nearest = ""
        return _diagnostic(args, f"no point of the sweep meets every bound{nearest}", "--subject-to", bound.index,
                           0, 0, help="widen the sweep, or relax the bound")
    chosen = doc["points"][choice.best]
    swept = {k: v for k, v in chosen["params"].items()
             if any(s.partition("=")[0].strip() == k for s in args.sweep)}
    wrote = None if args.dry_run else _write(args, swept)
    if args.format == "json":
        print_json({"format": "steerc.tune/1", "tune": summary(doc, rule, choice, wrote), "eval": doc})
        return EXIT_OK
    from steerc.eval.report import table

    sys.stdout.write(table(doc))
    print("\n".join(explain(doc, rule, choice)))
    where = ", ".join(f"{k} = {v:g}" for k, v in swept.items())
    print(f"would write {where} to steer.toml [params] (--dry-run)" if wrote is None
          else f"wrote {where} to {wrote} [params]")
    return EXIT_OK


def _write(args, values: dict) -> str:
    """Write ``values`` into the program's project's steer.toml (made at the project root when there is none),
    atomically, its line ends kept; the path as shown."""
    import tempfile

    from steerc.project import MARKER, display_name
    from steerc.project.edit import EditError, set_params

    project = checked_project(args, args.files[0])
    path = project.file or os.path.join(project.root, MARKER)
    raw = ""
    if project.file is not None:
        with open(path, encoding="utf-8", newline="") as fh:
            raw = fh.read()
    crlf = "\r\n" in raw
    try:
        new = set_params(raw.replace("\r\n", "\n"), values)
    except EditError as exc:
        raise UsageError(f"{display_name(path)}: {exc}") from None
    fd, tmp = tempfile.mkstemp(prefix=".steer.toml-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(new.replace("\n", "\r\n") if crlf else new)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp) if os.path.exists(tmp) else None
        raise UsageError(f"cannot write {display_name(path)}: {exc.strerror or exc}") from None
    return display_name(path)
