"""Which matrix each site's kernels fold into, per family, and what the weights target refuses.

A site folds when one matrix writes it and its kernels are affine maps ``f(y) = L y + c`` of the site's
value ``y`` (spec/targets.md, "`weights`"):

============================  =============================================  ==========================
site                          the matrix (Llama's names)                     ``c != 0`` needs
============================  =============================================  ==========================
``attn_out[l]``               ``model.layers.l.self_attn.o_proj`` (output)   a bias on ``o_proj``
``head[l, h]``                ``o_proj``'s columns ``h*hd : (h+1)*hd``       a bias on ``o_proj``
``mlp_out[l]``                ``model.layers.l.mlp.down_proj`` (output)      a bias on ``down_proj``
``resid_pre[0]``              ``model.embed_tokens`` (every row)             nothing: rows carry it
============================  =============================================  ==========================

``resid_post[l]`` (= ``resid_pre[l+1]``) is the sum of everything written to the stream so far, which no
one matrix writes: it is refused, and an ``ablate`` there is shown the program that folds (the direction
ablated from every writer of the stream).

>>> FAMILIES["llama"].attn_bias
'attention_bias'
>>> matrix_of("mlp_out", 3, FAMILIES["qwen2"])
'model.layers.3.mlp.down_proj'
"""

from __future__ import annotations

from steerc.core.record import frozen
from steerc.diagnostics import Diagnostic, Note
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET

TARGET = "weights"
EMBED = "model.embed_tokens"
LM_HEAD = "lm_head"
O_PROJ = "model.layers.{l}.self_attn.o_proj"
DOWN_PROJ = "model.layers.{l}.mlp.down_proj"


@frozen
class Family:
    """How one family's checkpoint holds the matrices the target folds into, read from transformers 5.25's
    ``modeling_*.py`` and vLLM 0.32's ``model_executor/models/*.py`` (both must load the result alike)."""

    name: str
    attn_bias: str | None = None  # the config key that gives o_proj a bias (and q, k, v, written as zeros)
    mlp_bias: str | None = None  # the config key that gives down_proj a bias (and gate, up, written as zeros)
    no_attn_bias: str = ""  # why o_proj can carry no bias (for the diagnostic)
    no_mlp_bias: str = ""


FAMILIES: dict[str, Family] = {f.name: f for f in (
    # LlamaAttention: every projection has bias=config.attention_bias (vLLM: bias_o_proj = attention_bias);
    # LlamaMLP: gate, up and down have bias=config.mlp_bias (vLLM alike).
    Family("llama", attn_bias="attention_bias", mlp_bias="mlp_bias"),
    Family("mistral", no_attn_bias="Mistral's projections have no bias and no config key that adds one",
           no_mlp_bias="Mistral's MLP has no bias and no config key that adds one"),
    Family("qwen2", no_attn_bias="Qwen2's o_proj has no bias (only its q, k and v projections have)",
           no_mlp_bias="Qwen2's MLP has no bias"),
    Family("qwen3", no_attn_bias="transformers gives Qwen3's o_proj a bias with attention_bias, but vLLM's Qwen3 "
                                 "never does, so the checkpoint would mean something else there",
           no_mlp_bias="Qwen3's MLP has no bias"),
)}

ATTN_SLOT = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "o_proj": "hidden"}  # bias width of each
MLP_SLOT = {"gate_proj": "intermediate", "up_proj": "intermediate", "down_proj": "hidden"}


def matrix_of(kind: str, layer: int, family: Family) -> str:
    """The module whose weight the kernels of site ``kind`` at ``layer`` fold into."""
    if kind == "resid_pre":
        return EMBED
    return (DOWN_PROJ if kind == "mlp_out" else O_PROJ).format(l=layer)


# ------------------------------------------------------------------------------------------ the check


def check_weights(result) -> None:
    """``unsupported-by-target`` for what needs more than the capability table: a family without a layout here,
    ``resid_pre[l]`` for ``l >= 1``, an ``ablate`` at ``resid_post`` (shown the program that folds), a rotation
    *to* an angle, and a constant part where the family has no bias. Reads the config only, never weights."""
    checked, facts = result.checked, result.facts
    if checked is None:
        return
    _resid(result, checked, facts)
    if facts is None:
        return
    family = FAMILIES.get(facts.family)
    if family is None:
        result.diagnostics.append(Diagnostic.error(
            UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot fold into the `{facts.family}` family: it folds "
                                   f"into the layouts of {', '.join(FAMILIES)} (model.embed_tokens, "
                                   "self_attn.o_proj, mlp.down_proj)", None,
            help="use a family it knows, or the hf or vllm target, which steer the model with hooks"))
        return
    if result.plan is not None:
        result.diagnostics.extend(_kernel_refusals(result.plan, family))


def _resid(result, checked, facts) -> None:
    from steerc.passes.layers import expand, static_layers

    for iv in checked.interventions:
        kind = iv.site.kind
        if kind == "resid_post" and iv.op.kind == "ablate":  # the table's refusal, with the program that folds
            _replace(result, iv.site.span, Diagnostic.error(
                UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express the site `resid_post`: {_STREAM} "
                                       f"(`{iv.name}` ablates it there)", iv.site.span, help=_ABLATE_HELP,
                notes=_ablate_program(result, iv)))
        if kind != "resid_pre":
            continue
        layers = set(expand(iv.site.layers, facts.layers).indices if facts is not None
                     else static_layers(iv.site.layers) or ())
        if not any(n >= 1 for n in layers):
            continue
        ablate = iv.op.kind == "ablate"
        result.diagnostics.append(Diagnostic.error(
            UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express resid_pre[l] for l >= 1 (= resid_post[l-1]), "
                                   f"in intervention `{iv.name}`: {_STREAM}", iv.site.span,
            help=_ABLATE_HELP if ablate else "steer attn_out[l] or mlp_out[l] (the matrices that write the stream), "
                                             "resid_pre[0] (the embeddings), or use the hf or vllm target",
            notes=_ablate_program(result, iv) if ablate else ()))


