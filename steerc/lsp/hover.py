"""Hover text: what a site, a selector, a vector, a matrix, an SAE (and its feature), a param or a probe is, in
Markdown.

>>> from steerc.api import check_source
>>> from steerc.lsp.analysis import Analysis
>>> text = "steer 1\\nparam g = 2 in [0, 4]\\nintervention x {\\n  at resid_post[1]\\n  scale g\\n}\\n"
>>> a = Analysis(check_source(text, "x.steer"))
>>> print(hover(a, text.index("g =")))
**param `g`** = 2
<BLANKLINE>
range `[0, 4]`
>>> print(hover(a, text.index("resid_post")).splitlines()[0])
**`resid_post[1]`**: the residual stream leaving layer 1; the same tensor as `resid_pre[2]`
"""

from __future__ import annotations

import os
import re

import numpy as np

from steerc.frontend import fmt
from steerc.io.vectorfile import VectorFileError
from steerc.ir import nodes as ir
from steerc.ir.builtins import reads_vectors
from steerc.ir.walk import walk
from steerc.passes.layers import expand, static_layers

MEANING = {
    "resid_pre": "the residual stream entering layer {l}",
    "resid_post": "the residual stream leaving layer {l}",
    "attn_out": "what the attention block adds to the residual stream in layer {l}",
    "mlp_out": "what the MLP block adds to the residual stream in layer {l}",
    "head": "the output of head {h} of layer {l}, before the output projection",
}
# What a hook's tensor is, in words (see steerc.facts.sites).
TENSORS = {
    "input": "input",
    "input1": "residual input",
    "output": "output",
    "fused_pair": "output (hidden + residual)",
    "heads": "input, per head",
}
SHOWN_LAYERS = 6  # module paths listed per site before "..."
SHOWN_INDICES = 16


def hover(analysis, offset: int) -> str | None:
    """Markdown for what stands at ``offset``, or None."""
    hit = analysis.at(offset)
    if hit is None:
        return None
    if hit.kind == "site":
        return site_text(hit.node, analysis.result.facts)
    if hit.kind == "selector":
        return selector_text(hit.node, hit.site, hit.axis, analysis.result.facts)
    found = analysis.symbol_at(offset)
    if found is None:
        return None
    sym = found[0]
    if sym.kind == "sae":
        return sae_text(sym.decl, analysis.result, _feature_after(analysis.result.source.text, offset))
    return {"param": param_text, "vector": vector_text, "matrix": matrix_text, "probe": probe_text,
            "intervention": intervention_text}[sym.kind](sym.decl, analysis.result)


_INDEX = re.compile(r"[A-Za-z0-9_]*\s*\[\s*([0-9]{1,12})\s*\]")


