"""The export target: a program baked into a ``torch.export``'ed steered model (``--target export``).

:mod:`.target` is the seat (capabilities, emit); :mod:`.build` loads the model's weights, installs the hf
target's hooks (the emitted package, :mod:`steerc.targets.hf`) and exports the steered decoder with a static
KV cache. torch and transformers are imported only when a program is compiled for this target.
"""
