"""What a steerc server provisions at boot: the sites it can steer, and its steer points on a model.

A compiled server's graph is traced once, so every site a request may steer
or probe needs a steer point (:mod:`steerc.runtime.vllm.points`) from boot.
``steerc serve --steer-sites`` names the site groups that get one, on every
layer; a plan touching any other site is refused at admission, naming the
flag that provisions it. Pure Python: the front end and the CLI read it
without torch.

>>> parse_sites("resid,head")
('resid', 'head')
>>> group_of("resid_pre"), group_of("head")
('resid', 'head')
"""

from __future__ import annotations

from steerc.core.record import frozen
from steerc.facts.sites import site_table

# site group -> the site kinds of the language it covers (resid_pre[l] is resid_post[l-1]'s hook)
SITE_GROUPS = {"resid": ("resid_pre", "resid_post"), "attn_out": ("attn_out",), "mlp_out": ("mlp_out",),
               "head": ("head",)}
ALL_SITES = tuple(SITE_GROUPS)
SITES_FLAG = "--steer-sites"


def group_of(kind: str) -> str:
    for group, kinds in SITE_GROUPS.items():
        if kind in kinds:
            return group
    raise ValueError(f"{kind!r} is not a site kind")


def parse_sites(text: str) -> tuple[str, ...]:
    """The site groups of a ``--steer-sites`` value (ValueError naming a wrong one)."""
    groups = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not groups:
        raise ValueError(f"expected a comma-separated list of {', '.join(ALL_SITES)}")
    for g in groups:
        if g not in SITE_GROUPS:
            raise ValueError(f"{g!r} is not a site group (one of {', '.join(ALL_SITES)})")
    return tuple(g for g in ALL_SITES if g in groups)


def check_sites(value) -> tuple[str, ...]:
    """The ``sites`` of a server's steerc config (all groups when absent); ValueError when malformed."""
    if value is None:
        return ALL_SITES
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("`sites` must be a list of site groups")
    return parse_sites(",".join(value)) if value else ()


def refusal(kind: str, sites: tuple[str, ...]) -> str | None:
    """Why a server provisioned with ``sites`` cannot steer or probe a ``kind`` site (None: it can)."""
    group = group_of(kind)
    if group in sites:
        return None
    wanted = ",".join(g for g in ALL_SITES if g in sites or g == group)
    return (f"this server has no steer points at {kind} sites (it was started with {SITES_FLAG} "
            f"{','.join(sites) or 'none'}); start it with {SITES_FLAG} {wanted}")