def _feature_after(text: str, offset: int) -> int | None:
    """The feature index written right after the name at ``offset`` (``s[3]`` gives 3), or None."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    m = _INDEX.match(text, start)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- sites


def site_text(site: ir.SiteRef, facts) -> str:
    if site.name not in MEANING:
        return f"**`{fmt.site(site)}`**: not a site (sites are {', '.join(f'`{k}`' for k in MEANING)})"
    layers = _axis(site, 0, facts)
    lines = [f"**`{fmt.site(site)}`**: {_meaning(site.name, layers)}"]
    if facts is None:
        width = "`head_dim`" if site.name == "head" else "`d` (the hidden size)"
        lines += ["", f"width {width}; with a model (`model = ...` in steer.toml) hover shows the modules"]
        if layers is not None:
            lines.append(f"{_plural('layer', layers)} {_list(layers)}")
        return "\n".join(lines)
    width = facts.width(site.name)
    size = "head_dim" if site.name == "head" else "hidden"
    lines += ["", (f"{_plural('layer', layers)} {_list(layers)} of {facts.layers} · width {width} ({size}) · "
                   f"{facts.family}")]
    if site.name == "head":
        heads = _axis(site, 1, facts)
        lines.append(f"{_plural('head', heads)} {_list(heads)} of {facts.heads}: each a {width}-wide slice of the input of the "
                     "output projection")
    lines += ["", *_module_table(site.name, layers, facts)]
    return "\n".join(lines)


def _meaning(kind: str, layers) -> str:
    one = layers[0] if layers and len(layers) == 1 else None
    text = MEANING[kind].format(l=one if one is not None else "l", h="h")
    if kind == "resid_post":
        same = f"`resid_pre[{one + 1}]`" if one is not None else "`resid_pre[l+1]`"
        text += f"; the same tensor as {same}"
    elif kind == "resid_pre":
        if one == 0:
            text += "; the embeddings, as layer 0 reads them"
        else:
            text += f"; the same tensor as `resid_post[{one - 1 if one is not None else 'l-1'}]`"
    elif kind in ("attn_out", "mlp_out"):
        text += "; `resid_post[l] = resid_pre[l] + attn_out[l] + mlp_out[l]`"
    return text


def _module_table(kind: str, layers, facts) -> list[str]:
    from steerc.facts.sites import TABLES

    backends = [b for b in ("hf", "vllm") if facts.family in TABLES[b]]
    rows = ["| layer | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for layer in layers[:SHOWN_LAYERS]:
        cells = [_hook_cell(TABLES[b][facts.family], kind, layer) for b in backends]
        rows.append(f"| {layer} | " + " | ".join(cells) + " |")
    if len(layers) > SHOWN_LAYERS:
        rows.append(f"| ... | {len(layers) - SHOWN_LAYERS} more |" + " |" * (len(backends) - 1))
    if kind == "resid_post" and layers and layers[-1] == facts.layers - 1 and backends:
        norm = TABLES[backends[0]][facts.family].final_norm
        rows += ["", f"layer {facts.layers - 1} is the last: its output goes into the final norm (`{norm}`)"]
    return rows


def _hook_cell(table, kind: str, layer: int) -> str:
    same = ""
    if kind == "resid_pre" and layer > 0:
        kind, layer = "resid_post", layer - 1
        same = f" (as `resid_post[{layer}]`)"
    hook = table.hook(kind, layer)
    return f"`{hook.module}` {hook.kind}-hook, {TENSORS.get(hook.tensor, hook.tensor)}{same}"


def _axis(site: ir.SiteRef, axis: int, facts) -> list[int] | None:
    atoms = _atoms(site, axis)
    if atoms is None:
        return None
    if facts is None:
        return static_layers(atoms)
    return list(expand(atoms, facts.layers if axis == 0 else facts.heads).indices)


def _atoms(site: ir.SiteRef, axis: int):
    if site.name != "head":
        return site.items if axis == 0 else None
    if axis >= len(site.items):
        return None
    item = site.items[axis]
    return item.items if isinstance(item, ir.SelGroup) else (item,)


def _plural(word: str, indices) -> str:
    return word if indices is not None and len(indices) == 1 else word + "s"


def _list(indices) -> str:
    if indices is None:
        return "(given by the model)"
    if not indices:
        return "none"
    if len(indices) > SHOWN_INDICES:
        return ", ".join(map(str, indices[:SHOWN_INDICES])) + f", ... ({len(indices)} in all)"
    return ", ".join(map(str, indices))


def selector_text(atom, site: ir.SiteRef, axis: int, facts) -> str:
    what, n = ("head", facts.heads if facts else None) if axis else ("layer", facts.layers if facts else None)
    written = fmt.selector_source(atom)
    if n is None:
        static = static_layers((atom,))
        if static is None:
            return f"`{written}`: the {what}s it picks depend on the model's size; give a model to see them"
        return f"`{written}`: {_plural(what, static)} {_list(static)}"
    got = list(expand((atom,), n).indices)
    text = f"`{written}`: {_plural(what, got)} {_list(got)} of {n}" if got else \
        f"`{written}`: no {what} of the model's {n}"
    whole = _axis(site, axis, facts)
    if whole is not None and len(_atoms(site, axis) or ()) > 1:
        text += f"\n\nthe whole selector: {_plural(what, whole)} {_list(whole)}"
    return text


# -------------------------------------------------------------- names


def param_text(decl: ir.ParamDecl, result) -> str:
    value = result.values.get(decl.name)
    written = fmt.expr(decl.value)
    head = f"**param `{decl.name}`** = {_number(value) if isinstance(value, float) else written}"
    if isinstance(value, float) and written != _number(value):
        head += f" (`{written}`)"
    lines = [head]
    if decl.range is not None:
        lines += ["", f"range `[{fmt.expr(decl.range[0])}, {fmt.expr(decl.range[1])}]`"]
    if decl.per_request:
        lines += ["", f"per request: a serve request may set it (`steerc_params.{decl.name}`)"]
    if value is None:
        lines += ["", "(not evaluated: its declaration has errors)"]
    return "\n".join(lines)


def vector_text(decl: ir.VectorDecl, result) -> str:
    value = result.values.get(decl.name)
    lines = [f"**vector `{decl.name}`**" + (f" {_shape(value)}" if value is not None else "")]
    if value is not None:
        lines += ["", _norm(value)]
    else:
        lines += ["", "(not evaluated: its declaration has errors)"]
    if not _is_load(decl.value):
        lines += ["", f"= `{fmt.expr(decl.value)}`"]
    for call in (n for n in walk(decl.value) if isinstance(n, ir.Call) and reads_vectors(n.func)):
        lines += ["", _load_text(call, result.source)]
    return "\n".join(lines)


def matrix_text(decl: ir.MatrixDecl, result) -> str:
    """A matrix's shape, how far its rows are from orthonormal (what ``loreft`` asks of R), and its file."""
    from steerc.ir.kernels.loreft import ORTHONORMAL_TOLERANCE, orthonormal_error

    value = result.values.get(decl.name)
    if value is None:
        lines = [f"**matrix `{decl.name}`**", "", "(not evaluated: its declaration has errors)"]
    else:
        rows, columns = value.shape
        lines = [f"**matrix `{decl.name}`** `[{rows}, {columns}]`", ""]
        if rows <= columns:
            error = orthonormal_error(value)
            lines.append(f"rows orthonormal (R Rᵀ = I to {error:.1g}): usable as a LoReFT's R"
                         if error <= ORTHONORMAL_TOLERANCE
                         else f"rows not orthonormal (R Rᵀ is up to {error:.3g} from I): usable as a LoReFT's W, "
                              "not its R")
        else:
            lines.append("more rows than columns: usable as neither R nor W of a LoReFT (they are [r, d], "
                         "r <= d)")
    if _is_load(decl.value):
        lines += ["", _load_text(decl.value, result.source)]
    return "\n".join(lines)


