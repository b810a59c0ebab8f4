"""Targets: what a plan is lowered to (``hf``, ``vllm``, ``serve``, ``llamacpp``).

Each target declares its capabilities as data (:mod:`steerc.targets.capabilities`)
and has an emitter module; emitters are imported only when used.
"""

from steerc.targets.capabilities import TARGETS, check_target

__all__ = ["TARGETS", "check_target"]
