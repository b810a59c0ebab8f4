"""One target's seat: what steerc knows about a target, in one value each target folder exports.

Each target folder's ``target.py`` exports ``TARGET``, and :mod:`steerc.targets.registry` lists them.
The command line (``--target``, ``--dialect``, ``--hmac-key-file`` and their ``--help``), ``steer.toml``'s
``target``, the family support table, the capability check and the matrix in ``spec/capabilities.md``
all read the registry: adding a target is adding one folder and one registry entry.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from steerc.targets.features import Capabilities

# emit(plan, facts, out_dir, command=..., key=...) -> the names of the files written under out_dir
Emit = Callable[..., list[str]]


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

    @property
    def selected_by(self) -> tuple[str, str]:
        return self.target or self.name, self.dialect
