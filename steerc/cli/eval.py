"""``steerc eval PROGRAM... --model M --data ITEMS.jsonl [--sweep NAME=a:b:n]... [--set NAME=V]...``
``[--chat] [--format text|json] [--plot OUT.png]``: each program's effect and cost (spec/eval.md).

    steerc eval examples/smollm2/joy.steer --model smollm2 --data examples/smollm2/eval.jsonl \\
        --sweep strength=0:8:5 --plot joy_eval.png
"""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError, arguments
from steerc.cli.common import (
    add_program_options,
    argument_spans,
    checked_project,
    config_facts,
    data_source,
    fail_with,
    load_unchecked,
    model_path_for,
    parse_overrides,
    read_text,
    required,
    root_of,
)
from steerc.cli.engines import add_engine_argument, layout, session
from steerc.cli.progress import progress as _progress
from steerc.cli.report import print_json
from steerc.core.limits import MAX_RESAMPLES, MAX_SEED


def add_arguments(cmd, several: bool = True) -> None:
    if several:
        cmd.add_argument("files", nargs="+", metavar="PROGRAM",
                         help="one or more .steer files, compared on the same data")
    else:
        cmd.add_argument("files", nargs=1, metavar="PROGRAM", help="the .steer file whose params are tuned")
    add_program_options(cmd, model_help="a model name (smollm2), a .gguf file, or a Hugging Face model folder "
                                        "with weights and tokenizer", model_required=True)
    cmd.add_argument("--data", required=True, metavar="ITEMS.jsonl",
                     help='behaviour items {"prompt", "positive", "negative"} and cost items {"text"} (optionally '
                          'with "prompt"), one JSON object per line')
    cmd.add_argument("--sweep", action="append", default=[], metavar="NAME=a:b:n",
                     help="n values of a param from a to b (repeatable: a grid); --set gives the others")
    add_engine_argument(cmd, note="; one engine for the whole sweep")
    cmd.add_argument("--chat", action="store_true",
                     help="wrap each prompt in the model's chat template (as `steerc run` does by default)")
    cmd.add_argument("--seed", type=arguments.seed, default=0,
                     help=f"the bootstrap's seed, from 0 to {MAX_SEED} (default 0)")
    cmd.add_argument("--resamples", type=arguments.resamples, default=2000, metavar="N",
                     help=f"bootstrap resamples per interval, at most {MAX_RESAMPLES} (default 2000)")
    cmd.add_argument("--plot", metavar="OUT.png",
                     help="draw behaviour against KL, one curve per program, in the extension's format (png "
                          "without one; needs matplotlib: steerc[plot])")
    cmd.add_argument("--format", choices=("text", "json"), default="text",
                     help="text (default), or JSON: the steerc.eval/1 document (spec/eval.md)")


def _sweep_error(args, exc) -> int:
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE

    src, spans = argument_spans(args, "--sweep")
    span = spans[exc.index] if exc.index < len(spans) else src.span(0, len(src.text))
    return fail_with(args, [Diagnostic.error(INVALID_VALUE, exc.message, span,
                                             help="for example --sweep strength=0:8:5 (0, 2, 4, 6, 8)")],
                     {src.name: src})


def _options(args, project, point: dict):
    """Check options with --set and this point's swept values (a swept name's diagnostics point at its
    --sweep, a --set one's at its --set)."""
    from steerc.project.session import check_options

    overrides = parse_overrides(args.overrides)
    origins, sources = {}, {}
    for flag, items in (("--set", args.overrides), ("--sweep", args.sweep)):
        if items:
            src, spans = argument_spans(args, flag)
            if len(spans) == len(items):
                origins.update((item.partition("=")[0].strip(), span) for item, span in zip(items, spans))
                sources[src.name] = src
    overrides.update(point)
    return check_options(project, root=root_of(args), overrides=overrides, origins=origins, sources=sources)


def _points(args, grid, facts):
    """Every (program, point) checked against ``facts``: the Points, or None after printing the errors."""
    from steerc.api import check_source
    from steerc.eval import Point

    points, failed = [], False
    sets = parse_overrides(args.overrides)
    for path in args.files:
        text = read_text(path)
        project = checked_project(args, path)
        for values in grid:
            result = check_source(text, path, path=os.path.abspath(path), options=_options(args, project, values),
                                  facts=facts)
            if not result.ok:
                print(result.render(), file=sys.stderr)
                failed = True
                break  # the other points of this program would say the same
            points.append(Point(path, {**sets, **values}, result.plan))
    return None if failed else points


