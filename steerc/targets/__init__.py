"""Targets: what a plan is lowered to. Each target is one folder with a ``target.py`` exporting its
``TARGET`` (name, help, capabilities, emit, checks), and one entry in :mod:`steerc.targets.registry`.
"""

from steerc.targets.capabilities import TARGETS, check_target
from steerc.targets.registry import REGISTRY, TARGET_NAMES

__all__ = ["REGISTRY", "TARGETS", "TARGET_NAMES", "check_target"]
