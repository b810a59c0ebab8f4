"""The kernel seat: every kind of plan kernel, one module each, and the one table that reads them.

A plan (:mod:`steerc.ir.plan`) applies, per site, a list of kernels; each kernel's ``op`` is an instance of
a kind's op class. Every engine, format and view dispatches through :data:`KINDS` (by name) or
:func:`kind_of` (by op), as torch.fx's interpreter dispatches on an opcode: the HF runtime and the emitted
HF package, the vLLM buffers and the serve plugin, the vllm plan's and the serve format's encodings and
their JSON Schemas, the plan verifier and ``steerc explain``. :mod:`steerc.ir.interpret` stays an
independent interpreter that the tests compare them with.

Adding a kernel: one module here that exports ``KIND`` (:class:`~steerc.ir.kernels.base.Kind`), one line
in :data:`BUILT_IN`, and a lowering from the language in ``passes/lower_plan.py`` (spec/architecture.md,
"Where things go"). A kind registered at run time (:func:`register`, as the tests do) runs on the hook
engines with no other edit; targets that do not declare it refuse it.
"""

from __future__ import annotations

from steerc.ir.kernels import affine, loreft, project, rotate, sae_clamp
from steerc.ir.kernels.base import Kind, Operand

BUILT_IN = (affine.KIND, project.KIND, rotate.KIND, loreft.KIND, sae_clamp.KIND)

KINDS: dict[str, Kind] = {k.name: k for k in BUILT_IN}
_BY_OP: dict[type, Kind] = {k.op: k for k in BUILT_IN}

Affine, Project, Rotate = affine.Affine, project.Project, rotate.Rotate


def kind_of(op) -> Kind | None:
    """The kind of a plan kernel's op, or None for an op no kind declares."""
    return _BY_OP.get(type(op))


def register(kind: Kind) -> None:
    """Add a kind (a name and an op class not taken yet)."""
    if kind.name in KINDS or kind.op in _BY_OP:
        raise ValueError(f"a kernel kind named {kind.name!r} (or for {kind.op.__name__}) is registered already")
    KINDS[kind.name] = kind
    _BY_OP[kind.op] = kind


def unregister(name: str) -> None:
    """Remove a kind registered with :func:`register` (the tests' own kinds); built-in kinds stay."""
    kind = KINDS.get(name)
    if kind is None or kind in BUILT_IN:
        raise ValueError(f"{name!r} is not a registered kind that can be removed")
    del KINDS[name]
    del _BY_OP[kind.op]


__all__ = ["KINDS", "BUILT_IN", "Kind", "Operand", "Affine", "Project", "Rotate", "kind_of", "register",
           "unregister"]
