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



def capabilities(facts, *, sites: tuple[str, ...], compiled: bool, tp_size: int, pp_size: int,
                 prefix_caching: bool, signed_only: bool, max_num_seqs: int) -> dict:
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
    }
