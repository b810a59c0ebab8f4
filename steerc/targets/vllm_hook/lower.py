"""IBM vLLM-Hook's declarative intervention spec ("G3") from a site plan: the lowering and its checks.

vLLM-Hook (https://github.com/IBM/vLLM-Hook, package
``vllm_hook_plugins/vllm_hook_plugins/core``, read at commits
``15a7c602b3bdf54aa5bd7cf93ac11df815591683`` and
``e8f81462a6034a80164f87a9dc78c1ab07a491d4``) takes, per request, an
``intervention_spec`` ``{"ops": [...]}`` in ``SamplingParams.extra_args``
(a JSON string in ``vllm_xargs`` over ``vllm serve``), whose tensors travel
as content-addressed safetensors artifacts, and a ``cache_salt`` derived
from both. The schema is ``spec/vllm_hook.schema.json``.

What maps, exactly (anything else is an ``unsupported-by-target`` error at
the intervention that uses it, never a silent drop or an approximation):

=================================  ==============================================
steerc plan                        vLLM-Hook G3
=================================  ==============================================
site ``resid_post[l]``             ``"layers": [l]`` (layer l's output, 0-based)
site ``head[l, h]``                ``head_additive`` at layer l, row h of the vector
``add v`` (affine, scale 1)        ``additive``, strength 1.0, tensor ``vector``
``ablate`` (projection, k rows)    k ``projection`` ops, one per orthonormal row
``rotate ... to θ`` / ``by θ``     ``rotation``, mode ``target`` / ``offset``
scope ``all``                      ``{"kind": "all"}``
scope ``generated``                ``{"kind": "after_prompt"}``
scope ``prompt[-k:], generated``   ``{"kind": "last_k", "k": k}``
gate ``p >= t`` / ``p <= t``       ``per_key_threshold`` ``ge`` / ``le``, aggregate any
probe at ``resid_post[l]``         condition layer l+1 (its layer input)
probe at ``resid_pre[0]``          condition layer 0 (the embeddings)
pool ``prompt.mean`` / ``.last``   pooling ``mean`` / ``last``
readout ``dot(w) + b``             readout ``affine`` (``weights`` [1, d]), threshold t - b
readout ``cosine(v)``              readout ``cosine`` (``directions`` [1, d] = v/|v|)
readout ``projected_cosine(v)``    readout ``projected_cosine`` (``directions`` [1, d] = v/|v|)
=================================  ==============================================

Every op is ``{"layers": [l], "transform": {..., "modifiers": []}, "scope":
{...}, "gate": <gate> | null}`` (``modifiers`` and ``gate`` always written,
floats always with a decimal point, as aisteer360 writes them: the spec is
hashed as raw JSON). One op per (kernel, layer) — per direction for an
``ablate`` — in plan order (sites in forward order, kernels in order).

A gate's probe at ``resid_post[l]`` reads that site before its kernels;
vLLM-Hook reads condition layer l+1's input, after layer l's ops. So a gate
is refused when a kernel at its probe's site touches prompt positions (the
only positions its evidence comes from).

A runtime caveat the spec cannot carry: vLLM-Hook pools gate evidence over
the prompt positions the engine *computes*; with prefix caching on, prompt
positions served from the cache are missing from a ``mean`` pool (the salt
below separates specs, not requests of one spec). For exact
``prompt.mean`` gates, run with prefix caching off.
"""

from __future__ import annotations

import math

import numpy as np

from steerc.diagnostics import Diagnostic, Note
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import checked as ck
from steerc.ir.plan import Affine, Kernel, Plan, Project, Rotate, Site
from steerc.targets.hooks import scope_item
from steerc.targets.vllm_hook.format import MAX_SPEC_BYTES, NAME, artifact_bytes, canonical_bytes, registry_id

__all__ = ["VllmHookError", "check_vllm_hook", "compact_sites", "lower_vllm_hook"]

_SERVE = "compile with --target serve (steerc's own format), which carries it"


