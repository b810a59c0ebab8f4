"""Features: what a checked program uses, each with the span to blame, and the table of what a
target supports (each target's own ``target.py`` writes its table with :func:`table`).

A table declares what its target supports, key by key (:func:`supported`, :func:`yes`); a key it does not
declare is unsupported there (:func:`undeclared`). So a feature added to :data:`FEATURE_GROUPS` is refused
by every target, with the ``unsupported-by-target`` diagnostic, until a target's table says it supports
it: an emitter that was never taught it is never reached.

>>> from steerc.api import check_source
>>> r = check_source("steer 1\\nvector v = [1.0, 2.0]\\nintervention a {\\n  at resid_post[0]\\n  add v\\n  tokens prompt[-1:], generated\\n}\\n")
>>> sorted({k for k, _ in program_features(r.checked)})
['op:add', 'scope:generated', 'scope:prompt-slice', 'scope:union', 'site:resid_post']
"""

from __future__ import annotations

from steerc.core.record import frozen
from steerc.ir import checked as ck
from steerc.ir import nodes as ir


@frozen
class Feature:
    key: str  # e.g. "op:ablate", "scope:after", "gate:prompt.mean"
    supported: bool
    note: str = ""  # how it is realised, or why it is not
    instead: str = ""  # what to do when unsupported


@frozen
class Capabilities:
    """What one target can express: a Feature for every key of :data:`ALL_KEYS`, in that order."""

    name: str
    summary: str
    features: tuple[Feature, ...]

    def get(self, key: str) -> Feature:
        """The row of ``key``: a key of :data:`ALL_KEYS` the table does not declare is unsupported; any
        other key is a ``KeyError``."""
        for f in self.features:
            if f.key == key:
                return f
        if key in ALL_KEYS:
            return undeclared(key, self.name)
        raise KeyError(key)

    def supports(self, key: str) -> bool:
        return self.get(key).supported


FEATURE_GROUPS = {
    "op": ("add", "scale", "scale-vector", "set", "suppress", "ablate", "clamp", "rotate", "loreft",
           "clamp-feature", "preserve-norm", "schedule"),
    "site": ("resid_pre", "resid_post", "attn_out", "mlp_out", "head"),
    "scope": ("all", "prompt", "generated", "prompt-slice", "generated-slice", "positions", "after", "union"),
    "gate": ("prompt.mean", "prompt.last", "token"),
    "readout": ("cosine", "projected_cosine", "subspace_cosine", "dot", "norm", "sae_feature"),
    "constraint": ("json_schema", "regex", "grammar", "choice"),
    "dtype": ("float32", "float16", "bfloat16", "float64"),
    "parallel": ("tensor", "pipeline"),
    "param": ("per-request",),
}

ALL_KEYS = tuple(f"{group}:{name}" for group, names in FEATURE_GROUPS.items() for name in names)


def supported(note: str = "", **names: str) -> dict[str, Feature]:
    """The features a target declares supported, each with ``note``: per group, the names it supports,
    space-separated (``supported("...", op="add ablate", scope="all prompt")``). The base of a table."""
    out = {}
    for group, text in names.items():
        for name in text.split():
            key = f"{group}:{name}"
            if key not in ALL_KEYS:
                raise ValueError(f"{key}: not a feature key (FEATURE_GROUPS)")
            out[key] = Feature(key, True, note)
    return out


def undeclared(key: str, target: str) -> Feature:
    """The row of a key ``target``'s table does not declare: unsupported (the default of every table)."""
    folder = target.replace("-", "_")
    return Feature(key, False, f"not implemented for this target: its table (steerc/targets/{folder}/target.py) "
                               "does not declare it",
                   "use a target that supports it (spec/capabilities.md)")


def table(name: str, summary: str, base: dict[str, Feature], **overrides: Feature) -> Capabilities:
    """A target's capabilities: ``base`` with ``overrides`` (keyword names are for reading only); every key
    neither declares is unsupported (:func:`undeclared`)."""
    rows = {k: undeclared(k, name) for k in ALL_KEYS}
    for f in (*base.values(), *overrides.values()):
        if f.key not in rows:
            raise ValueError(f"{name}: {f.key} is not a feature key (FEATURE_GROUPS)")
        rows[f.key] = f
    return Capabilities(name, summary, tuple(rows[k] for k in ALL_KEYS))


def no(key: str, note: str, instead: str) -> Feature:
    return Feature(key, False, note, instead)


def yes(key: str, note: str) -> Feature:
    return Feature(key, True, note)


def scope_feature(scope) -> str:
    if isinstance(scope, ir.ScopeAll):
        return "scope:all"
    if isinstance(scope, ir.ScopePrompt):
        return "scope:prompt" if scope.sel is None else "scope:prompt-slice"
    if isinstance(scope, ir.ScopeGenerated):
        return "scope:generated" if scope.sel is None else "scope:generated-slice"
    if isinstance(scope, ir.ScopePositions):
        return "scope:positions"
    return "scope:after"


def _op_feature(op: ck.Operation) -> str:
    if op.kind == "scale" and op.vectors:
        return "op:scale-vector"
    return f"op:{op.kind.replace('_', '-')}"


def program_features(checked: ck.CheckedProgram):
    """Yield (feature key, span) for everything the program relies on."""
    used_probes: dict[str, object] = {}
    for iv in checked.interventions:
        yield _op_feature(iv.op), iv.op.span
        if iv.op.schedule:
            yield "op:schedule", iv.op.span
        if iv.preserve_norm:
            yield "op:preserve-norm", iv.span
        yield f"site:{iv.site.kind}", iv.site.span
        for s in iv.scopes:
            yield scope_feature(s), s.span or iv.span
        if len(iv.scopes) > 1:
            yield "scope:union", iv.scopes[1].span or iv.span
        if iv.gate is not None:
            for name in ck.gate_probes(iv.gate):
                used_probes.setdefault(name, iv.gate_span)
    for name, gate_span in used_probes.items():
        probe = checked.probes.get(name)
        if probe is None:
            continue
        yield f"gate:{probe.pool}", probe.pool_span or gate_span
        yield f"readout:{probe.readout.kind}", probe.span
        yield f"site:{probe.site.kind}", probe.site.span
    if checked.constraint is not None:
        yield f"constraint:{checked.constraint.kind}", checked.constraint.span
    for *_, span in checked.request_params.values():
        yield "param:per-request", span
