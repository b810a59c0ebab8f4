"""One target's seat: what steerc knows about a target, in one value each target folder exports.

Each target folder's ``target.py`` exports ``TARGET``, and :mod:`steerc.targets.registry` lists them.
The command line (``--target``, ``--dialect``, ``--hmac-key-file`` and their ``--help``), ``steer.toml``'s
``target``, the family support table, the capability check and the matrix in ``spec/capabilities.md``
all read the registry: adding a target is adding one folder and one registry entry.
"""

from __future__ import annotations

from collections.abc import Callable

from steerc.core.record import frozen
from steerc.targets.features import Capabilities

# emit(plan, facts, out_dir, command=..., key=...) -> the names of the files written under out_dir
Emit = Callable[..., list[str]]


def with_maths(kind) -> bool:
    """The kernel kinds of the hook engines (hf, export, vllm, serve): every kind with its torch maths, which
    they run through the one dispatch (``steerc.runtime.kernels.steer``)."""
    return callable(kind.maths)


def only(*names: str) -> Callable[[object], bool]:
    """The kernel kinds of a target that lowers these by name and no other."""
    return lambda kind: kind.name in names


def kernel_refusal(kernel, target: str, why: str):
    """``unsupported-by-target`` at the intervention that made a plan kernel ``target`` cannot lower."""
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
    from steerc.ir.kernels import kind_of

    span = next((p.span for p in kernel.provenance if p.span is not None), None)
    names = ", ".join(f"`{p.intervention}`" for p in kernel.provenance) or "an intervention"
    kind = kind_of(kernel.op)
    name = kind.name if kind is not None else type(kernel.op).__name__
    return Diagnostic.error(UNSUPPORTED_BY_TARGET, f"the {target} cannot express the `{name}` kernel of {names}: "
                                                   f"{why}", span,
                            help="check the program with `steerc check --target T` for a target that supports it "
                                 "(spec/capabilities.md)")


def no_kernels(kind) -> bool:
    """The default: a target lowers no kernel kind it does not declare."""
    return False


@frozen
class Target:
    name: str  # the registry's key and the capability table's name
    help: str  # what it emits, one line of ``steerc compile --help``
    capabilities: Capabilities
    emit: Emit
    backend: str | None = None  # the engine whose module layout the family support table describes, if any
    check: Callable[[object], None] | None = None  # what it refuses that needs the model (after capabilities)
    signs: bool = False  # it takes ``--hmac-key-file``
    target: str = ""  # the ``--target`` that selects it (default: its name)
    dialect: str = "steerc"  # with this ``--dialect``
    needs_model: bool = False  # its emit builds from the model's weights: ``emit(..., model=load)``, load() -> model
    kernels: Callable[[object], bool] = no_kernels  # which kernel kinds (steerc.ir.kernels) it lowers
    reads_program: bool = False  # its emit reads the checked program too: ``emit(..., result=CheckResult)``

    @property
    def selected_by(self) -> tuple[str, str]:
        return self.target or self.name, self.dialect
