"""How an output constraint is carried by each target (data only; no xgrammar here).

Every target asks for compact JSON (no free whitespace), so a JSON Schema
constraint yields the same text on every backend.

>>> from steerc.ir.checked import Constraint
>>> structured_outputs(Constraint("choice", ("yes", "no")))
{'choice': ['yes', 'no']}
>>> request_fields(Constraint("regex", "(yes|no)"))
{'structured_outputs': {'regex': '(yes|no)'}}
"""

from __future__ import annotations

from steerc.core.jsonio import canonical


def structured_outputs(constraint) -> dict:
    """vLLM ``StructuredOutputsParams`` fields for a constraint."""
    kind = constraint.kind
    if kind == "json_schema":
        return {"json": constraint.value, "disable_any_whitespace": True}
    if kind == "regex":
        return {"regex": constraint.value}
    if kind == "grammar":
        return {"grammar": constraint.value}
    return {"choice": list(constraint.value)}


def request_fields(constraint) -> dict:
    """OpenAI-compatible request fields: ``response_format`` for a schema, ``structured_outputs`` for all."""
    fields = {"structured_outputs": structured_outputs(constraint)}
    if constraint.kind == "json_schema":
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "steerc", "schema": constraint.value, "strict": True},
        }
    return fields


def constraint_json(constraint) -> dict | None:
    if constraint is None:
        return None
    return {"kind": constraint.kind, "value": list(constraint.value) if constraint.kind == "choice" else constraint.value}


def constraint_from_json(d: dict | None):
    from steerc.ir.checked import Constraint

    if d is None:
        return None
    kind, value = d["kind"], d["value"]
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ValueError("a choice constraint is a list of strings")
        return Constraint(kind, tuple(value))
    if kind in ("regex", "grammar") and not isinstance(value, str):
        raise ValueError(f"a {kind} constraint is a string")
    if kind == "json_schema" and not isinstance(value, (dict, bool)):
        raise ValueError("a json_schema constraint is a JSON Schema (an object or a boolean)")
    text = canonical(value) if kind == "json_schema" else value
    return Constraint(kind, value, text=text)
