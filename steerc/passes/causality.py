"""Pass `causality`: a gate must be decided before the positions it steers.

Two rules (LANGUAGE.md section 6):

* a gate reading a probe pooled over the prompt (``prompt.mean``,
  ``prompt.last``) is decided once the whole prompt has passed the probe's
  site, so its intervention may steer generated positions only;
* a gate reading a per-token probe steers a position at the probe's site or
  at a later site in the forward order ``resid_pre[l] < head[l, *] <
  attn_out[l] < mlp_out[l] < resid_post[l] = resid_pre[l+1]``.

The site rule needs concrete layers: without a model it is checked where
selectors name layers outright, and the layout pass checks the rest.
"""

from __future__ import annotations

from steerc.diagnostics import Note
from steerc.diagnostics.codes import CAUSALITY
from steerc.frontend.fmt import scope
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.passes.context import CheckContext
from steerc.passes.layers import static_layers

name = CAUSALITY

_SUB = {"resid_pre": 0, "head": 1, "attn_out": 2, "mlp_out": 3}


def order_key(kind: str, layer: int) -> tuple[int, int]:
    """Position of a site in the forward pass (resid_post[l] is resid_pre[l+1])."""
    if kind == "resid_post":
        return (layer + 1, 0)
    return (layer, _SUB[kind])


def site_text(kind: str, layer: int) -> str:
    return f"{kind}[{layer}, *]" if kind == "head" else f"{kind}[{layer}]"


def run(ctx: CheckContext) -> None:
    checked(ctx, lambda pattern: static_layers(pattern.layers))


def checked(ctx: CheckContext, layers_of, only_dynamic: bool = False) -> None:
    """Check both rules; ``layers_of(pattern)`` gives concrete layers or ``None``.

    ``only_dynamic``: the prompt rule and the site rule for pairs of sites named
    outright were checked already (without a model); check only the rest.
    """
    program = ctx.checked
    for iv in program.interventions:
        if iv.gate is None:
            continue
        probes = [program.probes[p] for p in ck.gate_probes(iv.gate) if p in program.probes]
        pooled = [p for p in probes if not p.per_token]
        if pooled and not all(isinstance(s, ir.ScopeGenerated) for s in iv.scopes):
            if not only_dynamic:
                _prompt_rule(ctx, iv, pooled[0])
            continue
        for probe in (p for p in probes if p.per_token):
            if only_dynamic and _static(probe.site) and _static(iv.site):
                continue
            if _site_rule(ctx, iv, probe, layers_of):
                break


def _static(pattern: ck.SitePattern) -> bool:
    return static_layers(pattern.layers) is not None


def _prompt_rule(ctx: CheckContext, iv: ck.Intervention, probe: ck.Probe) -> None:
    ctx.error(
        CAUSALITY,
        f"probe `{probe.name}` pools over the prompt ({probe.pool}), so it is decided only after the "
        f"prompt has passed; intervention `{iv.name}` would also steer prompt positions "
        f"(tokens {', '.join(scope(s) for s in iv.scopes)})",
        iv.gate_span,
        notes=(Note("pooled over the prompt here", probe.pool_span or probe.span),),
        help="add `tokens generated` (or `generated[a:b]`), or use `pool token` for a per-token decision",
    )


def _site_rule(ctx: CheckContext, iv: ck.Intervention, probe: ck.Probe, layers_of) -> bool:
    probe_layers = layers_of(probe.site)
    iv_layers = layers_of(iv.site)
    if not probe_layers or not iv_layers:
        return False
    probe_key = order_key(probe.site.kind, probe_layers[0])
    for layer in iv_layers:
        if order_key(iv.site.kind, layer) < probe_key:
            ctx.error(
                CAUSALITY,
                f"per-token probe `{probe.name}` reads {site_text(probe.site.kind, probe_layers[0])}, which the "
                f"forward pass reaches after {site_text(iv.site.kind, layer)} where `{iv.name}` acts",
                iv.gate_span,
                notes=(Note("the probe's site", probe.site.span),),
                help="a per-token gate steers its probe's site or a later one: move the probe earlier "
                "or the intervention later",
            )
            return True
    return False