def sae_text(decl: ir.SaeDecl, result, feature: int | None = None) -> str:
    """An SAE's architecture, widths, hook (and steerc's site for it), Neuronpedia id and folder; with
    ``feature``, what ``s[i]`` is and its decoder row's norm."""
    sae = result.values.get(decl.name)
    if sae is None:
        lines = [f"**sae `{decl.name}`**", "", "(not read: its declaration has errors)"]
    else:
        site = f"`{sae.site[0]}[{sae.site[1]}]`" if sae.site is not None else "no steerc site"
        lines = [f"**sae `{decl.name}`**: {sae.architecture}, d_in {sae.d_in:,}, d_sae {sae.d_sae:,}", "",
                 f"hook `{sae.hook_name}` ({site})"]
        if sae.neuronpedia_id:
            lines += ["", f"Neuronpedia `{sae.neuronpedia_id}`"]
        if feature is not None and 0 <= feature < sae.d_sae:
            try:
                norm = float(np.linalg.norm(sae.decoder_row(feature).astype(np.float64)))
                lines += ["", f"feature {feature}: as a vector its decoder row `W_dec[{feature}]`, norm {norm:.4g}; "
                          f"`read {decl.name}[{feature}]` reads its activation, `clamp feature "
                          f"{decl.name}[{feature}] to c` sets it to c"]
                if sae.neuronpedia_id:  # Neuronpedia names a feature model/source/index
                    lines += ["", f"Neuronpedia feature `{sae.neuronpedia_id}/{feature}`"]
            except (OSError, VectorFileError):  # a hover never fails: the checker reports the file
                pass
    if isinstance(decl.value, ir.Call) and decl.value.args and isinstance(decl.value.args[0], ir.Str):
        lines += ["", f"folder `{decl.value.args[0].value}`"]
    return "\n".join(lines)


def _is_load(e) -> bool:
    return isinstance(e, ir.Call) and reads_vectors(e.func)


def _shape(value) -> str:
    if hasattr(value, "rows"):
        rows = value.n_rows if value.n_rows is not None else len(value.rows)
        return f"`[{rows}, {value.width}]` (one row per layer)"
    return f"`[{int(np.asarray(value).shape[0])}]`"


def _norm(value) -> str:
    if hasattr(value, "rows"):
        norms = [float(np.linalg.norm(r)) for r in value.rows.values()]
        if not norms:
            return "no rows"
        return f"norms of its {len(norms)} rows {_number(min(norms))} to {_number(max(norms))}"
    return f"norm {_number(float(np.linalg.norm(np.asarray(value, dtype=np.float64))))}"


def _load_text(call: ir.Call, source) -> str:
    path = call.args[0].value if call.args and isinstance(call.args[0], ir.Str) else "?"
    kwargs = {k.name: k.value for k in call.kwargs}
    text = f"loaded from `{path}`"
    if source.path:
        text += f" (`{os.path.normpath(os.path.join(os.path.dirname(source.path), path))}`)"
    key = kwargs.get("key")
    if isinstance(key, ir.Str):
        text += f", key `{key.value}`"
    per_layer = kwargs.get("per_layer")
    if isinstance(per_layer, ir.Bool) and per_layer.value:
        text += ", one row per layer"
    return text


def probe_text(decl: ir.ProbeDecl, result) -> str:
    parts = [f"**probe `{decl.name}`**"]
    if decl.site is not None:
        parts.append(f"at `{fmt.site(decl.site)}`")
    if decl.readout is not None:
        parts.append(f"read `{fmt.readout(decl.readout)}`")
    if decl.pool is not None:
        parts.append(f"pool `{decl.pool.kind}`")
    return "\n\n".join(parts)


def intervention_text(decl: ir.InterventionDecl, result) -> str:
    parts = [f"**intervention `{decl.name}`**"]
    if decl.site is not None:
        parts.append(f"at `{fmt.site(decl.site)}`")
    if decl.op is not None:
        parts.append("`" + " ".join(p for p in fmt.op(decl.op) if p) + "`")
    if isinstance(decl.op, ir.ClampFeature):
        parts.append("an SAE feature set to c: `h + (c − f_i(h)) W_dec[i]`, SAELens's splice with the error term "
                     "(never the projection clamp)")
    if isinstance(decl.op, ir.LoReFT):
        parts.append("pyreft's LoReFT: `h + Rᵀ (W h + b − R h)`: inside the subspace R's rows span, h's "
                     "coordinates become `W h + b`; the rest of h is kept")
    return "\n\n".join(parts)


def _number(x: float) -> str:
    return f"{x:.6g}"