class VllmHookError(ValueError):
    """The plan has constructs the vLLM-Hook spec cannot express; ``.diagnostics`` says which."""

    def __init__(self, diagnostics):
        self.diagnostics = list(diagnostics)
        super().__init__("; ".join(d.message for d in self.diagnostics) or "cannot lower to vllm-hook")


class _Refused(Exception):
    """Something vLLM-Hook cannot express; ``.all`` lists every such thing found together."""

    def __init__(self, what: str, why: str, help: str, notes: tuple = ()):
        super().__init__(what)
        self.what, self.why, self.help, self.notes = what, why, help, notes
        self.all = (self,)

    @classmethod
    def many(cls, problems) -> _Refused:
        first = problems[0]
        first.all = tuple(problems)
        return first


def _f(x) -> float:
    """A JSON float (always written with a decimal point or exponent)."""
    return float(x)


class _Lowering:
    def __init__(self, plan: Plan, facts):
        self.plan = plan
        self.facts = facts
        self.artifacts: dict[str, bytes] = {}
        self.diagnostics: list[Diagnostic] = []
        self._refusals: dict = {}

    # -- diagnostics

    def refuse(self, what: str, why: str, help: str, span, notes: tuple = (), site: Site | None = None,
               names: tuple = ()) -> None:
        """One error per (construct, reason, intervention); the sites it occurs at are listed together."""
        key = (what, why, help, span, names)
        entry = self._refusals.setdefault(key, ([], notes))
        if site is not None and site.text not in entry[0]:
            entry[0].append(site.text)

    def finish_diagnostics(self) -> None:
        for (what, why, help, span, names), (sites, notes) in self._refusals.items():
            where = f" at {', '.join(compact_sites(sites))}" if sites else ""
            if names:
                where += f" (intervention {', '.join(f'`{n}`' for n in names)})"
            self.diagnostics.append(Diagnostic.error(
                UNSUPPORTED_BY_TARGET, f"the {NAME} target cannot express {what}{where}: {why}", span,
                help=help, notes=notes))
        self._refusals.clear()
        self.diagnostics.sort(key=Diagnostic.sort_key)

    def put(self, tensors: dict) -> str:
        data = artifact_bytes(tensors)
        aid = registry_id(data)
        self.artifacts[aid] = data
        return aid

    # -- sites

    def site_layer(self, site: Site) -> int:
        if site.kind in ("resid_post", "head"):
            return site.layer
        if site.kind == "resid_pre":
            raise _Refused(
                "the embeddings",
                "vLLM-Hook edits the residual stream at decoder-layer outputs (and per-head inputs of o_proj); "
                "the embeddings entering layer 0 have no such hook",
                "steer resid_post[0] (= resid_pre[1]) or a later layer, or " + _SERVE)
        raise _Refused(
            f"the site kind `{site.kind}`",
            "vLLM-Hook hooks decoder-layer boundaries and o_proj's per-head input only; it has no hook on "
            "what the attention or MLP block adds to the residual stream",
            "steer the residual stream (resid_post[l]) instead, or " + _SERVE)

    # -- transforms: a list of (transform without artifact, tensors)

    def transforms(self, kernel: Kernel, site: Site) -> list[tuple[dict, dict]]:
        op = kernel.op
        text = _op_text(kernel)
        if site.kind == "head":
            if not (isinstance(op, Affine) and isinstance(op.scale, float) and op.scale == 1.0):
                raise _Refused(
                    text,
                    "vLLM-Hook's only head transform is `head_additive` (add a vector to a head's output)",
                    "use `add` at head sites, or " + _SERVE)
            vector = np.zeros((self.facts.heads, self.facts.head_dim), dtype=np.float32)
            if op.bias is not None:
                vector[site.head] = op.bias.array
            return [({"kind": "head_additive", "strength": 1.0}, {"vector": vector})]
        width = self.facts.hidden
        if isinstance(op, Affine) and op.schedule:
            raise _Refused(text, "vLLM-Hook's strengths are constant: no transform varies with the generation step",
                           "drop the schedule, or " + _SERVE)
        if isinstance(op, Affine):
            if isinstance(op.scale, float) and op.scale == 1.0:
                bias = op.bias.array if op.bias is not None else np.zeros(width, dtype=np.float32)
                return [({"kind": "additive", "strength": 1.0}, {"vector": bias})]
            raise _Refused(
                text, _affine_reason(op),
                "steer with `add`, `ablate` or `rotate`, or " + _SERVE)
        if isinstance(op, Project):
            if op.target is not None:
                raise _Refused(
                    text,
                    "vLLM-Hook's `projection` removes a component; it cannot pin it to a value",
                    "use the steerc serve format (--target serve), which carries clamps")
            # The rows are orthonormal, so h - Q Q^T h is exactly the composition
            # of the rank-one projections h - (h.q) q, in any order.
            return [({"kind": "projection"}, {"vector": q.array}) for q in op.basis]
        if isinstance(op, Rotate):
            # vLLM-Hook's rotation (core/interpreter/transforms.py, notes 5.3):
            #   b1 = basis[0] / (|basis[0]| + 1e-8); b2 = basis[1] - (basis[1].b1) b1; b2 /= |b2| + 1e-8
            #   c1 = h.b1, c2 = h.b2
            #   target: delta = angle - atan2(c2, c1); offset: delta = angle
            #   c1' = cos(delta) c1 - sin(delta) c2, c2' = sin(delta) c1 + cos(delta) c2
            #   h' = h + (c1' - c1) b1 + (c2' - c2) b2
            # With basis = [e1, e2] (already orthonormal), b1 = e1 and b2 = e2 up to the
            # 1e-8 in the norms, which rounds away in float32 and lower (1 + 1e-8 == 1).
            # target: with (c1, c2) = rho (cos phi, sin phi), rotating by angle - phi gives
            # rho (cos angle, sin angle) — steerc's `to` (a' = rho cos θ, b' = rho sin θ); at
            # rho = 0 atan2(0, 0) = 0 and the row stays put, as in steerc. offset is steerc's
            # `by` term for term. Angles are radians on both sides.
            basis = np.stack([op.e1.array, op.e2.array])
            mode = {"to": "target", "by": "offset"}[op.mode]
            return [({"kind": "rotation", "angle": _f(op.angle), "mode": mode}, {"basis": basis})]
        raise _Refused(text, "it is not a kernel steerc knows", "report this as a steerc bug")

    # -- scopes

    def scope(self, kernel: Kernel) -> dict:
        items = set()
        for s in kernel.scope:
            item = scope_item(s)
            if item[0] == "generated" and item[1] == 0:  # generated[0:] is generated
                item = ("generated", None, item[2])
            items.add(item)
        if items == {("all",)}:
            return {"kind": "all"}
        if items == {("generated", None, None)}:
            return {"kind": "after_prompt"}
        if len(items) == 2 and ("generated", None, None) in items:
            (other,) = items - {("generated", None, None)}
            # prompt[-k:] (prompt[-1] is prompt[-1:]) plus every generated position is
            # vLLM-Hook's last_k: positions >= prompt_len - k (clipped at 0 on both sides).
            if other[0] == "prompt" and isinstance(other[1], int) and other[1] < 0 and other[2] is None:
                return {"kind": "last_k", "k": int(-other[1])}
        from steerc.frontend.fmt import scope as scope_text

        text = ", ".join(scope_text(s) for s in kernel.scope)
        raise _Refused(
            f"the token scope `{text}`",
            "vLLM-Hook's scopes are `all`, `after_prompt` (= `generated`), `last_k` (= `prompt[-k:], "
            "generated`) and `from_position` (every absolute position from p on)",
            "use `tokens all`, `tokens generated` or `tokens prompt[-k:], generated`, or " + _SERVE)

    # -- gates

    def gate(self, kernel: Kernel) -> dict | None:
        g = kernel.gate
        if g is None:
            return None
        if not isinstance(g, ck.GateCompare):
            raise _Refused(
                "a compound gate (`and` / `or` / `not`)",
                "a vLLM-Hook gate compares one pooled readout with one threshold; its rules combine "
                "condition layers, not comparisons",
                "gate on a single comparison, or " + _SERVE)
        notes = (Note("the comparison is here", g.span),) if g.span is not None else ()
        problems: list[_Refused] = []
        comparator = {">=": "ge", "<=": "le"}.get(g.op)
        if comparator is None:
            problems.append(_Refused(
                f"the strict comparison `{g.probe} {g.op} {g.threshold!r}`",
                "vLLM-Hook's threshold rules are inclusive (`ge` / `le`), so a value equal to the threshold "
                "would open the gate",
                "use >= or <=", notes))
        probe = self.plan.probe(g.probe)
        pooling = {"prompt.mean": "mean", "prompt.last": "last"}.get(probe.pool)
        if pooling is None:
            problems.append(_Refused(
                f"the `{probe.pool}` pool of probe `{probe.name}`",
                "vLLM-Hook gates decide once per request from readings pooled over the prompt",
                "pool the probe with prompt.mean or prompt.last, or " + _SERVE, notes))
        try:
            condition_layer = self._condition_layer(probe, notes)
        except _Refused as r:
            problems.append(r)
        readout = tensors = threshold = None
        if probe.kind == "dot":
            (w,) = probe.vectors
            readout, tensors = "affine", {"weights": w.array[None, :]}
            # w.h + b OP t  <=>  w.h OP t - b (vLLM-Hook's affine readout has no bias).
            threshold = float(g.threshold) - float(probe.bias)
        elif probe.kind == "cosine":
            (v,) = probe.vectors
            direction = v.array.astype(np.float64)
            direction = direction / np.linalg.norm(direction)
            readout, tensors = "cosine", {"directions": direction[None, :]}
            threshold = float(g.threshold)
            # vLLM-Hook's cosine is (p.d) / (|p| |d| + 1e-8); steerc's is (p.d) / (|p| |d|)
            # (0 when p = 0, as 0 / 1e-8 is). With |d| = 1 the two differ by at most
            # 1e-8 / |p| relative — below float32 resolution (the readout runs in float32)
            # for any pooled hidden state with |p| >= 1, i.e. a floating-point-level
            # difference, not a different function. Accepted.
        elif probe.kind == "projected_cosine":
            if len(probe.vectors) != 1:
                problems.append(_Refused(
                    f"the `projected_cosine` readout of probe `{probe.name}` over {len(probe.vectors)} directions",
                    "vLLM-Hook's projected_cosine projects onto one direction (a rank-one projector)",
                    "read projected_cosine(v) of one direction, or " + _SERVE, notes))
            else:
                (q,) = probe.vectors  # the plan's orthonormal basis: one unit row
                direction = q.array.astype(np.float64)
                readout, tensors = "projected_cosine", {"directions": direction[None, :]}
                threshold = float(g.threshold)
                # vLLM-Hook: P = d dᵀ / (d·d + 1e-8), value (p·tanh(pP)) / (|p| |tanh(pP)| + 1e-8);
                # steerc (CAST): P = d dᵀ with |d| = 1, value p·tanh(Pp) / (|p| |tanh(Pp)|). P is
                # symmetric, so pP = Pp; the epsilons change the value by about 1e-8 relative,
                # below float32 resolution: the same function, as for `cosine` above.
        else:
            problems.append(_Refused(
                f"the `{probe.kind}` readout of probe `{probe.name}`",
                "vLLM-Hook's readouts are affine (a dot product), cosine and projected_cosine (CAST's)",
                "read dot(...), cosine(...) or projected_cosine(v) instead, or " + _SERVE, notes))
        if threshold is not None and not math.isfinite(threshold):
            problems.append(_Refused(
                f"the gate threshold of probe `{probe.name}`", "threshold minus offset overflows a float",
                "use a smaller threshold or offset", notes))
        if problems:
            raise _Refused.many(problems)
        return {
            "layers": [condition_layer],
            "pooling": pooling,
            "readout": {"kind": readout, "artifact": self.put(tensors)},
            "rule": {"kind": "per_key_threshold", "threshold": _f(threshold), "comparator": comparator,
                     "aggregate": "any"},
        }

    def _condition_layer(self, probe, notes: tuple) -> int:
        site = probe.site
        if site.kind == "resid_pre":  # only resid_pre[0] survives canonicalisation
            return 0
        if site.kind != "resid_post":
            raise _Refused(
                f"a gate on probe `{probe.name}` (read at {site.text})",
                "vLLM-Hook reads gate evidence only at decoder-layer inputs (the residual stream)",
                "probe the residual stream (resid_pre / resid_post), or " + _SERVE, notes)
        if site.layer + 1 >= self.facts.layers:
            raise _Refused(
                f"a gate on probe `{probe.name}` (read at {site.text})",
                "vLLM-Hook reads gate evidence at a decoder layer's input, and no layer follows the last one",
                "probe an earlier layer, or " + _SERVE, notes)
        # steerc's probe reads resid_post[l] before the kernels at that site; vLLM-Hook
        # reads layer l+1's input, after layer l's ops. The two agree only when no
        # kernel there touches a prompt position (generated rows are never evidence:
        # the gate freezes before the first generated row reaches the condition layer).
        sp = self.plan.site(site)
        for other in sp.kernels if sp is not None else ():
            if all(scope_item(s)[0] == "generated" for s in other.scope):
                continue
            names = ", ".join(f"`{n}`" for n in other.names) or "another intervention"
            span = other.provenance[0].span if other.provenance else None
            raise _Refused(
                f"a gate on probe `{probe.name}` (read at {site.text})",
                f"{names} also steers prompt positions at {site.text}; steerc's probe reads that site before "
                f"it, but vLLM-Hook's gate reads layer {site.layer + 1}'s input, after it",
                f"move the probe to an earlier site, or restrict {names} to `tokens generated`",
                notes + ((Note(f"{names} is here", span),) if span is not None else ()))
        return site.layer + 1

    # -- the whole plan

    def lower(self) -> dict | None:
        plan = self.plan
        if plan.constraint is not None:
            self.refuse(
                f"the `{plan.constraint.kind}` output constraint",
                "a vLLM-Hook intervention spec carries interventions only",
                "send the constraint with vLLM's structured-outputs request fields yourself, or " + _SERVE,
                plan.constraint.span)
        ops: list[dict] = []
        owners: list[Kernel] = []
        for sp in plan.sites:
            for kernel in sp.kernels:
                span = kernel.provenance[0].span if kernel.provenance else None
                parts = {}
                for part, fn in (("layer", self.site_layer),
                                 ("transforms", lambda site, k=kernel: self.transforms(k, site)),
                                 ("scope", lambda site, k=kernel: self.scope(k)),
                                 ("gate", lambda site, k=kernel: self.gate(k))):
                    try:
                        parts[part] = fn(sp.site)
                    except _Refused as refused:
                        for r in refused.all:
                            self.refuse(r.what, r.why, r.help, span, r.notes, sp.site, kernel.names)
                if kernel.preserve_norm:
                    drop = "drop `preserve norm`: a rotation keeps the norm anyway" if isinstance(kernel.op, Rotate) \
                        else "drop `preserve norm` (the steered rows are then not rescaled), or " + _SERVE
                    self.refuse(
                        "`preserve norm`",
                        "vLLM-Hook's norm_preserving modifier only scales back rows whose norm grew; steerc "
                        "rescales every selected row to its input norm",
                        drop, span, (), sp.site, kernel.names)
                    continue
                if len(parts) < 4:
                    continue
                for transform, tensors in parts["transforms"]:
                    ops.append({
                        "layers": [int(parts["layer"])],
                        "transform": {**transform, "artifact": self.put(tensors), "modifiers": []},
                        "scope": parts["scope"],
                        "gate": parts["gate"],
                    })
                    owners.append(kernel)
        if self._refusals:
            return None
        spec = {"ops": ops}
        size = len(canonical_bytes(spec))
        if size > MAX_SPEC_BYTES:
            counts: dict = {}
            for k in owners:
                key = (k.names, k.provenance[0].span if k.provenance else None)
                counts[key] = counts.get(key, 0) + 1
            (names, span), n = max(counts.items(), key=lambda kv: kv[1])
            self.refuse(
                "this program in one request",
                f"its intervention_spec is {size} bytes of canonical JSON, over vLLM-Hook's limit of "
                f"{MAX_SPEC_BYTES} (E_SPEC_TOO_LARGE); it has {len(ops)} ops (one per kernel, layer and "
                f"direction), {n} of them from {', '.join(f'`{x}`' for x in names) or 'one intervention'}",
                "steer fewer layers or directions per request, or " + _SERVE, span)
            return None
        return spec


