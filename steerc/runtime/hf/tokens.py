"""Which positions of one prompt a scope selects, computed by the HF runtime's own code.

``steerc explain --tokens`` shows, per intervention, the prompt tokens and
the first generated positions it steers. Those positions come from
:class:`steerc.runtime.kernels.Context` exactly as a steered ``generate``
call makes them: one forward pass over the prompt (where ``P`` and the
``after "..."`` starts are fixed), then one pass per generated token; each
pass asks the context for the scope's mask, as every kernel does.

>>> from steerc.ir import nodes as ir
>>> from steerc.targets.hooks import scope_data
>>> scope = scope_data((ir.ScopePrompt(ir.PosSlice(-2, None)), ir.ScopeGenerated(ir.PosSlice(None, 2))))
>>> selected([scope], None, [5, 6, 7, 8], 3)[scope]
((2, 3), (0, 1))
"""

from __future__ import annotations

import torch

from steerc.runtime import hooks as H


def selected(scopes, tokenizer, ids: list[int], generated: int) -> dict:
    """``{scope: (prompt positions, generated indices)}`` for scopes as :func:`~steerc.targets.hooks.scope_data`
    gives them, on the prompt ``ids`` and the first ``generated`` positions after it.

    A generated index ``j`` is position ``P + j`` (``generated[j]``). ``tokenizer`` is needed only by
    ``after "..."`` items (it decodes the prompt, as the runtime does).
    """
    scopes = list(dict.fromkeys(scopes))
    after = sorted({item[1] for scope in scopes for item in scope if item[0] == "after"})
    context = H.Context(tokenizer, after)
    context.generating = context.expect_prompt = True  # as inside a steered generate() call
    prompt = torch.tensor([list(ids)], dtype=torch.long)
    context.begin_forward(prompt, None, torch.ones_like(prompt), 0)
    out = {scope: (_where(context.scope_mask(scope)), []) for scope in scopes}
    length = len(ids)
    for j in range(generated):
        fed = torch.zeros((1, 1), dtype=torch.long)  # the token's identity does not move positions
        context.begin_forward(fed, None, torch.ones((1, length + j + 1), dtype=torch.long), length + j)
        for scope in scopes:
            if context.scope_mask(scope)[0, 0]:
                out[scope][1].append(j)
    return {scope: (prompt_at, tuple(gen)) for scope, (prompt_at, gen) in out.items()}


def _where(mask) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(mask[0]).flatten())
