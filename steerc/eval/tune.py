"""``steerc tune``: a rule over eval's metrics, and the point of a sweep that wins under it (spec/eval.md §8).

A rule is one goal, ``--maximize TERM`` or ``--minimize TERM``, and any
number of bounds, ``--subject-to "TERM OP NUMBER"`` with OP one of
``<= < >= >``. A TERM is a metric of spec/eval.md §4, or ``METRIC.low`` /
``METRIC.high`` for an end of its 95% interval (``kl.high<=0.1``: the KL is
below 0.1 with some confidence, not only on average).

The winner is the point, among those meeting every bound, with the best
goal; on a tie the first in sweep order. The runner-up is the next best.

>>> rule = parse_rule("behavior", None, ["kl<=0.1"])
>>> doc = {"points": [{"params": {"s": a}, "metrics": {"behavior": {"mean": b}, "kl": {"mean": k}}}
...                   for a, b, k in [(0, 1.0, 0.0), (2, 3.0, 0.05), (4, 5.0, 0.2)]]}
>>> c = choose(doc, rule)
>>> c.best, c.runner_up, [(i, b.text) for i, b, _ in c.excluded]
(1, 0, [(2, 'kl<=0.1')])
"""

from __future__ import annotations

import math
import operator
import re

from steerc.core.record import frozen
from steerc.eval.metrics import METRICS

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
STATS = ("low", "high")
NEEDS = {"behavior": "behaviour", "behavior_change": "behaviour", "win_rate": "behaviour",
         "kl": "cost", "perplexity": "cost", "perplexity_ratio": "cost"}
_BOUND = re.compile(r"(\s*)([^<>=\s]*)(\s*)(<=|>=|<|>|=+)?(\s*)(.*?)\s*")


class RuleError(ValueError):
    """A goal or bound that is not a rule: ``flag`` and ``index`` say which argument, ``start``/``end`` where in
    it (character offsets into the argument's text)."""

    def __init__(self, message: str, flag: str, index: int, start: int, end: int, help: str | None = None):
        super().__init__(message)
        self.message, self.flag, self.index, self.start, self.end, self.help = message, flag, index, start, end, help


@frozen
class Term:
    metric: str
    stat: str  # "mean", "low" or "high"

    @property
    def text(self) -> str:
        return self.metric if self.stat == "mean" else f"{self.metric}.{self.stat}"

    def of(self, point: dict) -> float | None:
        m = point["metrics"].get(self.metric)
        return None if m is None else m[self.stat]


@frozen
class Bound:
    term: Term
    op: str
    value: float
    index: int  # which --subject-to

    @property
    def text(self) -> str:
        return f"{self.term.text}{self.op}{self.value:g}"

    def holds(self, point: dict) -> bool:
        v = self.term.of(point)
        return v is not None and OPS[self.op](v, self.value)


@frozen
class Rule:
    goal: str  # "maximize" or "minimize"
    term: Term
    bounds: tuple[Bound, ...]
    goal_flag: str

    def better(self, a: float, b: float) -> bool:
        return a > b if self.goal == "maximize" else a < b

    def needs(self) -> dict[str, list[tuple[str, int, Term]]]:
        """Which items each term needs: {"behaviour" | "cost": [(flag, index, term)]}."""
        out: dict[str, list] = {}
        for flag, index, term in [(self.goal_flag, 0, self.term), *(("--subject-to", b.index, b.term)
                                                                     for b in self.bounds)]:
            out.setdefault(NEEDS[term.metric], []).append((flag, index, term))
        return out


def _term(text: str, flag: str, index: int, offset: int) -> Term:
    metric, dot, stat = text.partition(".")
    if metric not in METRICS:
        from steerc.diagnostics.suggest import did_you_mean

        raise RuleError(f"{flag}: unknown metric {metric!r}" if metric else f"{flag}: no metric", flag, index,
                        offset, offset + max(len(metric), 1),
                        help=did_you_mean(metric, METRICS) or "the metrics: " + ", ".join(METRICS))
    if dot and stat not in STATS:
        start = offset + len(metric) + 1
        raise RuleError(f"{flag}: {metric}.{stat} is no part of a metric: .low and .high are its interval's ends",
                        flag, index, start - 1, start + max(len(stat), 1), help=f"{metric}, {metric}.low or "
                        f"{metric}.high")
    return Term(metric, stat if dot else "mean")


def parse_bound(text: str, index: int) -> Bound:
    """One ``--subject-to`` (raises RuleError pointing into ``text``)."""
    m = _BOUND.fullmatch(text)
    lead, name, gap, op, gap2, number = m.groups()
    if not op or op not in OPS:
        raise RuleError(f"--subject-to takes METRIC OP NUMBER with OP one of <=, <, >=, >, got {text!r}",
                        "--subject-to", index, 0, max(len(text), 1), help='for example "kl<=0.1"')
    term = _term(name, "--subject-to", index, len(lead))
    at = len(lead) + len(name) + len(gap) + len(op) + len(gap2)
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise RuleError(f"--subject-to {term.text}{op}: {number!r} is not a finite number", "--subject-to", index,
                        at, at + max(len(number), 1))
    return Bound(term, op, value, index)