def _op_text(kernel: Kernel) -> str:
    notes = [p.note for p in kernel.provenance if p.note]
    if notes:
        return " then ".join(f"`{n}`" for n in dict.fromkeys(notes))
    return f"a {type(kernel.op).__name__.lower()} kernel"


def _affine_reason(op: Affine) -> str:
    if isinstance(op.scale, float) and op.scale == 0.0:
        return "no vLLM-Hook transform replaces the stream (`additive` adds, `projection` removes one direction)"
    return ("vLLM-Hook's transforms add, project out or rotate; none multiplies the stream "
            "(only an affine with scale exactly 1 is an `additive`)")


def lower_vllm_hook(plan: Plan, facts) -> tuple[dict | None, dict[str, bytes], list[Diagnostic]]:
    """(intervention_spec ``{"ops": [...]}``, {registry id ``sha256:<hex>``: canonical safetensors bytes},
    diagnostics). With any error the spec is None and the artifacts are empty."""
    lowering = _Lowering(plan, facts)
    spec = lowering.lower()
    lowering.finish_diagnostics()
    if spec is None:
        return None, {}, lowering.diagnostics
    return spec, dict(sorted(lowering.artifacts.items())), lowering.diagnostics


def check_vllm_hook(result) -> None:
    """Add the lowering's ``unsupported-by-target`` errors to a CheckResult (like ``check_target``),
    so a driver can report them before emitting; no-op without a plan.

    A construct the capability check (``check_target(result, "vllm-hook")``)
    already reported at its own line is not reported again for the
    intervention that holds it."""
    if getattr(result, "plan", None) is None or result.facts is None:
        return
    _, _, diagnostics = lower_vllm_hook(result.plan, result.facts)
    known = {(d.code, d.message, d.span) for d in result.diagnostics}
    reported = [d.span for d in result.diagnostics if d.code == UNSUPPORTED_BY_TARGET and d.span is not None]
    result.diagnostics.extend(d for d in diagnostics if (d.code, d.message, d.span) not in known
                              and not any(_within(inner, d.span) for inner in reported))


