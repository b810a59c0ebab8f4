"""The document a schema check walks: its positions, its text and the problems found so far.

Every module of the schema check writes through one :class:`Context`; :func:`kind` names a JSON value
for messages.
"""

from __future__ import annotations

from steerc.constraints import INVALID, UNSUPPORTED, Problem
from steerc.constraints.jsonpos import Located
from steerc.core.record import define, field


@define
class Context:
    """The document being checked, the text it came from, and the problems found.

    >>> from steerc.constraints.jsonpos import parse_json
    >>> ctx = Context(parse_json('{"a": 1}')[0], '{"a": 1}')
    >>> ctx.span("/a"), ctx.span("/a", key=True)
    ((6, 7), (1, 4))
    """

    doc: Located
    text: str
    problems: list[Problem] = field(factory=list)

    def span(self, ptr: str, key: bool = False) -> tuple[int | None, int | None]:
        """Offsets of the value (or, with ``key``, the member's key) at ``ptr``."""
        found = (self.doc.keys if key else self.doc.values).get(ptr)
        if found is None and key:
            found = self.doc.values.get(ptr)
        return found if found is not None else (None, None)

    def report(self, code: str, ptr: str, message: str, help: str | None = None, key: bool = False) -> None:
        start, end = self.span(ptr, key)
        self.problems.append(Problem(code, message, start, end, help))

    def error(self, ptr: str, message: str, help: str | None = None, key: bool = False) -> None:
        self.report(INVALID, ptr, message, help, key)

    def warn(self, ptr: str, message: str, help: str | None = None) -> None:
        self.report(UNSUPPORTED, ptr, message, help, key=True)


def kind(value: object) -> str:
    """What a JSON value is, for messages.

    >>> kind(True), kind(1.5), kind(None)
    ('a boolean', 'a number', 'null')
    """
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), "null")


__all__ = ["Context", "kind"]
