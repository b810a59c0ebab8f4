"""The stable JSON form of the program IR (``steerc parse --emit ir``).

Every node becomes an object whose first key is ``"node"`` (the class name)
followed by its fields in declaration order; tuples become lists; spans
become ``"line:column-end_line:end_column"`` under ``"span"`` (and
``"name_span"`` and so on), with the file named once at the top. The form
round-trips exactly: ``from_json(to_json(p)) == p`` and the JSON text of the
result is byte-identical. The text is strict JSON: a float that is not finite
(a literal such as ``1e999``, which only the checker refuses) is written as
``{"float": "inf"}`` (:func:`steerc.core.jsonio.dumps`) and read back as the float.

>>> from steerc.frontend import parse_source
>>> program, _ = parse_source("steer 1\\nparam gain = 2.5\\n", "a.steer")
>>> text = dumps(program)
>>> loads(text) == program and dumps(loads(text)) == text
True
>>> program, _ = parse_source("steer 1\\nparam gain = 1e999\\n", "a.steer")
>>> '"float": "inf"' in dumps(program), loads(dumps(program)) == program
(True, True)
"""

from __future__ import annotations

from steerc.core import record
from steerc.core.jsonio import decode_float, finite
from steerc.core.jsonio import dumps as dumps_json
from steerc.core.jsonio import loads as loads_json
from steerc.core.limits import MAX_IR_JSON_BYTES
from steerc.core.source import Span
from steerc.ir.nodes import NODE_CLASSES

FORMAT = "steerc.ir/1"


def _span_to_json(span: Span) -> str:
    return f"{span.line}:{span.column}-{span.end_line}:{span.end_column}"


def _span_from_json(text: str, file: str | None) -> Span:
    start, end = text.split("-")
    line, column = start.split(":")
    end_line, end_column = end.split(":")
    return Span(file or "", int(line), int(column), int(end_line), int(end_column))


def _to_json(value, file: list[str]):
    if isinstance(value, Span):
        if not file:
            file.append(value.file)
        return _span_to_json(value)
    if record.has(type(value)):
        out = {"node": type(value).__name__}
        for f in record.fields(type(value)):
            v = getattr(value, f.name)
            if (v is None and f.name.endswith("span")) or (f.name == "comments" and not v):
                continue
            out[f.name] = _to_json(v, file)
        return out
    if isinstance(value, tuple):
        return [_to_json(v, file) for v in value]
    return value


def to_json(program) -> dict:
    """The document as JSON values (a float that is not finite as ``{"float": ...}``: steerc.core.jsonio)."""

    file: list[str] = []
    body = finite(_to_json(program, file))
    return {"format": FORMAT, "file": file[0] if file else None, "program": body}


def dumps(program) -> str:
    return dumps_json(to_json(program), indent=1, ensure_ascii=False) + "\n"


def _from_json(value, file: str | None):
    if isinstance(value, dict) and "node" not in value:
        return decode_float(value)
    if isinstance(value, dict):
        cls = NODE_CLASSES[value["node"]]
        kwargs = {}
        for f in record.fields(cls):
            if f.name not in value:
                continue
            v = value[f.name]
            if f.name.endswith("span") and v is not None:
                kwargs[f.name] = _span_from_json(v, file)
            else:
                kwargs[f.name] = _from_json(v, file)
        return cls(**kwargs)
    if isinstance(value, list):
        return tuple(_from_json(v, file) for v in value)
    return value


def from_json(data: dict):
    if data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    return _from_json(data["program"], data.get("file"))


def loads(text: str):
    """The program of an IR JSON text (read under steerc's JSON limits: :mod:`steerc.core.jsonio`)."""

    return from_json(loads_json(text, max_bytes=MAX_IR_JSON_BYTES))
