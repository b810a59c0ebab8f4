"""Property: whatever serve admission accepts, the worker builds, and it means what the compiler meant.

Random checked programs (``strategies_plan.plan_programs``, over a tiny llama layout) are compiled to
``steerc.serve/1`` documents and then mutated: left alone, values nudged within float32, random JSON
edits, and the tampering classes a compiler never produces (a site listed twice, a per-token probe moved
after the kernel it gates, a prompt-pooled gate widened to all tokens, an ablation basis or rotation
plane scaled by 10, a value past float32, ``resid_pre`` above layer 0), each rehashed and re-salted so
that only the plan's meaning is wrong. For every input:

* admission either admits it or raises ``RequestError`` (never another exception), and a tampering
  mutation is always refused;
* an admitted plan passes the compiler's verifier, the worker builds it (``RequestSteer``: the vllm
  buffers and site functions, on torch), and it re-encodes to the document admitted: the same meaning
  (a client may write 0 for 0.0), and the same text for the compiler's own plan, which it equals.
"""

from __future__ import annotations

import json
import random

import numpy as np
from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st
from strategies_plan import FACTS, plan_programs, relist

from steerc.serve_client import extra_args
from steerc.targets.serve.format import artifact_bytes, artifact_id, cache_salt, dumps, read_artifact, to_serve

REFUSE, ANY, ACCEPT = "refuse", "any", "accept"


def _kernels(doc):
    return [(i, j, k) for i, s in enumerate(doc["sites"]) for j, k in enumerate(s["kernels"])]


def _gate_probes(g) -> set:
    if g is None:
        return set()
    if "probe" in g:
        return {g["probe"]}
    if "not" in g:
        return _gate_probes(g["not"])
    return set().union(*(_gate_probes(p) for p in g.get("all", g.get("any", []))))


def _retensor(doc, arts, ref, fn):
    data = artifact_bytes(np.asarray(fn(read_artifact(arts[ref["artifact"]])), dtype=np.float32))
    ref["artifact"] = artifact_id(data)
    arts[ref["artifact"]] = data
    relist(doc, arts)


def _scalars(doc):
    """(container, key) of every user-changeable number of the plan: what becomes a float32 buffer."""
    out = []
    for _, _, k in _kernels(doc):
        op = k["op"]
        if op["kind"] == "affine" and "value" in op["scale"]:
            out.append((op["scale"], "value"))
        if op["kind"] == "rotate":
            out.append((op, "angle"))
        if op["kind"] == "project" and op["target"]:
            out.extend((op["target"], n) for n in range(len(op["target"])))
        stack = [k["gate"]] if k["gate"] else []
        while stack:
            g = stack.pop()
            if "probe" in g:
                out.append((g, "threshold"))
            elif "not" in g:
                stack.append(g["not"])
            else:
                stack.extend(g.get("all", g.get("any", [])))
    out.extend((p, "bias") for p in doc["probes"])
    return out


def m_none(doc, arts, rng):
    return ACCEPT


def m_duplicate_site(doc, arts, rng):
    if not doc["sites"]:  # a program of identity kernels only: no site to list twice
        return ANY
    i = rng.randrange(len(doc["sites"]))
    doc["sites"].insert(i + 1, json.loads(json.dumps(doc["sites"][i])))
    return REFUSE


def m_probe_later(doc, arts, rng):
    gated = any("tok" in _gate_probes(k["gate"]) for _, _, k in _kernels(doc))
    for p in doc["probes"]:
        if p["name"] == "tok":
            p["site"] = {"kind": "resid_post", "layer": 3, "head": None}  # after every site the programs steer
    return REFUSE if gated else ANY


def m_widen_pooled(doc, arts, rng):
    pooled = [k for _, _, k in _kernels(doc) if "pooled" in _gate_probes(k["gate"])]
    for k in pooled:
        k["scope"] = [{"kind": "all"}]
    return REFUSE if pooled else ANY


def m_scale_basis(doc, arts, rng):
    refs = [k["op"]["basis"] for _, _, k in _kernels(doc) if k["op"]["kind"] == "project"]
    refs += [k["op"][rng.choice(("e1", "e2"))] for _, _, k in _kernels(doc) if k["op"]["kind"] == "rotate"]
    if not refs:
        return ANY
    _retensor(doc, arts, rng.choice(refs), lambda q: 10 * q)
    return REFUSE