def parse_rule(maximize: str | None, minimize: str | None, subject_to: list[str]) -> Rule:
    """The rule of ``--maximize`` or ``--minimize`` and the ``--subject-to``s (raises RuleError)."""
    if (maximize is None) == (minimize is None):
        raise RuleError("give one goal: --maximize METRIC or --minimize METRIC", "--maximize", -1, 0, 0,
                        help="for example --maximize behavior --subject-to \"kl<=0.1\"")
    goal, flag, text = ("maximize", "--maximize", maximize) if maximize is not None else \
        ("minimize", "--minimize", minimize)
    term = _term(text.strip(), flag, 0, len(text) - len(text.lstrip()))
    return Rule(goal, term, tuple(parse_bound(t, i) for i, t in enumerate(subject_to)), flag)


@frozen
class Choice:
    best: int | None  # index into the document's points; None when no point meets the bounds
    runner_up: int | None
    feasible: tuple[int, ...]
    # (point, why it is out, its value there): a Bound it breaks (the first), or a Term whose value there is
    # not a finite number (None: absent)
    excluded: tuple[tuple[int, Bound | Term, float | None], ...]
    tied: bool  # the runner-up's goal equals the winner's


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def unfit(point: dict, rule: Rule) -> tuple[Term, float | None] | None:
    """The first term of ``point`` that is not a finite number, or None: the goal, then each bound's term, then
    every other metric's mean (a steered forward that overflowed float32 leaves NaN in all of them, and a
    point with any such number is never a candidate: NaN compares false with everything, so no point would
    ever rank above it)."""
    terms = [rule.term, *(b.term for b in rule.bounds), *(Term(m, "mean") for m in point["metrics"])]
    for term in terms:
        value = term.of(point)
        if not _finite(value):
            return term, value
    return None


def choose(doc: dict, rule: Rule) -> Choice:
    """The winning point of an eval document under ``rule``."""
    feasible, excluded = [], []
    for i, point in enumerate(doc["points"]):
        bad = unfit(point, rule)
        broken = None if bad else next((b for b in rule.bounds if not b.holds(point)), None)
        if bad is not None:
            excluded.append((i, *bad))
        elif broken is not None:
            excluded.append((i, broken, broken.term.of(point)))
        else:
            feasible.append(i)
    order = []
    for i in feasible:  # a stable selection: the first of equals stays first
        v = rule.term.of(doc["points"][i])
        at = next((n for n, j in enumerate(order) if rule.better(v, rule.term.of(doc["points"][j]))), len(order))
        order.insert(at, i)
    best = order[0] if order else None
    runner = order[1] if len(order) > 1 else None
    tied = runner is not None and rule.term.of(doc["points"][best]) == rule.term.of(doc["points"][runner])
    return Choice(best, runner, tuple(feasible), tuple(excluded), tied)


@frozen
class Verdict:
    """Why no point won, for a diagnostic at one argument: ``flag``'s ``index``-th value; ``others`` are
    further ``--subject-to`` indexes to point at, each with a note."""

    message: str
    flag: str
    index: int
    help: str
    others: tuple[tuple[int, str], ...] = ()


def no_winner(doc: dict, rule: Rule, choice: Choice) -> Verdict:
    """Why ``choice`` has no winner. With no finite point, the goal is to blame; otherwise the bound that
    excludes the most points (the first of equals), with the nearest any point came to meeting it (among
    those meeting the other bounds, when there are any), and a note at each other bound that also excludes
    every point alone or, when none does, at those that exclude the rest."""
    points = doc["points"]
    n = len(points)
    finite = [i for i in range(n) if unfit(points[i], rule) is None]
    if not finite:
        bad = {id(t): t for _, t, _ in choice.excluded}
        terms = ", ".join(dict.fromkeys(t.text for t in bad.values()))
        return Verdict(f"no point of the sweep has finite metrics ({terms} not a finite number at every point)",
                       rule.goal_flag, 0, help="the steered model overflows there: sweep smaller values")
    broken = [[i for i in finite if not b.holds(points[i])] for b in rule.bounds]
    at = max(range(len(rule.bounds)), key=lambda k: (len(broken[k]), -k))
    bound = rule.bounds[at]
    others = [k for k in range(len(rule.bounds)) if k != at]
    meeting = [i for i in finite if all(rule.bounds[k].holds(points[i]) for k in others)]
    pool = meeting or finite
    low = bound.op in ("<", "<=")
    best = min(pool, key=lambda i: bound.term.of(points[i]) if low else -bound.term.of(points[i]))
    which = "the nearest" if not (others and meeting) else "the nearest of the points meeting the other bounds"
    how = f"excludes all {len(finite)} points" if len(broken[at]) == len(finite) else \
        f"excludes {len(broken[at])} of {len(finite)} points"
    message = (f"no point of the sweep meets every bound: {bound.text} {how}; {which} was {bound.term.text} "
               f"{bound.term.of(points[best]):.4g} at {params_text(points[best]['params'])}")
    if len(finite) < n:
        message += f" ({n - len(finite)} more had metrics that are not finite)"
    alone = [k for k in others if len(broken[k]) == len(finite)]
    if alone:
        notes = tuple((k, f"{rule.bounds[k].text} also excludes every point") for k in alone)
    else:
        left = set(finite) - set(broken[at])
        notes = tuple((k, _leaves(rule.bounds[k], len(left & set(broken[k])), len(left), bound))
                      for k in others if left & set(broken[k]))
    return Verdict(message, "--subject-to", bound.index, help="widen the sweep, or relax the bound", others=notes)


