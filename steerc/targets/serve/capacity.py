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
PLANS_FLAG, RANK_FLAG, KERNELS_FLAG, PER_REQUEST_FLAG = (
    "--max-steer-plans", "--max-steer-rank", "--max-steer-kernels", "--steer-per-request")
BOUNDS = {"plans": (PLANS_FLAG, 1, 4096), "rank": (RANK_FLAG, 0, 256), "kernels": (KERNELS_FLAG, 1, 16)}


@frozen
class Capacity:
    """A server's plan tables: ``plans`` slots (distinct live plans in the graph at once), kernels of rank at
    most ``rank``, at most ``kernels`` kernels of a plan at one steer point; ``per_request``: whether a plan the
    tables cannot hold runs on the per-request path (steer points in the graph) or is refused."""

    plans: int = 32
    rank: int = 4
    kernels: int = 2
    per_request: bool = True

    def to_json(self) -> dict:
        return {"plans": self.plans, "rank": self.rank, "kernels": self.kernels, "per_request": self.per_request}


def check_capacity(cfg: dict) -> Capacity:
    """The capacity of a server's steerc config (``plans``, ``rank``, ``kernels``, ``per_request``; defaults
    where absent); ValueError naming the key when malformed."""
    values = {}
    for name, (flag, lo, hi) in BOUNDS.items():
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"`{name}` ({flag}) must be an integer from {lo} to {hi}, got {value!r}")
        values[name] = value
    per_request = cfg.get("per_request", True)
    if not isinstance(per_request, bool):
        raise ValueError(f"`per_request` ({PER_REQUEST_FLAG}) must be true or false, got {per_request!r}")
    return Capacity(**values, per_request=per_request)


def tableable(hook: dict, shapes, rank: int, kernels: int) -> str | None:
    """Why the plan tables cannot hold a hook of a built plan (None: they can), naming the flag that would.

    ``shapes(name)``: a plan tensor's shape. Probes, gates and kinds without a batched form
    (:attr:`steerc.ir.kernels.base.Kind.batched`) run per request; a kernel's rank and the number of
    kernels at one point are bounded by the boot's ``rank`` and ``kernels``."""
    from steerc.ir.kernels import KINDS

    count = 0
    for site in hook["sites"]:
        if site["probes"]:
            return f"it reads a probe at {site['site']} (probes run per request: {PER_REQUEST_FLAG} on)"
        for k in site["kernels"]:
            kind = KINDS[k["kind"]]
            if kind.batched is None:
                return f"{k['kind']} has no batched form ({PER_REQUEST_FLAG} on)"
            if k["gate"] is not None:
                return f"its kernel at {site['site']} is gated (gates run per request: {PER_REQUEST_FLAG} on)"
            if k["preserve_norm"] and site.get("head") is not None:
                return f"it keeps the norm of one head's columns at {site['site']} ({PER_REQUEST_FLAG} on)"
            r = kind.rank({role: tuple(shapes(name)) for role, name in k["tensors"].items() if role != "schedule"})
            if r > rank:
                return f"a kernel of rank {r} at {site['site']}, over the tables' {rank} ({RANK_FLAG} {r})"
            count += 1
    if count > kernels:
        return f"{count} kernels at one steer point, over the tables' {kernels} ({KERNELS_FLAG} {count})"
    return None


def capacity_refusal(boot: dict, tensors: dict, capacity: Capacity) -> str | None:
    """Why a server with ``capacity`` and no per-request path refuses a built plan (None: it takes it)."""
    if capacity.per_request:
        return None
    import numpy as np

    for hook in boot["hooks"]:
        why = tableable(hook, lambda name: np.shape(tensors[name]), capacity.rank, capacity.kernels)
        if why is not None:
            return (f"this server runs every plan from its in-graph tables ({PER_REQUEST_FLAG} off), and they "
                    f"cannot hold this one: {why}")
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
