"""What each target can express, as data: the capability check and the matrix of ``spec/capabilities.md``.

Each target's table sits in its own folder (``targets/<name>/target.py``); :data:`TARGETS` reads them
from the registry. The capability check (:func:`check_target`) and the matrix both read it, so they
cannot drift (a test regenerates the matrix and fails when the committed one is stale). An unsupported
feature is reported as ``unsupported-by-target`` with the reason and what to do instead; nothing is
dropped silently.

>>> TARGETS["hf"].supports("scope:after")
True
>>> TARGETS["vllm-hook"].get("op:clamp").instead
'use the steerc serve format (--target serve), which carries clamps'
"""

from __future__ import annotations

from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir.kernels import kind_of
from steerc.targets.families import check_family
from steerc.targets.features import ALL_KEYS, FEATURE_GROUPS, Capabilities, Feature, program_features
from steerc.targets.registry import REGISTRY
from steerc.targets.seat import kernel_refusal

__all__ = ["ALL_KEYS", "DISPLAY", "FEATURE_GROUPS", "GROUP_TITLES", "TARGETS", "Capabilities", "Feature",
           "capability_matrix", "check_target"]

TARGETS: dict[str, Capabilities] = {name: t.capabilities for name, t in REGISTRY.items()}

# How check_target names a feature in a message (default: the key's name in backquotes).
DISPLAY = {
    "op:preserve-norm": "`preserve norm`",
    "param:per-request": "a `per request` param",
    "op:scale-vector": "`scale` by a vector",
    "scope:prompt-slice": "the token scope `prompt[a:b]`",
    "scope:generated-slice": "the token scope `generated[a:b]`",
    "scope:positions": "the token scope `[i, j, ...]`",
    "scope:union": "a union of token scopes",
}
for _group, _title in (("site", "the site {}"), ("scope", "the token scope {}"),
                       ("gate", "a gate on a probe pooled with {}"), ("readout", "the readout {}"),
                       ("constraint", "the output constraint {}"), ("dtype", "the model dtype {}"),
                       ("parallel", "{} parallelism")):
    for _name in FEATURE_GROUPS[_group]:
        DISPLAY.setdefault(f"{_group}:{_name}", _title.format(f"`{_name}`"))

# Display names for the matrix.
GROUP_TITLES = {
    "op": "operations", "site": "sites", "scope": "token scopes", "gate": "gates (probe pools)",
    "readout": "probe readouts", "constraint": "output constraints", "dtype": "model dtypes",
    "parallel": "parallelism", "param": "params",
}


def capability_matrix() -> str:
    """The markdown matrix of ``spec/capabilities.md`` (generated, never hand-edited)."""
    names = list(TARGETS)
    lines = []
    for group, keys in FEATURE_GROUPS.items():
        lines.append(f"### {GROUP_TITLES[group]}\n")
        lines.append("| feature | " + " | ".join(names) + " |")
        lines.append("|---|" + "---|" * len(names))
        for k in keys:
            cells = []
            for t in names:
                f = TARGETS[t].get(f"{group}:{k}")
                mark = "yes" if f.supported else "**no**"
                text = f"{mark}: {f.note}" if f.note else mark
                if not f.supported and f.instead:
                    text += f" — instead: {f.instead}"
                cells.append(text.replace("|", "\\|"))
            lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def check_target(result, target: str) -> None:
    """Add ``unsupported-by-target`` diagnostics to a CheckResult for ``target`` (its model's family too),
    then the target's own checks of what needs the model."""
    if result.checked is None:
        return
    check_family(result, target)
    caps = TARGETS[target]
    features_refused = False
    for key, span in program_features(result.checked):
        f = caps.get(key)
        if not f.supported:
            features_refused = True
            what = DISPLAY.get(key, f"`{key.split(':', 1)[1]}`")
            result.diagnostics.append(Diagnostic.error(UNSUPPORTED_BY_TARGET,
                                                       f"the {target} target cannot express {what}: {f.note}",
                                                       span, help=f.instead or None))
    # the kernel kinds back the features up: an op its table refuses is not refused twice (once as its kernel)
    refused = None if features_refused else unlowered_kernel(result.plan, target)
    if refused is not None:
        result.diagnostics.append(refused)
    if REGISTRY[target].check is not None:
        REGISTRY[target].check(result)


def unlowered_kernel(plan, target: str):
    """``unsupported-by-target`` at the first plan kernel whose kind ``target`` does not declare it lowers
    (``Target.kernels``), or None: a kind added later is refused there until the target says otherwise."""
    if plan is None:
        return None
    lowers = REGISTRY[target].kernels
    for sp in plan.sites:
        for k in sp.kernels:
            kind = kind_of(k.op)
            if kind is None or not lowers(kind):
                return kernel_refusal(k, f"{target} target", "it lowers no such kernel")
    return None
