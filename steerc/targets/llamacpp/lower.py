"""``--target llamacpp``: a site plan as one of llama.cpp's control vectors.

llama.cpp (``--control-vector FILE``, or ``llama_set_adapter_cvec``) adds
``direction.N`` of the file to the output of decoder layer ``N`` at every
position it computes, prompt and generated, for ``N`` from 1 to ``n_layer -
1`` (the convention and where it was read: :mod:`steerc.io.controlvector`).
So a plan lowers exactly when every kernel is an unconditional ``add`` of a
constant vector on all tokens at a residual-stream site:

=====================================  ==========================================
steerc plan                            the control vector
=====================================  ==========================================
``add v`` at ``resid_post[l]``, l >= 1  ``direction.l`` (``resid_pre[l]`` is ``resid_post[l-1]``)
several adds at one layer              their sum (llama.cpp sums several files too)
a layer nothing steers                 ``direction.l`` of zeros
=====================================  ==========================================

The file holds ``direction.1`` to ``direction.(L-1)``, as llama.cpp's
cvector-generator writes them, so it can be loaded back into a ``.steer``
program as a bank (``at resid_post[1:] add load("control_vector.gguf")``)
and means the same plan. What the capability data refuses (other ops,
sites and scopes, gates, schedules, per-request params, constraints) is
reported by ``check_target``; :func:`check_llamacpp` adds what needs the
model: the sites llama.cpp cannot reach — ``resid_pre[0]`` (the
embeddings) and ``resid_post[0]`` = ``resid_pre[1]`` (llama.cpp has no
tensor for layer 0 and its loader refuses ``direction.0``) — and a sum of
adds too large for float32.

>>> from steerc.api import check_source
>>> from steerc.facts import facts_from_config
>>> facts = facts_from_config({"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 2,
...                            "num_attention_heads": 1, "intermediate_size": 4, "vocab_size": 10})
>>> r = check_source('steer 1\\nintervention a {\\n  at resid_post[1:]\\n  add [1.0, 2.0]\\n}\\n'
...                  'intervention b {\\n  at resid_pre[2]\\n  add [0.5, 0.5]\\n}\\n', facts=facts)
>>> {layer: v.tolist() for layer, v in directions(r.plan, facts).items()}
{1: [1.5, 2.5], 2: [1.0, 2.0]}
"""

from __future__ import annotations

import numpy as np

from steerc.core.limits import FLOAT32_MAX
from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import nodes as ir
from steerc.ir.plan import Affine, Plan

TARGET = "llamacpp"
FILE_NAME = "control_vector.gguf"
_ELSEWHERE = "or use the hf or vllm target"


class LlamacppError(ValueError):
    """A plan with a kernel the capability check should have refused: a steerc bug, never a user error."""


def check_llamacpp(result) -> None:
    """Add ``unsupported-by-target`` errors for the sites llama.cpp cannot reach, and sums too large (see above).

    Without a model, only the layers a selector names outright are judged.
    """
    checked, facts = result.checked, result.facts
    if checked is None:
        return
    from steerc.passes.layers import expand, static_layers

    for iv in checked.interventions:
        if iv.site.kind not in ("resid_pre", "resid_post"):
            continue  # other kinds: the capability check
        # Without a model, the layers written outright (resid_post[0], resid_pre[0:2]).
        layers = set(expand(iv.site.layers, facts.layers).indices if facts is not None
                     else static_layers(iv.site.layers) or ())
        for what, why, help in _unreachable(iv.site.kind, layers):
            result.diagnostics.append(Diagnostic.error(
                UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express {what}, in intervention `{iv.name}`: "
                                         f"{why}", iv.site.span, help=help))
    if result.ok and result.plan is not None:
        result.diagnostics.extend(_overflows(result.plan))


def _unreachable(kind: str, layers: set):
    later = f"steer resid_post[1:] (llama.cpp's layers 1 to L-1), {_ELSEWHERE}"
    layer0 = ("llama.cpp never adds a control vector to layer 0's output (its adapter has no tensor for layer 0 "
              "and its loader refuses `direction.0`)")
    if kind == "resid_pre" and 0 in layers:
        yield "the embeddings, resid_pre[0]", "llama.cpp adds control vectors to decoder-layer outputs only", later
    if kind == "resid_pre" and 1 in layers:
        yield "resid_pre[1] (= resid_post[0]), layer 0's output", layer0, later
    if kind == "resid_post" and 0 in layers:
        yield "resid_post[0], layer 0's output", layer0, later


def _overflows(plan: Plan) -> list[Diagnostic]:
    out = []
    for sp in plan.sites:
        total = _sum(sp)
        if total is not None and not np.all(np.abs(total) <= FLOAT32_MAX):
            prov = next((p for k in sp.kernels for p in k.provenance), None)
            names = ", ".join(f"`{n}`" for k in sp.kernels for n in k.names)
            out.append(Diagnostic.error(
                UNSUPPORTED_BY_TARGET,
                f"the {TARGET} target cannot express the sum of the adds at {sp.site.text} ({names}): llama.cpp "
                "sums them into one float32 vector, and this one does not fit float32",
                prov.span if prov is not None else None, help="add smaller vectors"))
    return out


def _sum(sp) -> np.ndarray | None:
    """The float64 sum of a site's adds (None for a site with none)."""
    total = None
    for k in sp.kernels:
        op = k.op
        plain = (isinstance(op, Affine) and isinstance(op.scale, float) and op.scale == 1.0 and op.bias is not None
                 and not op.schedule and k.gate is None and not k.preserve_norm and not k.bindings
                 and k.scope == (ir.ScopeAll(),))
        if not plain:
            raise LlamacppError(f"a kernel at {sp.site.text} is not an unconditional add on all tokens: {k!r}")
        v = op.bias.array.astype(np.float64)
        total = v if total is None else total + v
    return total


def directions(plan: Plan, facts) -> dict[int, np.ndarray]:
    """``{N: float32 vector}`` for llama.cpp's layers 1 .. L-1: the plan's adds at ``resid_post[N]``, summed."""
    out = {layer: np.zeros(facts.hidden, dtype=np.float32) for layer in range(1, facts.layers)}
    for sp in plan.sites:
        if sp.site.kind != "resid_post" or sp.site.layer == 0:
            raise LlamacppError(f"llama.cpp cannot steer {sp.site.text}; the check should have refused it")
        total = _sum(sp)
        if total is not None:
            out[sp.site.layer] = total.astype(np.float32)
    return out


def control_vector(plan: Plan, facts, command: str = "") -> bytes:
    """The GGUF bytes of the plan's control vector (the same plan and facts give the same bytes)."""
    from steerc import __version__
    from steerc.io.controlvector import control_vector_bytes, llamacpp_arch

    provenance = [("steerc.version", __version__), ("steerc.source_sha256", plan.source_sha256),
                  ("steerc.facts_fingerprint", plan.facts_fingerprint)]
    if command:
        provenance.append(("steerc.command", command))
    return control_vector_bytes(directions(plan, facts), llamacpp_arch(facts.family), provenance)


__all__ = ["FILE_NAME", "LlamacppError", "TARGET", "check_llamacpp", "control_vector", "directions"]