def _checked(args, points_grid, facts, early):
    """The points checked against ``facts``: those checked before the load (``early``: (fingerprint, points))
    when the loaded model has the same facts, so that each point compiles once; else checked now."""
    if early is not None and early[0] == facts.fingerprint:
        return early[1]
    return _points(args, points_grid, facts)


def _engine_points(args, path: str, points_grid, early):
    """(the layout ``--engine``'s engine runs the model with, where it is known before the boot, and the
    points checked against it: None after their errors), or (None, None) where the engine reads its
    layout once booted (HF: the loaded model's)."""
    facts = layout(args, path, "eval")
    return (None, None) if facts is None else (facts, _checked(args, points_grid, facts, early))


def _evaluate(args, path: str, items, points_grid, early):
    """The document of ``evaluate`` on ``--engine``'s engine, booted once with the first point's plan and
    shut down after (steerc.runtime.engines), or EXIT_ERRORS after the errors of a point."""
    from steerc.eval import evaluate
    from steerc.eval.score import engine_on

    facts, points = _engine_points(args, path, points_grid, early)
    if facts is not None and points is None:
        return EXIT_ERRORS
    with session(args, path, facts, points[0].plan if points else None, command="eval",
                 load=lambda p: load_unchecked(p, "eval")) as booted:
        if points is None:  # checked against the loaded model's layout
            points = _checked(args, points_grid, booted.facts, early)
            if points is None:
                return EXIT_ERRORS
        progress = _progress(len(items.items) * (1 + len(points)))
        doc = evaluate(engine_on(args.engine, booted), items, points, chat=args.chat, seed=args.seed,
                       resamples=args.resamples, progress=progress, model_name=args.model)
    progress.finish()
    return doc


def scored(args, before_load=None):
    """The ``steerc.eval/1`` document of the command's programs and data, or an exit code after printing
    why not. ``before_load(items)`` may refuse (an exit code) once the data is read, before any model loads."""
    from steerc.derive.data import DataError
    from steerc.eval import SweepError, grid
    from steerc.eval.data import parse_items
    from steerc.eval.score import EvalError

    if getattr(args, "plot", None) is not None:  # a plot that cannot be written is refused before the run
        args.plot = arguments.plot_path(args, args.plot, inputs=(args.data, *args.files))
    try:
        items = parse_items(data_source(args.data))
    except DataError as exc:
        return fail_with(args, exc.diagnostics, exc.sources)
    try:
        points_grid = grid(args.sweep)
    except SweepError as exc:
        return _sweep_error(args, exc)
    if before_load is not None:
        refused = before_load(items)
        if refused is not None:
            return refused
    project = checked_project(args, args.files[0])
    args.model = required(args, project, "model")
    facts = config_facts(args.model)  # a mistake in a program costs no model load
    early = None
    if facts is not None:
        checked = _points(args, points_grid, facts)
        if checked is None:
            return EXIT_ERRORS
        early = (facts.fingerprint, checked)
    path = model_path_for(args)
    try:
        doc = _evaluate(args, path, items, points_grid, early)
        if isinstance(doc, int):
            return doc
    except EvalError as exc:
        from steerc.diagnostics import Diagnostic
        from steerc.diagnostics.codes import INVALID_DATA

        src = data_source(args.data)
        start = sum(len(line) + 1 for line in src.text.split("\n")[:exc.line - 1])
        end = src.text.find("\n", start)
        span = src.span(start, end if end >= 0 else len(src.text))
        return fail_with(args, [Diagnostic.error(INVALID_DATA, exc.message, span, help=exc.help)], {src.name: src})
    if getattr(args, "plot", None) is not None:
        from steerc.eval.report import plot

        try:
            plot(doc, args.plot)
        except OSError as exc:
            raise UsageError(f"cannot write the plot {args.plot}: {exc.strerror or exc}") from None
    return doc


def run(args) -> int:
    doc = scored(args)
    if isinstance(doc, int):
        return doc
    if args.format == "json":
        print_json(doc)
        return EXIT_OK
    from steerc.eval.report import table

    sys.stdout.write(table(doc))
    if args.plot is not None:
        print(f"plot: {args.plot}")  # the file written: NAME.png for --plot NAME
    return EXIT_OK
