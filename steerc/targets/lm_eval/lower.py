"""``--target lm-eval``: a checked program as lm-eval's CSV steering config, the inverse of ``steerc import``.

lm-eval 0.4.13's ``steered`` model (``lm_eval/models/hf_steered.py``) takes every CSV row's direction from an
SAE's decoder row (``sae_lens``), and steers a module's output at every position. Of its two actions only
``clamp`` runs through the CSV: ``derive_steer_config`` gives every row the SAE's ``b_dec`` as its bias, and
``SteeredModel.__init__`` asserts that an ``add`` has none. Its clamp sets the component of ``h - b_dec`` along
``û = W_dec[i] / ‖W_dec[i]‖`` to ``c``: steerc's ``clamp s[i] to c + dot(b_dec, û)``. So a program lowers when
every plan kernel is the clamp of an SAE feature ``s[i]`` (one ``project`` kernel of one direction and a
target), on every token, with no gate, no ``preserve norm`` and no per-request param, one a hookpoint:

=====================  ==================================================================================
steerc                 lm-eval CSV row
=====================  ==================================================================================
``clamp s[i] to t``    ``sae_lens,clamp,<release>,<hookpoint>,i,c,,<sae_id>,...`` with
                       ``c = t - dot(b_dec, û)`` (float64; the nearest float that adds back to ``t``)
``sae("D/R/I")``       release ``R`` (``owner--name`` is ``owner/name``), sae_id ``I``: the SAE folder's
                       last two path components, as ``steerc import --sae-root D`` reads them back
``resid_post[L]``      ``layers.L``; ``attn_out[L]`` ``layers.L.self_attn``; ``mlp_out[L]``
                       ``layers.L.mlp``; ``resid_pre[0]`` ``embed_tokens`` (families whose layer 0 reads
                       the embedding as it is); each where the family's hf site table hooks that module's
                       output under ``model.`` (lm-eval names modules of ``model.base_model``)
=====================  ==================================================================================

Anything else is ``unsupported-by-target`` with the reason, before anything is written.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import nodes as ir
from steerc.ir.kernels import kind_of
from steerc.targets.refusals import Refused, check_by_lowering
from steerc.targets.seat import only

TARGET = "lm-eval"
CLAMPS = only("project")  # the one kernel kind it lowers (its seat's `kernels`); of it, one direction and a target
FILE = "steer.csv"
COLUMNS = ("loader", "action", "sparse_model", "hookpoint", "feature_index", "steering_coefficient", "head_index",
           "sae_id", "description")
# lm-eval names a module of model.base_model; the families whose base model is `model` and whose sites are
# these modules' outputs (checked against the hf site table), and those whose layer 0 reads embed_tokens' output
# unscaled (gemma multiplies it by sqrt(d), granite by its embedding_multiplier: no module outputs that).
HOOKPOINTS = {"resid_post": "layers.{}", "attn_out": "layers.{}.self_attn", "mlp_out": "layers.{}.mlp"}
PLAIN_EMBEDDING = frozenset({"llama", "mistral", "qwen2", "qwen3", "olmo2", "mixtral", "qwen2_moe", "qwen3_moe"})
_SEGMENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*")  # what `steerc import --sae-root` reads back
_INSTEAD = "use the hf or vllm target, or steer what lm-eval's CSV can say (spec/formats.md)"




@dataclass(frozen=True)
class Row:
    release: str
    hookpoint: str
    index: int
    coefficient: float
    sae_id: str
    description: str


def _refuse(message: str, span, help: str = _INSTEAD) -> Refused:
    return Refused([Diagnostic.error(UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express {message}", span,
                                     help=help)])


def _span(kernel):
    return next((p.span for p in kernel.provenance if p.span is not None), None)


def hookpoint(site, family: str, span) -> str:
    """lm-eval's module name (of ``model.base_model``) whose output is ``site`` on ``family``."""
    from steerc.facts.sites import TABLES

    table = TABLES["hf"].get(family)
    if site.kind == "resid_pre" and site.layer == 0:
        if family in PLAIN_EMBEDDING and table is not None and table.resid_pre0.module == "model.layers.0":
            return "embed_tokens"
        raise _refuse(f"resid_pre[0] on the `{family}` family: lm-eval steers module outputs, and this family's "
                      "layer 0 does not read embed_tokens' output as it is", span, help="steer resid_post[l]")
    template = HOOKPOINTS.get(site.kind)
    if template is None:
        raise _refuse(f"{site.text}: lm-eval's CSV steers a module's whole output (it does not read head_index)",
                      span, help="steer resid_post, attn_out or mlp_out")
    name = template.format(site.layer)
    hook = table.hook(site.kind, site.layer) if table is not None else None
    if hook is None or (hook.module, hook.kind, hook.tensor) != (f"model.{name}", "post", "output"):
        where = f"module `{hook.module}` ({hook.kind}, {hook.tensor})" if hook is not None else "no module steerc knows"
        raise _refuse(f"{site.text} on the `{family}` family: steerc's {site.kind} is {where}, not the output of "
                      f"lm-eval's `{name}`", span, help="steer resid_post[l], or a family of the Llama layout")
    return name


