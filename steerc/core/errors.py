"""The one field-path error: input refused at one place in a document.

Every reader of steerc's own formats raises a subclass (a schema fault, a
plan that breaks an invariant, a request a server refuses, a plan payload a
worker refuses): ``field`` is where (``sites[0].kernels[1].op.basis``,
``steerc_params.strength``; empty for the document as a whole) and
``message`` says why, so a server can answer with the field at fault.

>>> err = FieldError("probes[0].bias", "not a finite float32 number")
>>> str(err), err.field, err.message
('probes[0].bias: not a finite float32 number', 'probes[0].bias', 'not a finite float32 number')

(``steerc.ir.param_values.ParamError`` has the same shape without this base:
the emitted HF package carries that module alone, as ``_params.py``.)
"""

from __future__ import annotations


class FieldError(ValueError):
    """Refused at ``field`` (a path into the document), because ``message``."""

    prefix = ""  # what str() puts before the field, for errors shown to a client (``steerc: ``)

    def __init__(self, field: str, message: str):
        super().__init__(f"{self.prefix}{field}: {message}" if field else f"{self.prefix}{message}")
        self.field = field
        self.message = message
