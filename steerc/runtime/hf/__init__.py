"""Steer a live transformers model with a compiled plan, in process.

Use::

    from steerc.runtime.hf import compile_for, install
    plan = compile_for("cheer.steer", model)      # checked against the live model's facts
    with install(model, plan, tokenizer):
        out = model.generate(**inputs, max_new_tokens=20)

Semantics are those of :mod:`steerc.runtime.kernels`, shared with the
emitted package (``steerc compile --target hf``): the two give identical
outputs. torch and transformers are imported only here, on use.

The layers: the shared kernels (:mod:`steerc.runtime.kernels`, at the bottom of both runtimes), then
:mod:`.install` (a plan's hooks on the model's modules, the model's facts), :mod:`.tokens` (which
positions a scope selects, for ``explain``) and :mod:`.gates` (what each gate decided, for ``run
--show-gates``); :mod:`.capture` reads activations at sites (``capture(model, tokenizer, texts, sites,
read=...)``, the same arrays as :func:`steerc.runtime.vllm.capture`).
"""

from __future__ import annotations

from steerc.runtime.hf.capture import capture
from steerc.runtime.hf.install import (
                                       SteerInstallError,
                                       check_model,
                                       compile_for,
                                       confirmed_table,
                                       discover,
                                       facts_from_model,
                                       guess_sites,
                                       install,
                                       install_program,
                                       write_facts,
)

__all__ = ["SteerInstallError", "capture", "check_model", "compile_for", "confirmed_table", "discover", "facts_from_model",
           "guess_sites", "install", "install_program", "write_facts"]
