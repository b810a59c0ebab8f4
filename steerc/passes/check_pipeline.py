"""The check pipeline: the passes that check a program, in one visible order.

``CHECK_PASSES`` run on every program; ``MODEL_PASSES`` follow them when the
program is checked against a model's facts. Each pass reads the
:class:`~steerc.passes.context.CheckContext` and reports into it; a pass that
finds the program too broken to go on sets ``ctx.stop`` and the rest are
skipped. The plan pipeline (:mod:`steerc.passes.plan_pipeline`) takes over
from the checked program.

>>> [p.__name__.rsplit(".", 1)[1] for p in CHECK_PASSES + MODEL_PASSES]
['structure', 'names', 'types', 'fold', 'request', 'causality', 'constraints', 'unused', 'layout', 'provenance']
"""

from __future__ import annotations

from steerc.passes import (
    causality,
    constraints,
    fold,
    layout,
    names,
    provenance,
    request,
    structure,
    types,
    unused,
)
from steerc.passes.context import CheckContext

CHECK_PASSES = (structure, names, types, fold, request, causality, constraints, unused)
MODEL_PASSES = (layout, provenance)


def run_checks(ctx: CheckContext) -> None:
    """Run the check passes on ``ctx`` (the model passes too when it has facts) until one stops."""
    for p in CHECK_PASSES + (MODEL_PASSES if ctx.facts is not None else ()):
        p.run(ctx)
        if ctx.stop:
            break