def _within(inner, outer) -> bool:
    """Whether span ``inner`` lies inside span ``outer`` (same file)."""
    if outer is None or inner.file != outer.file or inner.start < 0 or outer.start < 0:
        return False
    return outer.start <= inner.start and inner.end <= outer.end


def compact_sites(texts) -> list[str]:
    """Site names with runs of consecutive layers written as one slice.

    >>> compact_sites(["attn_out[0]", "attn_out[1]", "attn_out[2]", "resid_post[5]", "head[1, 2]"])
    ['attn_out[0:3]', 'resid_post[5]', 'head[1, 2]']
    """
    import re

    out: list[str] = []
    run: list = []  # [kind, first, last]

    def flush():
        if run:
            kind, first, last = run
            out.extend([f"{kind}[{first}:{last + 1}]"] if last - first >= 2 else
                       [f"{kind}[{i}]" for i in range(first, last + 1)])
            run.clear()

    for text in texts:
        m = re.fullmatch(r"(\w+)\[(\d+)\]", text)
        if m and run and run[0] == m.group(1) and int(m.group(2)) == run[2] + 1:
            run[2] += 1
            continue
        flush()
        if m:
            run.extend([m.group(1), int(m.group(2)), int(m.group(2))])
        else:
            out.append(text)
    flush()
    return out