def _leaves(other: Bound, m: int, left: int, bound: Bound) -> str:
    """``behavior>=1 excludes the 2 points kl<=0.1 leaves`` (or ``1 of the 2``)."""
    points = "point" if left == 1 else "points"
    return f"{other.text} excludes {'the' if m == left else f'{m} of the'} {left} {points} {bound.text} leaves"


def params_text(params: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in params.items()) or "(no params)"


def explain(doc: dict, rule: Rule, choice: Choice) -> list[str]:
    """What was chosen and why, the runner-up and how close it came, and what the bounds excluded."""
    points = doc["points"]
    n = len(points)
    bounds = " and ".join(b.text for b in rule.bounds)
    where = f" where {bounds}" if bounds else ""
    best = points[choice.best]
    m = best["metrics"][rule.term.metric]
    value = f"{rule.term.metric} {m['mean']:.4g} [{m['low']:.4g}, {m['high']:.4g}]"
    if rule.term.stat != "mean":
        value = f"{rule.term.text} {rule.term.of(best):.4g}, {value}"
    lines = [(f"chose {params_text(best['params'])} for {best['program']}: it {rule.goal}s {rule.term.text} "
              f"({value}) among {len(choice.feasible)} of {n} points{where}")]
    others = [f"{k} {best['metrics'][k]['mean']:.4g}" for k in ("behavior_change", "win_rate", "kl",
                                                                 "perplexity_ratio")
              if k in best["metrics"] and k != rule.term.metric]
    if others:
        lines.append("  there: " + ", ".join(others))
    if choice.runner_up is not None:
        r = points[choice.runner_up]
        gap = abs(rule.term.of(best) - rule.term.of(r))
        how = "tied: the first in sweep order wins" if choice.tied else \
            f"{gap:.4g} {'lower' if rule.goal == 'maximize' else 'higher'}"
        lines.append(f"runner-up: {params_text(r['params'])}, {rule.term.text} {rule.term.of(r):.4g} ({how})")
        inside = _overlap(best, r, rule.term.metric)
        if inside and not choice.tied:
            lines.append(f"  their {rule.term.metric} intervals overlap: on these items the two are not clearly apart")
    else:
        lines.append("runner-up: none (no other point meets the bounds)")
    for i, why, value in choice.excluded:
        lines.append(f"excluded: {params_text(points[i]['params'])} ({excluded_text(why, value)})")
    return lines


def excluded_text(why: Bound | Term, value: float | None) -> str:
    """Why a point is out: ``kl 0.2, not <=0.1``, or ``behavior nan, not a finite number``."""
    shown = "absent" if value is None else f"{value:.4g}"
    if isinstance(why, Bound):
        return f"{why.term.text} {shown}, not {why.op}{why.value:g}"
    return f"{why.text} {shown}, not a finite number"


def _overlap(a: dict, b: dict, metric: str) -> bool:
    x, y = a["metrics"][metric], b["metrics"][metric]
    return x["low"] <= y["high"] and y["low"] <= x["high"]


def summary(doc: dict, rule: Rule, choice: Choice, wrote: str | None) -> dict:
    """The ``tune`` part of ``steerc tune --format json`` (spec/eval.md §8)."""
    def point(i):
        return None if i is None else {"index": i, "params": doc["points"][i]["params"],
                                       "value": rule.term.of(doc["points"][i])}

    return {
        "rule": {"goal": rule.goal, "metric": rule.term.text, "subject_to": [b.text for b in rule.bounds]},
        "chosen": point(choice.best),
        "runner_up": point(choice.runner_up),
        "excluded": [{"index": i, "params": doc["points"][i]["params"],
                      "bound": why.text if isinstance(why, Bound) else None,
                      "metric": why.term.text if isinstance(why, Bound) else why.text, "value": v,
                      "why": excluded_text(why, v)}
                     for i, why, v in choice.excluded],
        "wrote": wrote,
    }
