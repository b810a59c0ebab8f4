"""Random checked programs for the plan passes, and the numbers they must agree on.

:func:`plan_programs` draws program *text* over a tiny llama layout
(:data:`FACTS`: 4 layers, hidden 8, 2 heads of 4): one to eight
interventions, each with a random operation, site, scope, gate and
sometimes ``preserve norm``. Most interventions share one of a few
(site, scope, gate) contexts, and some come as motifs built to make the
optimiser act: repeated adds, scale-then-add, orthogonal ablations of unit
basis vectors, nested spans (``ablate u`` then ``ablate u, v``), an add
overwritten by a later ``set`` (dead), and no-ops (``scale 1``, a zero add,
``rotate ... by 0deg``).

Numbers are dyadic (``0.25``, ``-1.5``, ``2``) so that fused affine
parameters are exact in float32; what remains between the optimised and the
unoptimised plan is float64 rounding order and the optimiser's own 1e-6
tolerance on unit vectors (see :func:`assert_same_semantics`).

:func:`run_plan` runs a plan's kernels with :mod:`steerc.ir.interpret`, with
masks computed from the kernels' scopes (LANGUAGE.md section 5, written out
again here) and random gate decisions per probe comparison: per position for
a per-token probe, one per sequence for a prompt-pooled one.

>>> from hypothesis import given, settings
>>> @settings(max_examples=3, deadline=None)
... @given(plan_programs())
... def check(text):
...     assert text.startswith("steer 1")
>>> check()
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from steerc.facts import facts_from_config
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.interpret import run_kernels

FACTS = facts_from_config({
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 8, "num_attention_heads": 2,
    "num_key_value_heads": 2, "intermediate_size": 16, "vocab_size": 32,
}, origin="strategies_plan")
WIDTH, HEAD_DIM = FACTS.hidden, FACTS.head_dim

# resid_pre[2] and resid_post[1] are one canonical site: both appear on purpose.
SITES = ("resid_pre[1]", "resid_post[1]", "resid_pre[2]", "attn_out[1]", "mlp_out[2]", "head[1, 0]", "head[2, 1]")
SCOPES = ("all", "prompt", "generated", "prompt[-2:]", "[0, 2]", "prompt[-1:], generated")
# Both probes read resid_pre[1], at or before every site above (causality);
# a prompt-pooled gate may only steer generated positions.
GATES = (None, "tok > 0.1", "pooled < 1.5")
PROBES = """
probe tok {
  at   resid_pre[1]
  read dot([1, 0, 0.5, 0, 0, 0, 0, -1]) + 0.1
  pool token
}

