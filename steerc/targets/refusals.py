"""What a file-format target cannot say, as ``unsupported-by-target`` diagnostics.

A target whose format says less than a program (BrainPatch, EasySteer, lm-eval's CSV) refuses in its own
lowering, by raising :class:`Refused` with the diagnostics; its ``check`` runs that lowering on a checked
program (:func:`check_by_lowering`), so ``steerc check --target`` and ``compile`` refuse the same things,
before anything is written.
"""

from __future__ import annotations


class Refused(Exception):
    """What a target's format cannot say: ``diagnostics``, each an ``unsupported-by-target`` error."""

    def __init__(self, diagnostics: list):
        super().__init__("; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics


def check_by_lowering(result, lower, *, needs_checked: bool = False) -> None:
    """Add to ``result`` the diagnostics of what ``lower(result)`` refuses (nothing for a program with errors,
    or without a plan and model facts, or without the checked program where ``needs_checked``)."""
    if not result.ok or result.plan is None or result.facts is None or (needs_checked and result.checked is None):
        return
    try:
        lower(result)
    except Refused as exc:
        result.diagnostics.extend(exc.diagnostics)


__all__ = ["Refused", "check_by_lowering"]