def m_past_float32(doc, arts, rng):
    places = _scalars(doc)
    if not places:
        return ANY
    box, key = rng.choice(places)
    box[key] = rng.choice((3.5e38, -3.5e38, 1e300))
    return REFUSE


def m_resid_pre(doc, arts, rng):
    entries = doc["sites"] + doc["probes"]
    if not entries:  # a program that folded to no site (`scale 1` with `preserve norm`): nothing to move
        return ANY
    entry = rng.choice(entries)
    entry["site"] = {"kind": "resid_pre", "layer": max(1, entry["site"]["layer"]), "head": None}
    return REFUSE


def m_nudge(doc, arts, rng):
    places = _scalars(doc)
    if places:
        box, key = rng.choice(places)
        box[key] = float(np.float32(box[key] * rng.choice((0.5, 2.0, -1.0)) + rng.choice((0.0, 0.25))))
    return ANY


def m_random_edit(doc, arts, rng):
    """Replace or delete one random leaf or key anywhere in the document."""
    paths = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                paths.append((o, k))
                walk(v, path + (k,))
        elif isinstance(o, list):
            for n, v in enumerate(o):
                paths.append((o, n))
                walk(v, path + (n,))

    walk({k: v for k, v in doc.items() if k not in ("cache_salt", "artifacts")}, ())
    box, key = rng.choice(paths)
    choice = rng.randrange(4)
    if choice == 0 and isinstance(box, dict):
        del box[key]
    else:
        box[key] = rng.choice((None, 0, -1, 2 ** 40, 0.5, "x", [], {}, True, 1e30, "resid_pre"))
    return ANY


def _meaning(doc):
    """The document as JSON means it: a number is a number (a client may write 0 for 0.0), a boolean is not
    a number; the cache salt, which hashes the text, is left out."""
    def norm(o):
        if isinstance(o, bool) or o is None or isinstance(o, str):
            return o
        if isinstance(o, (int, float)):
            return ("number", float(o))
        if isinstance(o, list):
            return [norm(v) for v in o]
        return {k: norm(v) for k, v in o.items()}

    return norm({k: v for k, v in doc.items() if k != "cache_salt"})


MUTATIONS = (m_none, m_duplicate_site, m_probe_later, m_widen_pooled, m_scale_basis, m_past_float32, m_resid_pre,
             m_nudge, m_random_edit)


@fuzz(60, "serve_admission")
@given(plan_programs(max_interventions=4), st.sampled_from(MUTATIONS), st.integers(0, 2 ** 32 - 1))
def test_whatever_admission_accepts_the_worker_builds_and_it_means_the_document(text, mutation, seed):
    import torch

    from steerc.api import check_source
    from steerc.passes.plan_pipeline import verify
    from steerc.runtime.vllm.serve import RequestSteer
    from steerc.targets.serve.admission import RequestError, admit

    result = check_source(text, facts=FACTS)
    assert result.ok, result.render()
    doc, arts = to_serve(result.plan, FACTS.to_json())
    expect = mutation(doc, arts, random.Random(seed))
    try:
        doc["cache_salt"] = cache_salt(doc)
    except (TypeError, ValueError):
        pass  # a random edit the salt cannot hash: admission must still answer with a RequestError
    try:
        admitted = admit(extra_args(doc, arts), FACTS, salt=doc.get("cache_salt"))
    except RequestError:
        assert expect != ACCEPT, f"{mutation.__name__}: the compiler's own plan was refused"
        RAN["serve_admission"] += 1
        return
    assert expect != REFUSE, f"{mutation.__name__} was admitted:\n{text}"
    verify(admitted.plan, FACTS)
    steer = RequestSteer(admitted.plan, FACTS, max_tokens=8, dtype=torch.float32, device="cpu", tp_rank=0,
                          tp_size=1)
    assert steer.fns or not admitted.plan.sites
    again, again_arts = to_serve(admitted.plan, FACTS.to_json())
    assert _meaning(again) == _meaning(doc), f"{mutation.__name__}: the admitted plan is not the document"
    if mutation is m_none:
        assert dumps(again) == dumps(doc)
    assert again_arts == {k: arts[k] for k in doc["artifacts"]}
    if mutation is m_none:
        assert admitted.plan == result.plan
    RAN["serve_admission"] += 1