probe pooled {
  at   resid_pre[1]
  read norm
  pool prompt.mean
}
"""

NUMBERS = (-2, -1.5, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2)
SCALES = (-1, 0, 0.5, 1, 1.5, 2)
ANGLES = ("0deg", "30deg", "90deg", "-45deg", "180deg")
TARGETS = (-1.5, 0, 2)


def width_of(site: str) -> int:
    return HEAD_DIM if site.startswith("head") else WIDTH


def fmt(values) -> str:
    return "[" + ", ".join(f"{float(x):g}" for x in values) + "]"


def unit(i: int, width: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(width)]


def vectors(width: int, nonzero: bool = False):
    vs = st.lists(st.sampled_from(NUMBERS), min_size=width, max_size=width)
    return vs.filter(any) if nonzero else vs


def _independent(a, b) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    cos = abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
    return cos < 0.99


@st.composite
def contexts(draw):
    """(site, scope, gate): where, on which positions and when an intervention acts."""
    site = draw(st.sampled_from(SITES))
    gate = draw(st.sampled_from(GATES))
    scope = "generated" if gate == "pooled < 1.5" else draw(st.sampled_from(SCOPES))
    return site, scope, gate


@st.composite
def operations(draw, width: int) -> str:
    kind = draw(st.sampled_from(("add", "scale", "scale-vector", "set", "suppress", "ablate", "clamp", "rotate")))
    if kind == "add":
        return f"add {fmt(draw(vectors(width)))}"
    if kind == "scale":
        return f"scale {draw(st.sampled_from(SCALES)):g}"
    if kind == "scale-vector":
        return f"scale {fmt(draw(st.lists(st.sampled_from(SCALES), min_size=width, max_size=width)))}"
    if kind == "set":
        return f"set {fmt(draw(vectors(width, nonzero=True)))}"
    if kind == "suppress":
        return "suppress"
    if kind == "ablate":
        dirs = draw(st.lists(vectors(width, nonzero=True), min_size=1, max_size=3))
        return "ablate " + ", ".join(fmt(d) for d in dirs)
    if kind == "clamp":
        return f"clamp {fmt(draw(vectors(width, nonzero=True)))} to {draw(st.sampled_from(TARGETS)):g}"
    a = draw(vectors(width, nonzero=True))
    b = draw(vectors(width, nonzero=True).filter(lambda b: _independent(a, b)))
    mode = draw(st.sampled_from(("to", "by")))
    return f"rotate in ({fmt(a)}, {fmt(b)}) {mode} {draw(st.sampled_from(ANGLES))}"


@st.composite
def motifs(draw, ctx) -> list[str]:
    """Operations at one context that the optimiser should fold."""
    width = width_of(ctx[0])
    kind = draw(st.sampled_from(("adds", "scale-add", "orthogonal", "nested", "dead", "noop")))
    if kind == "adds":
        return [f"add {fmt(draw(vectors(width)))}" for _ in range(draw(st.integers(2, 3)))]
    if kind == "scale-add":
        return [f"scale {draw(st.sampled_from(SCALES)):g}", f"add {fmt(draw(vectors(width)))}"]
    if kind == "orthogonal":
        axes = draw(st.lists(st.integers(0, width - 1), min_size=2, max_size=3, unique=True))
        ops = [f"ablate {fmt(unit(axes[0], width))}", f"ablate {fmt(unit(axes[1], width))}"]
        if len(axes) == 3:
            ops.append(f"clamp {fmt(unit(axes[2], width))} to {draw(st.sampled_from(TARGETS)):g}")
        return ops
    if kind == "nested":
        u = draw(vectors(width, nonzero=True))
        v = draw(vectors(width, nonzero=True).filter(lambda v: _independent(u, v)))
        return [f"ablate {fmt(u)}", f"ablate {fmt(u)}, {fmt(v)}"]
    if kind == "dead":
        return [f"add {fmt(draw(vectors(width)))}", f"set {fmt(draw(vectors(width, nonzero=True)))}"]
    a, b = unit(0, width), unit(1, width)
    return [draw(st.sampled_from(("scale 1", f"add {fmt([0] * width)}", f"rotate in ({fmt(a)}, {fmt(b)}) by 0deg")))]


def intervention_text(name: str, site: str, op: str, scope: str, gate: str | None, preserve: bool) -> str:
    lines = [f"intervention {name} {{", f"  at     {site}", f"  {op}", f"  tokens {scope}"]
    if gate:
        lines.append(f"  when   {gate}")
    if preserve:
        lines.append("  preserve norm")
    return "\n".join(lines) + "\n}\n"


@st.composite
def plan_programs(draw, max_interventions: int = 8) -> str:
    """The text of a random program that checks clean against :data:`FACTS`."""
    pool = draw(st.lists(contexts(), min_size=1, max_size=3))
    items: list[tuple[tuple, str, bool]] = []
    wanted = draw(st.integers(1, max_interventions))
    while len(items) < wanted:
        ctx = draw(st.sampled_from(pool)) if draw(st.booleans()) or len(pool) == 1 else draw(contexts())
        if draw(st.integers(0, 2)) == 0:
            ops = draw(motifs(ctx))
        else:
            ops = [draw(operations(width_of(ctx[0])))]
        for op in ops:
            items.append((ctx, op, draw(st.integers(0, 5)) == 0))
    items = items[:max_interventions]
    body = [intervention_text(f"i{n}", ctx[0], op, ctx[1], ctx[2], preserve)
            for n, (ctx, op, preserve) in enumerate(items)]
    uses = {g for (_, _, g), _, _ in items}
    probes = PROBES if uses - {None} else ""
    return "steer 1\n" + probes + "\n" + "\n".join(body)


# ------------------------------------------------------------------ masks


def scope_mask(scopes, n_positions: int, prompt_len: int) -> np.ndarray:
    """Which of positions 0..n-1 a (canonical) scope tuple selects; 0..P-1 is the prompt."""
    pos = np.arange(n_positions)
    prompt, generated = pos[:prompt_len], pos[prompt_len:]
    mask = np.zeros(n_positions, dtype=bool)
    for s in scopes:
        if isinstance(s, ir.ScopeAll):
            mask[:] = True
        elif isinstance(s, (ir.ScopePrompt, ir.ScopeGenerated)):
            part = prompt if isinstance(s, ir.ScopePrompt) else generated
            if s.sel is None:
                mask[part] = True
            elif isinstance(s.sel, ir.PosIndex):
                if -len(part) <= s.sel.index < len(part):
                    mask[part[s.sel.index]] = True
            else:
                mask[part[slice(s.sel.start, s.sel.stop)]] = True
        elif isinstance(s, ir.ScopePositions):
            mask[[p for p in s.positions if p < n_positions]] = True
        else:
            raise TypeError(f"no position model for {s!r}")
    return mask


class Masks:
    """Masks per kernel: scope positions AND gate decisions, the same for every plan of a program."""

    def __init__(self, rng: np.random.Generator, n_positions: int, prompt_len: int):
        self.rng, self.n, self.p = rng, n_positions, prompt_len
        self._leaf: dict[ck.GateCompare, np.ndarray] = {}

    def gate(self, g) -> np.ndarray:
        if g is None:
            return np.ones(self.n, dtype=bool)
        if isinstance(g, ck.GateCompare):
            if g not in self._leaf:
                if g.probe == "pooled":  # decided once per sequence
                    self._leaf[g] = np.full(self.n, bool(self.rng.random() < 0.5))
                else:  # per position
                    self._leaf[g] = self.rng.random(self.n) < 0.5
            return self._leaf[g]
        if isinstance(g, ck.GateNegate):
            return ~self.gate(g.operand)
        parts = [self.gate(p) for p in g.parts]
        return np.logical_and.reduce(parts) if isinstance(g, ck.GateAll) else np.logical_or.reduce(parts)

    def __call__(self, kernel) -> np.ndarray:
        return scope_mask(kernel.scope, self.n, self.p) & self.gate(kernel.gate)


def run_plan(plan, inputs: dict, masks: Masks) -> dict:
    """Each site's value after the plan's kernels; sites the plan lacks stay as they are."""
    out = {}
    for site, h in inputs.items():
        sp = plan.site(site)
        out[site] = run_kernels(sp.kernels if sp is not None else (), h.copy(), masks)
    return out


RTOL = 1e-5
ATOL = 1e-5  # times the magnitude of the values at the site (at least 1)


def assert_same_semantics(reference, optimised, seed: int = 0, n_positions: int = 7, prompt_len: int | None = None):
    """The optimised plan computes what the reference plan computes, at every site.

    Tolerance: relative 1e-5, and absolute 1e-5 times the largest magnitude
    at the site. Parameters are stored in float32; fuse-projections merges
    bases that are orthogonal (or nested) within 1e-6 on unit vectors, and
    fuse-affine re-stores fused parameters in float32 (exactly, for the
    dyadic numbers drawn here). So a legitimate difference is at most about
    1e-6 of the values involved; 1e-5 leaves ten times that, while any real
    change of meaning is of the order of the values themselves.
    """
    rng = np.random.default_rng(seed)
    if prompt_len is None:
        prompt_len = int(rng.integers(1, n_positions + 1))
    sites = [sp.site for sp in reference.sites]
    assert {sp.site for sp in optimised.sites} <= set(sites), "the optimiser invented a site"
    inputs = {s: rng.normal(0.0, 2.0, (n_positions, FACTS.width(s.kind))) for s in sites}
    masks = Masks(rng, n_positions, prompt_len)
    want = run_plan(reference, inputs, masks)
    got = run_plan(optimised, inputs, masks)
    for s in sites:
        scale = max(1.0, float(np.abs(want[s]).max()), float(np.abs(inputs[s]).max()))
        np.testing.assert_allclose(got[s], want[s], rtol=RTOL, atol=ATOL * scale, err_msg=s.text)


def relist(doc: dict, arts: dict) -> None:
    """A serve plan document's ``artifacts`` list made what its references name again, and the artifacts
    nothing names dropped (after a test rewrote a reference)."""
    used = set()

    def walk(o):
        if isinstance(o, dict):
            if set(o) == {"artifact"}:
                used.add(o["artifact"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk({k: v for k, v in doc.items() if k != "artifacts"})
    doc["artifacts"] = sorted(used)
    for k in list(arts):
        if k not in used:
            arts.pop(k)
