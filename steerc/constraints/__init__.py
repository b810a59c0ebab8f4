"""Compile-time validators for output constraints.

A ``.steer`` program may carry one output constraint (``constrain json_schema``,
``regex``, ``grammar`` or ``choice``). The checkers here validate the
constraint's text before anything is sent to a structured-decoding backend,
and report every fault as a :class:`Problem` with a 0-based character offset
into the checked text. They never raise on bad input.

Everything runs on the standard library. ``xgrammar`` is optional: pass
``use_xgrammar=True`` to additionally run xgrammar's own converter (imported
lazily) and report what it rejects.

>>> check_regex("[0-9]+(")[0].message
'`(` is never closed'
>>> schema, problems = check_json_schema('{"type": "strin"}')
>>> problems[0].help
'did you mean `string`?'
>>> check_choice(["yes", "no", "yes"])[0].code
'invalid-constraint'
"""

from __future__ import annotations

from steerc.core.record import frozen
from steerc.diagnostics.codes import INVALID_CONSTRAINT, UNSUPPORTED_SCHEMA_KEYWORD

INVALID = INVALID_CONSTRAINT
UNSUPPORTED = UNSUPPORTED_SCHEMA_KEYWORD


@frozen
class Problem:
    """One fault in a constraint's text.

    ``code`` is ``invalid-constraint`` (an error) or
    ``unsupported-schema-keyword`` (a warning); ``offset``/``end`` are 0-based
    character offsets into the checked text (``None`` when unknown).

    >>> p = Problem(INVALID, "unterminated string", 3)
    >>> (p.severity, p.offset, p.end, p.help)
    ('error', 3, None, None)
    >>> Problem(UNSUPPORTED, "`not` is ignored", 1, 6).severity
    'warning'
    """

    code: str
    message: str
    offset: int | None
    end: int | None = None
    help: str | None = None

    @property
    def severity(self) -> str:
        """``"warning"`` for ``unsupported-schema-keyword``, else ``"error"``."""
        return "warning" if self.code == UNSUPPORTED else "error"


def errors(problems: list[Problem]) -> list[Problem]:
    """Only the problems whose severity is ``error``.

    >>> errors([Problem(UNSUPPORTED, "w", None), Problem(INVALID, "e", 0)])[0].message
    'e'
    """
    return [p for p in problems if p.severity == "error"]


# The checkers import Problem from this module, so import them last.
from steerc.constraints.choice import check_choice  # noqa: E402
from steerc.constraints.ebnf import check_grammar  # noqa: E402
from steerc.constraints.regex import check_regex  # noqa: E402
from steerc.constraints.schema import check_json_schema  # noqa: E402

__all__ = [
    "INVALID",
    "UNSUPPORTED",
    "Problem",
    "check_choice",
    "check_grammar",
    "check_json_schema",
    "check_regex",
    "errors",
]