def release_of(folder: str) -> tuple[str, str]:
    """(release, sae_id) of an SAE folder: its parent's name (``owner--name`` is ``owner/name``) and its own, as
    ``steerc import --sae-root DIR`` reads ``DIR/<release>/<sae_id>`` back; ValueError saying why not."""
    path = os.path.normpath(os.path.abspath(folder))
    sae_id, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
    for part in (parent, sae_id):
        if not part or not _SEGMENT.fullmatch(part) or part in (".", ".."):
            raise ValueError(f"its folder's last two names `{parent}/{sae_id}` are not a release and an sae_id "
                             "(letters, digits and `_.-`)")
    if parent.count("--") > 1:
        raise ValueError(f"its release folder `{parent}` holds `--` twice (`owner--name` stands for a repo id)")
    return parent.replace("--", "/"), sae_id


def coefficient(target: float, offset: float) -> float:
    """lm-eval's ``c`` for steerc's clamp target ``t = c + offset``: the float nearest ``t - offset`` that adds
    back to ``t`` exactly (so the import of the row folds to the same target)."""
    c = target - offset
    for candidate in (c, *(f(c, d) for d in range(1, 5) for f in (_up, _down))):
        if candidate + offset == target:
            return candidate
    return c


def _up(x: float, n: int) -> float:
    for _ in range(n):
        x = math.nextafter(x, math.inf)
    return x


def _down(x: float, n: int) -> float:
    for _ in range(n):
        x = math.nextafter(x, -math.inf)
    return x


class _Program:
    """The declarations of the checked program that a kernel's clamp direction is traced back through."""

    def __init__(self, result):
        statements = result.program.statements if result.program is not None else ()
        self.decls = {s.name: s for s in statements if isinstance(s, (ir.VectorDecl, ir.SaeDecl, ir.ParamDecl))}
        self.interventions = {s.name: s for s in statements if isinstance(s, ir.InterventionDecl)}
        self.checked = {iv.name: iv for iv in result.checked.interventions}
        self.values = result.values

    def feature(self, name: str, span):
        """(SAE, i, the span of the SAE's folder string) of the ``s[i]`` that ``name``'s clamp steers along."""
        decl = self.interventions.get(name)
        expr = decl.op.direction if decl is not None and isinstance(decl.op, ir.Clamp) else None
        for _ in range(16):  # vector v = w, w = s[i]: names of names
            if isinstance(expr, ir.Name) and isinstance(self.decls.get(expr.id), ir.VectorDecl):
                expr = self.decls[expr.id].value
            else:
                break
        if not isinstance(expr, ir.Index):
            raise _refuse(f"the clamp of `{name}`: its direction is no SAE feature, and every lm-eval CSV row "
                          "takes its direction from an SAE's decoder row", span,
                          help="clamp an SAE feature `s[i]` (a SAELens folder: sae(\"DIR/<release>/<sae_id>\"))")
        sae = self.values.get(expr.base.id)
        index = self._index(expr.index)
        if sae is None or not hasattr(sae, "decoder_row") or index is None:
            raise _refuse(f"the clamp of `{name}`: steerc cannot tell its SAE feature's index without evaluating "
                          "the program further", expr.span, help="write the feature's index as a number: s[12]")
        decl_of = self.decls.get(expr.base.id)
        folder_span = decl_of.value.span if decl_of is not None else expr.span
        return sae, index, folder_span

    def _index(self, e) -> int | None:
        if isinstance(e, ir.Number):
            value = e.value
        elif isinstance(e, ir.Name) and isinstance(self.values.get(e.id), float):
            value = self.values[e.id]
        else:
            return None
        return int(value) if value == int(value) else None


