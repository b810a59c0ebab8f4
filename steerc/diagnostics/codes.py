"""The one registry of diagnostic codes.

Every diagnostic steerc can report has a stable kebab-case code listed here,
with its default severity and a one-line summary. ``spec/diagnostics.md``
documents each code with a failing example; a test runs those examples and
checks that each produces its code, so this table, the spec and the checker
cannot drift apart.

>>> CODES["undefined-name"].severity
'error'
>>> "dead-intervention" in CODES
True
"""

from __future__ import annotations

from attrs import frozen


@frozen
class Code:
    name: str
    severity: str
    summary: str


def _table(*rows: tuple[str, str, str]) -> dict[str, Code]:
    return {name: Code(name, severity, summary) for name, severity, summary in rows}


CODES: dict[str, Code] = _table(
    # -- the language (LANGUAGE.md section 8) --------------------------------
    ("syntax-error", "error", "the text is not a Steer program"),
    ("unsupported-version", "error", "the `steer N` header names a version this compiler does not implement"),
    ("undefined-name", "error", "a name, function, pool or field is used but never declared"),
    ("duplicate-name", "error", "a name is declared twice"),
    ("type-error", "error", "a value of the wrong kind (scalar, vector, probe, string) where another is needed"),
    ("unknown-site", "error", "an `at` names a site that does not exist"),
    ("layer-out-of-range", "error", "a layer selector reaches past the model's layers"),
    ("head-out-of-range", "error", "a head selector reaches past the model's attention heads"),
    ("shape-mismatch", "error", "a vector's length does not fit where it is used"),
    ("file-not-found", "error", "a file named by `load` or `from` does not exist"),
    ("invalid-encoding", "error", "a program's bytes are not UTF-8 text"),
    ("missing-key", "error", "a tensor key (or a per-layer row) is not in the file"),
    ("path-escape", "error", "a path leaves the project root"),
    ("model-mismatch", "error", "a `model { ... }` assertion does not hold for the given model"),
    ("causality", "error", "a gate decides after the positions it would steer have passed"),
    ("multiple-constraints", "error", "more than one `constrain` statement"),
    ("invalid-constraint", "error", "a schema, regex, grammar or choice list is malformed"),
    ("unsupported-by-target", "error", "the chosen target cannot express a construct exactly"),
    # -- steerc's own ---------------------------------------------------------
    ("missing-field", "error", "a block lacks a line it needs (`at`, an operation, `read`, `pool`)"),
    ("duplicate-field", "error", "a block gives the same line twice, or two operations"),
    ("unknown-field", "error", "a `model { ... }` block names a fact steerc does not know"),
    ("invalid-value", "error", "a value is outside its domain (a zero vector to normalize, a degenerate rotation plane, ...)"),
    ("invalid-vector-file", "error", "a vector file cannot be read safely (corrupt, pickled, not floating point, non-finite)"),
    ("unknown-family", "error", "the model's architecture is not one steerc knows the layout of"),
    ("model-without-weights", "error", "`steerc run` was given a model without weights (a config, a facts JSON) or without a tokenizer"),
    ("schedule-outside-generation", "error", "a schedule (ramp, decay, window) would steer positions before the prompt's last token, where generation steps are not counted"),
    ("param-out-of-range", "error", "a param's value (its default, or --set) is outside the range it declares"),
    ("per-request-param", "error", "a per-request param is used where the compiled kernels would not stay correct for every value"),
    ("invalid-data", "error", "a `steerc derive` data file is not examples it can read (not JSON, a missing or unknown key, an empty text)"),
    ("unbalanced-data", "error", "`steerc derive`'s positive and negative files pair line by line, and their counts differ"),
    ("empty-data", "error", "`steerc derive` has no examples, or too few for the method"),
    ("vector-model-mismatch", "warning", "a vector `steerc derive` made for one model is used with another"),
    ("vector-site-mismatch", "warning", "a vector `steerc derive` read at one site is used at another"),
    ("invalid-model", "error", "the --model config or facts file gives sizes or flags no model has (or cannot be read as one)"),
    ("invalid-config", "error", "a `steer.toml` is not TOML, or holds a table, key or value steerc does not take"),
    ("limit-exceeded", "error", "an input is larger or deeper than steerc's resource limits allow"),
    ("unused-name", "warning", "a param, vector or probe is declared but never used"),
    ("no-effect", "warning", "a line or an intervention cannot change anything"),
    ("dead-intervention", "warning", "an intervention is overwritten by a later one before anything reads it"),
    ("unsupported-schema-keyword", "warning", "a JSON Schema keyword that structured decoding ignores"),
)


def severity_of(code: str) -> str:
    return CODES[code].severity