def point_hooks(facts, sites: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """The (module, hook kind, tensor) of every steer point a server with ``sites`` installs on a model,
    in layer order: the hooks :func:`steerc.targets.hooks.lower_hooks` can ask for at those sites."""
    table = site_table(facts.family, "vllm")
    out: list[tuple[str, str, str]] = []
    for layer in range(facts.layers):
        for group in sites:
            for kind in SITE_GROUPS[group]:
                if kind == "resid_pre" and layer > 0:
                    continue
                hook = table.hook(kind, layer)
                key = (hook.module, hook.kind, hook.tensor)
                if key not in out:
                    out.append(key)
    return out



# The plan tables a serve-mode engine provisions at boot (steerc.runtime.vllm.tables), and their flags.
PLANS_FLAG, RANK_FLAG, KERNELS_FLAG, PROBES_FLAG, CONDITIONS_FLAG, PER_REQUEST_FLAG = (
    "--max-steer-plans", "--max-steer-rank", "--max-steer-kernels", "--max-steer-probes", "--max-steer-conditions",
    "--steer-per-request")
BOUNDS = {"plans": (PLANS_FLAG, 1, 4096), "rank": (RANK_FLAG, 0, 256), "kernels": (KERNELS_FLAG, 1, 16),
          "probes": (PROBES_FLAG, 0, 16), "conditions": (CONDITIONS_FLAG, 1, 8)}


@frozen
class Capacity:
    """A server's plan tables: ``plans`` slots (distinct live plans in the graph at once), kernels of rank at
    most ``rank``, at most ``kernels`` kernels of a plan at one steer point, at most ``probes`` probes per plan
    (a probe's basis, too, of rank at most ``rank``) and at most ``conditions`` comparisons in one gate (a gate
    is a truth table over its comparisons: ``2 ** conditions`` entries); ``per_request``: whether a plan the
    tables cannot hold runs on the per-request path (steer points in the graph) or is refused. A server's
    config may leave it out: :func:`check_capacity` then takes it off on CUDA (no steerc op in the graph, vLLM's
    own full CUDA graphs) and on elsewhere (no graphs to keep, and the steer points skip idle sites); and
    without the per-request path ``probes`` is 0 unless given: traced, probe rows and gates run at every
    point of every step whether a plan reads there or not (on SmolLM2 on a CPU, 0.41 of plain vLLM against
    0.85 without them), so an operator asks for them (``--max-steer-probes 2``)."""

    plans: int = 32
    rank: int = 4
    kernels: int = 2
    probes: int = 2
    conditions: int = 4
    per_request: bool = True

    def to_json(self) -> dict:
        return {"plans": self.plans, "rank": self.rank, "kernels": self.kernels, "probes": self.probes,
                "conditions": self.conditions, "per_request": self.per_request}


def check_capacity(cfg: dict, cuda: bool = False) -> Capacity:
    """The capacity of a server's steerc config (``plans``, ``rank``, ``kernels``, ``probes``, ``conditions``,
    ``per_request``; defaults where absent, ``per_request`` off on ``cuda``, ``probes`` 0 without the
    per-request path); ValueError naming the key when malformed."""
    values = {}
    for name, (flag, lo, hi) in BOUNDS.items():
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"`{name}` ({flag}) must be an integer from {lo} to {hi}, got {value!r}")
        values[name] = value
    per_request = cfg.get("per_request", not cuda)
    if not isinstance(per_request, bool):
        raise ValueError(f"`per_request` ({PER_REQUEST_FLAG}) must be true or false, got {per_request!r}")
    if not per_request:
        values.setdefault("probes", 0)
    return Capacity(**values, per_request=per_request)


def tableable(hook: dict, shapes, capacity: Capacity, gates: list) -> str | None:
    """Why the plan tables cannot hold a hook of a built plan (None: they can), naming the flag that would.

    ``shapes(name)``: a plan tensor's shape; ``gates``: the plan's boot gates. Kinds without a batched form
    (:attr:`steerc.ir.kernels.base.Kind.batched`) run per request; a kernel's (and a probe basis') rank, the
    number of kernels at one point and of comparisons in one gate are bounded by the boot's ``capacity``. A
    probe is read before the point's kernels, so one after a kernel of the same point, or on one head's
    columns, runs per request. The probes per plan are bounded by :func:`table_refusals`, which sees the plan."""
    from steerc.ir.checked import gate_leaves
    from steerc.ir.kernels import KINDS

    count = 0
    for site in hook["sites"]:
        for probe in site["probes"]:
            if count:
                return f"it reads a probe at {site['site']} after a kernel at the same steer point ({PER_REQUEST_FLAG} on)"
            if site.get("head") is not None or site.get("local_columns"):
                return f"it reads a probe on one head's columns at {site['site']} ({PER_REQUEST_FLAG} on)"
            shape = tuple(shapes(probe["tensor"])) if probe.get("tensor") else ()
            r = shape[0] if len(shape) == 2 and probe["kind"] != "sae_feature" else 1
            if r > max(capacity.rank, 1):
                return f"a probe basis of rank {r} at {site['site']}, over the tables' {capacity.rank} ({RANK_FLAG} {r})"
        for k in site["kernels"]:
            kind = KINDS[k["kind"]]
            if kind.batched is None:
                return f"{k['kind']} has no batched form ({PER_REQUEST_FLAG} on)"
            if k["preserve_norm"] and site.get("head") is not None:
                return f"it keeps the norm of one head's columns at {site['site']} ({PER_REQUEST_FLAG} on)"
            r = kind.rank({role: tuple(shapes(name)) for role, name in k["tensors"].items() if role != "schedule"})
            if r > capacity.rank:
                return f"a kernel of rank {r} at {site['site']}, over the tables' {capacity.rank} ({RANK_FLAG} {r})"
            if k["gate"] is not None and capacity.probes == 0:
                return f"its kernel at {site['site']} is gated, and the tables hold no probes ({PROBES_FLAG} 1)"
            leaves = len(gate_leaves(gates[k["gate"]])) if k["gate"] is not None else 0
            if leaves > capacity.conditions:
                return (f"a gate of {leaves} comparisons at {site['site']}, over the tables' {capacity.conditions} "
                        f"({CONDITIONS_FLAG} {leaves})")
            count += 1
    if count > capacity.kernels:
        return f"{count} kernels at one steer point, over the tables' {capacity.kernels} ({KERNELS_FLAG} {count})"
    return None


