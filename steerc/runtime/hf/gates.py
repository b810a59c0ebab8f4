"""``steerc run --show-gates`` on HF: a :class:`GateTrace` reads the runtime's context after every forward
pass (:mod:`steerc.runtime.trace` records and reports it).

Use::

    with install(model, plan, tokenizer) as handle, GateTrace(model, handle, plan) as trace:
        model.generate(**inputs, max_new_tokens=20)
    for row in trace.report():       # one entry per batch row
        ...
"""

from __future__ import annotations

from steerc.runtime.trace import GateRecorder


class GateTrace(GateRecorder):
    """A :class:`~steerc.runtime.trace.GateRecorder` fed by a forward hook on the model."""

    def __init__(self, model, handle, plan, params=None):
        super().__init__(plan, params)
        self.context = handle.context
        self._hook = model.register_forward_hook(self._after)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self) -> None:
        self._hook.remove()

    def _after(self, module, args, output) -> None:
        self.record(self.context)