def rows_of(result) -> list[Row]:
    """Each plan kernel as a CSV row, in the plan's site order; :class:`Refused` otherwise."""
    plan, facts = result.plan, result.facts
    program = _Program(result)
    rows, at = [], {}
    for sp in plan.sites:
        kernel = sp.kernels[0]
        name = kernel.provenance[0].intervention if kernel.provenance else "an intervention"
        hook = hookpoint(sp.site, facts.family, _span(kernel))
        names = [p.intervention for k in sp.kernels for p in k.provenance]
        if len(sp.kernels) > 1 or len(set(names)) > 1 or hook in at:
            both = " and ".join(f"`{n}`" for n in dict.fromkeys([*at.get(hook, []), *names]))
            raise _refuse(f"{both} at one hookpoint ({hook}): lm-eval keeps one row per hookpoint (the last "
                          "replaces the others)", _span(sp.kernels[-1]), help="one intervention a site")
        at[hook] = names
        rows.append(_row(kernel, name, hook, program))
    if not rows:
        raise _refuse("a program that steers nothing: lm-eval's CSV has at least one row", None,
                      help="add an intervention")
    return rows


def _row(kernel, name: str, hook: str, program: _Program) -> Row:
    span = _span(kernel)
    op = kernel.op
    kind = kind_of(op)
    checked = program.checked.get(name)
    if kind is None or not CLAMPS(kind) or checked is None or checked.op.kind != "clamp" \
            or len(op.basis) != 1 or op.target is None:
        raise _refuse(f"`{name}`: lm-eval's CSV clamps one SAE feature (its `add` rows fail lm-eval 0.4.13's own "
                      "assert), and this kernel does more", span, help="write `clamp s[i] to c`")
    if kernel.gate is not None or kernel.preserve_norm or kernel.bindings:
        what = "gate" if kernel.gate is not None else "preserve norm" if kernel.preserve_norm else "per-request param"
        raise _refuse(f"`{name}`'s {what}: lm-eval steers unconditionally, with the CSV's fixed coefficient", span)
    if not all(isinstance(s, ir.ScopeAll) for s in kernel.scope):
        raise _refuse(f"the scope of `{name}`: lm-eval steers every position", span, help="drop the `tokens` line")
    sae, index, folder_span = program.feature(name, span)
    try:
        release, sae_id = release_of(sae.folder)
    except ValueError as exc:
        raise _refuse(f"the SAE of `{name}` as a sae_lens release and id: {exc}", folder_span,
                      help="keep the SAE at DIR/<release>/<sae_id> (`steerc import --sae-root DIR` reads it back)") \
            from None
    row = np.asarray(sae.decoder_row(index), dtype=np.float64)
    norm = float(np.linalg.norm(row))
    u = row / norm
    if not np.allclose(np.asarray(op.basis[0].array, np.float64), u, rtol=0, atol=1e-5):
        raise _refuse(f"the clamp of `{name}`: its direction is not the decoder row of feature {index}", span)
    offset = float(np.asarray(sae.tensor("b_dec"), dtype=np.float64) @ u)
    c = coefficient(float(op.target[0]), offset)
    if not math.isfinite(c) or abs(c) > 3.4028234663852886e38:
        raise _refuse(f"the clamp of `{name}`: lm-eval's coefficient {c!r} does not fit float32", span)
    return Row(release, hook, index, c, sae_id, f"steerc intervention {name}")


def csv_bytes(rows: list[Row]) -> bytes:
    """lm-eval's CSV: its header, one row each, ``\\n`` line ends (the same rows give the same bytes)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow(["sae_lens", "clamp", r.release, r.hookpoint, r.index, repr(r.coefficient), "", r.sae_id,
                         r.description])
    return out.getvalue().encode("utf-8")


def check_lm_eval(result) -> None:
    """Add ``unsupported-by-target`` for what the capability table lets through but lm-eval's CSV cannot say."""
    check_by_lowering(result, rows_of, needs_checked=True)


__all__ = ["COLUMNS", "FILE", "Refused", "Row", "TARGET", "check_lm_eval", "coefficient", "csv_bytes",
           "hookpoint", "release_of", "rows_of"]