def table_refusals(hooks: dict, shapes, capacity: Capacity, boot: dict) -> dict:
    """Why the plan tables cannot hold each of a plan's hooks (key -> reason, None: they can), of its
    ``boot`` section. A plan's probes and gated kernels go together: a gate reads its probes' values where
    the path that recorded them keeps them, so where one hook that reads or gates cannot be tabled, none is."""
    why = {key: tableable(hook, shapes, capacity, boot["gates"]) for key, hook in hooks.items()}
    probes = len(boot["probes"])
    linked = [key for key, hook in hooks.items() if _reads_or_gates(hook)]
    first = next((why[key] for key in linked if why[key] is not None), None)
    if first is None and linked and probes > capacity.probes:
        first = f"{probes} probes, over the tables' {capacity.probes} ({PROBES_FLAG} {probes})"
    if first is not None:
        for key in linked:
            why[key] = why[key] or f"{first} (a plan's probes and gated kernels are tabled together or not at all)"
    return why


def _reads_or_gates(hook: dict) -> bool:
    return any(site["probes"] or any(k["gate"] is not None for k in site["kernels"]) for site in hook["sites"])


def capacity_refusal(boot: dict, tensors: dict, capacity: Capacity) -> str | None:
    """Why a server with ``capacity`` and no per-request path refuses a built plan (None: it takes it)."""
    if capacity.per_request:
        return None
    import numpy as np

    hooks = dict(enumerate(boot["hooks"]))
    why = table_refusals(hooks, lambda name: np.shape(tensors[name]), capacity, boot)
    for i in hooks:
        if why[i] is not None:
            return (f"this server runs every plan from its in-graph tables ({PER_REQUEST_FLAG} off), and they "
                    f"cannot hold this one: {why[i]}")
    return None


def capabilities(facts, *, sites: tuple[str, ...], compiled: bool, tp_size: int, pp_size: int,
                 prefix_caching: bool, signed_only: bool, max_num_seqs: int, capacity: Capacity | None = None) -> dict:
    """What ``GET /steerc/v1/capabilities`` answers: who this server is and what it steers.

    A client (:func:`steerc.serve_client.check_server`) reads it before sending a plan, so that a server
    without steerc (which would ignore ``vllm_xargs`` and answer unsteered) or one serving another model
    is refused before any request runs.
    """
    from steerc import __version__
    from steerc.targets.serve.format import FORMAT
    from steerc.targets.serve.target import CAPABILITIES

    features = [f.key for f in CAPABILITIES.features if f.supported
                and not (f.key.startswith("site:") and refusal(f.key[5:], sites) is not None)]
    return {
        "steerc": __version__,
        "format": FORMAT,
        "model": {"fingerprint": facts.fingerprint, "family": facts.family},
        "compiled": compiled,
        "sites": list(sites),
        "features": features,
        "parallel": {"tensor": tp_size, "pipeline": pp_size},
        "prefix_caching": prefix_caching,
        "signed_plans_only": signed_only,
        "max_num_seqs": max_num_seqs,
        "tables": (capacity or Capacity()).to_json(),
    }
