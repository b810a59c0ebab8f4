"""The one registry of diagnostic codes.

Every diagnostic steerc can report has a stable kebab-case code listed here,
with its default severity and a one-line summary, each as a constant
(``UNDEFINED_NAME = "undefined-name"``) that the code reporting it imports:
a misspelt code fails at import, not when the diagnostic fires. ``spec/diagnostics.md``
documents each code with a failing example; a test runs those examples and
checks that each produces its code, so this table, the spec and the checker
cannot drift apart.

>>> CODES[UNDEFINED_NAME].severity, UNDEFINED_NAME
('error', 'undefined-name')
>>> "dead-intervention" in CODES
True
"""

from __future__ import annotations

from typing import Final

from steerc.core.record import frozen


@frozen
class Code:
    name: str
    severity: str
    summary: str


CODES: dict[str, Code] = {}


def _code(name: str, severity: str, summary: str) -> str:
    """Register a code; its constant is the name (a misspelt constant fails at import, as mypy's codes do)."""
    assert name not in CODES, name
    CODES[name] = Code(name, severity, summary)
    return name


# -- the language (LANGUAGE.md section 8) --------------------------------
SYNTAX_ERROR: Final = _code("syntax-error", "error", "the text is not a Steer program")
UNSUPPORTED_VERSION: Final = _code("unsupported-version", "error", "the `steer N` header names a version this compiler does not implement")
UNDEFINED_NAME: Final = _code("undefined-name", "error", "a name, function, pool or field is used but never declared")
DUPLICATE_NAME: Final = _code("duplicate-name", "error", "a name is declared twice")
TYPE_ERROR: Final = _code("type-error", "error", "a value of the wrong kind (scalar, vector, probe, string) where another is needed")
UNKNOWN_SITE: Final = _code("unknown-site", "error", "an `at` names a site that does not exist")
LAYER_OUT_OF_RANGE: Final = _code("layer-out-of-range", "error", "a layer selector reaches past the model's layers")
HEAD_OUT_OF_RANGE: Final = _code("head-out-of-range", "error", "a head selector reaches past the model's attention heads")
SHAPE_MISMATCH: Final = _code("shape-mismatch", "error", "a vector's length does not fit where it is used")
FILE_NOT_FOUND: Final = _code("file-not-found", "error", "a file named by `load` or `from` does not exist")
INVALID_ENCODING: Final = _code("invalid-encoding", "error", "a program's bytes are not UTF-8 text")
MISSING_KEY: Final = _code("missing-key", "error", "a tensor key (or a per-layer row) is not in the file")
PATH_ESCAPE: Final = _code("path-escape", "error", "a path leaves the project root")
MODEL_MISMATCH: Final = _code("model-mismatch", "error", "a `model { ... }` assertion does not hold for the given model")
CAUSALITY: Final = _code("causality", "error", "a gate decides after the positions it would steer have passed")
MULTIPLE_CONSTRAINTS: Final = _code("multiple-constraints", "error", "more than one `constrain` statement")
INVALID_CONSTRAINT: Final = _code("invalid-constraint", "error", "a schema, regex, grammar or choice list is malformed")
UNSUPPORTED_BY_TARGET: Final = _code("unsupported-by-target", "error", "the chosen target cannot express a construct exactly")
# -- steerc's own ---------------------------------------------------------
MISSING_FIELD: Final = _code("missing-field", "error", "a block lacks a line it needs (`at`, an operation, `read`, `pool`)")
DUPLICATE_FIELD: Final = _code("duplicate-field", "error", "a block gives the same line twice, or two operations")
UNKNOWN_FIELD: Final = _code("unknown-field", "error", "a `model { ... }` block names a fact steerc does not know")
INVALID_VALUE: Final = _code("invalid-value", "error", "a value is outside its domain (a zero vector to normalize, a degenerate rotation plane, ...)")
INVALID_VECTOR_FILE: Final = _code("invalid-vector-file", "error", "a vector file cannot be read safely (corrupt, pickled, not floating point, non-finite)")
UNKNOWN_FAMILY: Final = _code("unknown-family", "error", "the model's architecture is not one steerc knows the layout of")
MODEL_WITHOUT_WEIGHTS: Final = _code("model-without-weights", "error", "`steerc run` was given a model without weights (a config, a facts JSON) or without a tokenizer")
SCHEDULE_OUTSIDE_GENERATION: Final = _code("schedule-outside-generation", "error", "a schedule (ramp, decay, window) would steer positions before the prompt's last token, where generation steps are not counted")
PARAM_OUT_OF_RANGE: Final = _code("param-out-of-range", "error", "a param's value (its default, or --set) is outside the range it declares")
PER_REQUEST_PARAM: Final = _code("per-request-param", "error", "a per-request param is used where the compiled kernels would not stay correct for every value")
INVALID_DATA: Final = _code("invalid-data", "error", "a `steerc derive` data file is not examples it can read (not JSON, a missing or unknown key, an empty text)")
UNBALANCED_DATA: Final = _code("unbalanced-data", "error", "`steerc derive`'s positive and negative files pair line by line, and their counts differ")
EMPTY_DATA: Final = _code("empty-data", "error", "`steerc derive` has no examples, or too few for the method")
VECTOR_MODEL_MISMATCH: Final = _code("vector-model-mismatch", "warning", "a vector `steerc derive` made for one model is used with another")
VECTOR_SITE_MISMATCH: Final = _code("vector-site-mismatch", "warning", "a vector read at one site (by `steerc derive`, or an SAE's feature) is used at another")
INVALID_MODEL: Final = _code("invalid-model", "error", "the --model config or facts file gives sizes or flags no model has (or cannot be read as one)")
INVALID_CONFIG: Final = _code("invalid-config", "error", "a `steer.toml` is not TOML, or holds a table, key or value steerc does not take")
LIMIT_EXCEEDED: Final = _code("limit-exceeded", "error", "an input is larger or deeper than steerc's resource limits allow")
UNUSED_NAME: Final = _code("unused-name", "warning", "a param, vector or probe is declared but never used")
NO_EFFECT: Final = _code("no-effect", "warning", "a line or an intervention cannot change anything")
SLICE_CLIPPED: Final = _code("slice-clipped", "warning", "a layer or head slice's end reaches past the model, and steers only the part that exists")
DEAD_INTERVENTION: Final = _code("dead-intervention", "warning", "an intervention is overwritten by a later one before anything reads it")
UNSUPPORTED_SCHEMA_KEYWORD: Final = _code("unsupported-schema-keyword", "warning", "a JSON Schema keyword that structured decoding ignores")
INVALID_FOREIGN_FILE: Final = _code("invalid-foreign-file", "error", "a file in another tool's format (a BrainPatch archive) is malformed, unsafe or inconsistent")


def severity_of(code: str) -> str:
    return CODES[code].severity