_STREAM = ("the residual stream after a layer is the sum of everything written to it (the embeddings, every o_proj "
           "and every down_proj), which no one matrix writes")
_ABLATE_HELP = ("ablate the direction from everything that writes the stream instead: it folds into orthogonalised "
                "weights, and the stream then has no component along it anywhere, between the attention and the "
                "MLP of a layer too (which an ablate of the stream at resid_post leaves alone)")


def _replace(result, span, diagnostic) -> None:
    """``diagnostic`` in place of the capability table's refusal at ``span`` (one diagnostic per site)."""
    result.diagnostics[:] = [d for d in result.diagnostics
                             if not (d.code == UNSUPPORTED_BY_TARGET and d.span == span)]
    result.diagnostics.append(diagnostic)


def _ablate_program(result, iv) -> tuple[Note, ...]:
    """The program that ablates the intervention's directions from every writer of the stream, a note a line."""
    op = _text(result, iv.op.span) or "ablate u"
    program = [line for part, site in (("embed", "resid_pre[0]"), ("attn", "attn_out[*]"), ("mlp", "mlp_out[*]"))
               for line in (f"intervention {iv.name}_{part} {{", f"  at {site}", f"  {op}", "}")]
    return (Note("the program that folds, one line of it per note:"), *(Note(line) for line in program))


def _text(result, span) -> str:
    source = result.sources.get(span.file) if span is not None else None
    if source is None or span.start < 0 or span.end <= span.start:
        return ""
    text = " ".join(source.text[span.start:span.end].split())
    return text if len(text) <= 200 else ""


def _kernel_refusals(plan, family: Family) -> list[Diagnostic]:
    from steerc.targets.seat import kernel_refusal
    from steerc.targets.weights.fold import has_offset, why_not_affine

    out = []
    for sp in plan.sites:
        kind = sp.site.kind
        for k in sp.kernels:
            why = why_not_affine(k.op)
            if why:
                out.append(kernel_refusal(k, f"{TARGET} target", why))
            elif has_offset(k.op) and kind != "resid_pre":
                why = _no_bias(kind, family)
                if why:
                    matrix = matrix_of(kind, sp.site.layer, family)
                    out.append(kernel_refusal(
                        k, f"{TARGET} target", f"its constant part folds into a bias on {matrix}, and the "
                                               f"`{family.name}` family cannot carry one there: {why}"))
    return out


def _no_bias(kind: str, family: Family) -> str:
    if kind == "mlp_out":
        return "" if family.mlp_bias else family.no_mlp_bias
    return "" if family.attn_bias else family.no_attn_bias


# ------------------------------------------------------------------------------------------ what folds where


@frozen
class Fold:
    """One matrix a plan rewrites, and the site plans that fold into it, in forward order."""

    module: str  # e.g. model.layers.2.self_attn.o_proj
    sites: tuple  # SitePlans
    needs_bias: bool  # whether its constant parts need a bias on the module


def folds(plan, facts) -> list[Fold]:
    """The matrices the plan rewrites, in the order of their first site."""
    family = FAMILIES[facts.family]
    by: dict[str, list] = {}
    for sp in plan.sites:
        if sp.site.kind == "resid_post" or (sp.site.kind == "resid_pre" and sp.site.layer != 0):
            raise ValueError(f"{sp.site.text} does not fold; the check should have refused it")
        by.setdefault(matrix_of(sp.site.kind, sp.site.layer, family), []).append(sp)
    from steerc.targets.weights.fold import has_offset

    return [Fold(module, tuple(sps), module != EMBED and any(has_offset(k.op) for sp in sps for k in sp.kernels))
            for module, sps in by.items()]


def describe(plan, facts) -> dict[str, dict]:
    """{site text: how its kernels fold} for ``steerc explain --target weights``."""
    out = {}
    for f in folds(plan, facts):
        for sp in f.sites:
            if sp.site.kind == "resid_pre":
                how = (f"every row e of {EMBED}.weight becomes f(e)"
                       + (f" (the tied {LM_HEAD} is untied and keeps the original rows)" if facts.tied_embeddings
                          else ""))
                weight = f"{EMBED}.weight"
            elif sp.site.kind == "head":
                lo, hi = sp.site.head * facts.head_dim, (sp.site.head + 1) * facts.head_dim
                how = f"columns {lo}:{hi} of W become W[:, {lo}:{hi}] L; W[:, {lo}:{hi}] c is added to its bias"
                weight = f"{f.module}.weight"
            else:
                how = "W becomes L W" + ("; its bias b becomes f(b) (b = 0 where it had none)" if f.needs_bias
                                          else "")
                weight = f"{f.module}.weight"
            out[sp.site.text] = {"matrix": weight, "bias": f"{f.module}.bias" if f.needs_bias else None,
                                 "how": how}
    return out
