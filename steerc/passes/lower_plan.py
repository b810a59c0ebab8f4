"""Lowering: a checked program and model facts to the unoptimised site plan.

Selectors are expanded to concrete layers and heads, sites canonicalised
(``resid_pre[l]`` for ``l >= 1`` becomes ``resid_post[l-1]``), per-layer
banks give each layer its row (by the layer the user wrote), and every
operation becomes one primitive kernel per concrete site, in source order.

Requires: a checked program without errors (layout included). Ensures: the
plan verifies (see :func:`steerc.passes.plan_pipeline.verify`).
"""

from __future__ import annotations

import functools

import numpy as np

from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.kernels.loreft import LoReFT
from steerc.ir.kernels.sae_clamp import SaeClamp
from steerc.ir.linalg import orthonormal_basis, plane
from steerc.ir.plan import Affine, Binding, Kernel, Param, Plan, ProbePlan, Project, Provenance, Rotate, Site, SitePlan
from steerc.ir.values import PerLayer, Vec
from steerc.passes.layers import expand

name = "lower-plan"


def canonical_site(kind: str, layer: int, head: int | None = None) -> Site:
    if kind == "resid_pre" and layer > 0:
        return Site("resid_post", layer - 1)
    return Site(kind, layer, head)


def _row(value, layer: int) -> np.ndarray:
    return value.rows[layer] if isinstance(value, PerLayer) else value


def lower_op(op: ck.Operation, layer: int):
    vecs = [_row(v, layer) for v in op.vectors]
    kind = op.kind
    if kind == "add":
        return Affine(1.0, Vec(vecs[0]), op.schedule)
    if kind == "scale":
        return Affine(Vec(vecs[0]) if vecs else float(op.scalar), None)
    if kind == "set":
        return Affine(0.0, Vec(vecs[0]))
    if kind == "suppress":
        return Affine(0.0, None)
    if kind == "ablate":
        return Project(tuple(Vec(q) for q in orthonormal_basis(vecs)), None)
    if kind == "clamp":
        u = vecs[0] / np.linalg.norm(vecs[0])
        return Project((Vec(u),), (float(op.scalar),))
    if kind == "rotate":
        e1, e2 = plane(vecs[0], vecs[1])
        return Rotate(Vec(e1), Vec(e2), float(op.scalar), op.mode)
    if kind == "loreft":
        return _loreft(op)
    if kind == "clamp_feature":
        return _sae_clamp(op)
    raise ValueError(f"unknown operation {kind}")


@functools.lru_cache(maxsize=1)
def _loreft(op: ck.Operation) -> LoReFT:
    """One LoReFT op for every site an intervention reaches (matrices have no per-layer banks; ``lower`` asks
    for an intervention's sites one after another): its R, W and b are made once."""
    r, w, b = op.tensors
    return LoReFT(tuple(Vec(row) for row in r), tuple(Vec(row) for row in w), Vec(b))


@functools.lru_cache(maxsize=1)
def _sae_clamp(op: ck.Operation) -> SaeClamp:
    """One SAE clamp op for every site an intervention reaches (an SAE has one d_in, no per-layer rows)."""
    enc, b_dec, (b_enc, threshold) = op.tensors
    about = _about(op.sae, op.feature)
    return SaeClamp(Vec(enc), float(b_enc), float(threshold), Vec(b_dec), Vec(op.vectors[0]), float(op.scalar),
                    op.mode, about=about)


def canonical_scope(scopes) -> tuple:
    if any(isinstance(s, ir.ScopeAll) for s in scopes):
        return (ir.ScopeAll(),)
    return tuple(dict.fromkeys(scopes))


def concrete_sites(pattern: ck.SitePattern, facts):
    layers = expand(pattern.layers, facts.layers).indices
    heads = expand(pattern.heads, facts.heads).indices if pattern.heads is not None else (None,)
    for layer in layers:
        for head in heads:
            yield layer, head


def lower(checked: ck.CheckedProgram, facts) -> Plan:
    kernels: dict[Site, list[Kernel]] = {}
    for iv in checked.interventions:
        prov = (Provenance(iv.name, iv.span, iv.op.text),)
        scope = canonical_scope(iv.scopes)
        for layer, head in concrete_sites(iv.site, facts):
            site = canonical_site(iv.site.kind, layer, head)
            kernel = Kernel(lower_op(iv.op, layer), scope, iv.gate, iv.preserve_norm, prov,
                            tuple(_binding(role, param, c, layer) for role, param, c in iv.bindings))
            kernels.setdefault(site, []).append(kernel)
    sites = tuple(SitePlan(s, tuple(k)) for s, k in sorted(kernels.items(), key=lambda kv: kv[0].order))
    probes = tuple(_probe(p, facts) for p in checked.probes.values())
    return Plan(
        source_name=checked.source_name,
        source_sha256=checked.source_sha256,
        facts_fingerprint=facts.fingerprint,
        family=facts.family,
        sites=sites,
        probes=probes,
        constraint=checked.constraint,
        params=tuple(Param(name, float(d), lo, hi) for name, (d, lo, hi, _span) in checked.request_params.items()),
    )


def _binding(role: str, param: str, coefficient, layer: int) -> Binding:
    """A kernel's binding at ``layer``: vectors take the layer's row, clamp targets and angles stay floats."""
    if role in ("bias", "scale") and not isinstance(coefficient, (int, float)):
        return Binding(role, param, Vec(_row(coefficient, layer)))
    return Binding(role, param, float(coefficient))


# Readouts that project onto the span of their vectors (an orthonormal basis Q [k, d], P = Qᵀ Q).
BASIS_READOUTS = ("projected_cosine", "subspace_cosine")
# Readouts whose vectors reach the runtimes as one [k, d] tensor (the others take one vector [d], or none).
STACKED_READOUTS = BASIS_READOUTS + ("sae_feature",)


def _probe(p: ck.Probe, facts) -> ProbePlan:
    (layer, head), = concrete_sites(p.site, facts)
    site = canonical_site(p.site.kind, layer, head)
    rows = [_row(v, layer) for v in p.readout.vectors]
    kind = p.readout.kind
    if kind in BASIS_READOUTS:
        vectors = tuple(Vec(q) for q in orthonormal_basis(rows))
    else:
        vectors = tuple(Vec(r) for r in rows)
    about = _about(p.readout.sae, p.readout.feature) if kind == "sae_feature" else ""
    return ProbePlan(p.name, site, kind, vectors, float(p.readout.bias), p.pool, float(p.readout.threshold),
                     about=about)


def _about(sae, feature: int) -> str:
    """Feature ``feature`` of ``sae`` in words, for explain: its index, the SAE's encoder, width, hook and
    Neuronpedia id."""
    return (f"{feature} of a {sae.architecture} SAE (d_sae {sae.d_sae:,}, hook {sae.hook_name}"
            + (f", neuronpedia {sae.neuronpedia_id}/{feature}" if sae.neuronpedia_id else "") + ")")


__all__ = ["canonical_scope", "canonical_site", "lower", "lower_op"]
