"""Every target steerc lowers to, each one entry: its folder's ``TARGET`` (:class:`~steerc.targets.seat.Target`).

>>> list(REGISTRY)
['hf', 'vllm', 'serve', 'vllm-hook', 'llamacpp', 'export', 'weights', 'brainpatch', 'easysteer', 'lm-eval']
>>> TARGET_NAMES
('hf', 'vllm', 'serve', 'llamacpp', 'export', 'weights', 'brainpatch', 'easysteer', 'lm-eval')
>>> selected("serve", "vllm-hook").name
'vllm-hook'
"""

from __future__ import annotations

from steerc.targets.brainpatch.target import TARGET as BRAINPATCH
from steerc.targets.easysteer.target import TARGET as EASYSTEER
from steerc.targets.export.target import TARGET as EXPORT
from steerc.targets.hf.target import TARGET as HF
from steerc.targets.llamacpp.target import TARGET as LLAMACPP
from steerc.targets.lm_eval.target import TARGET as LM_EVAL
from steerc.targets.seat import Target
from steerc.targets.serve.target import TARGET as SERVE
from steerc.targets.vllm.target import TARGET as VLLM
from steerc.targets.vllm_hook.target import TARGET as VLLM_HOOK
from steerc.targets.weights.target import TARGET as WEIGHTS

REGISTRY: dict[str, Target] = {t.name: t for t in (HF, VLLM, SERVE, VLLM_HOOK, LLAMACPP, EXPORT, WEIGHTS,
                                                              BRAINPATCH, EASYSTEER, LM_EVAL)}

# What ``--target`` (and ``steer.toml``'s ``target``) may name, and ``--dialect``.
TARGET_NAMES = tuple(dict.fromkeys(t.selected_by[0] for t in REGISTRY.values()))
DIALECTS = tuple(dict.fromkeys(t.dialect for t in REGISTRY.values()))


def selected(target: str, dialect: str = "steerc") -> Target | None:
    """The target that ``--target target --dialect dialect`` selects (None: no such pair)."""
    return next((t for t in REGISTRY.values() if t.selected_by == (target, dialect)), None)


def dialects_of(target: str) -> tuple[str, ...]:
    return tuple(t.dialect for t in REGISTRY.values() if t.selected_by[0] == target)
