"""Where a worker's share of a plan lies: its tensor-parallel rank, the layers its pipeline stage holds,
and its share of each hook (``head[l, h]`` on the rank holding head ``h``, with local columns).

Query heads are split across tensor-parallel ranks in contiguous blocks; residual, attention-output and
MLP-output kernels run on every rank on identical, already-reduced tensors. Where a family's layer
reduces later (Cohere's attention and MLP, summed before one all-reduce) those sites are refused under
tensor parallelism. Both modes (:mod:`.plan`, :mod:`.serve`) use these.
"""

from __future__ import annotations

from steerc.facts.sites import site_table
from steerc.targets.vllm.program import gate_probes
from steerc.targets.vllm.wire import PlanError


def tensor_parallel() -> tuple[int, int]:
    """(tensor-parallel rank, size) of this worker process."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def owns(model, module_path: str) -> bool:
    """Whether this pipeline stage holds the module (vLLM puts a PPMissingLayer where it does not)."""
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return False
    return type(module).__name__ != "PPMissingLayer"


def layer_path(module_path: str) -> str:
    """The decoder layer a module path lies in (``model.layers.3.mlp`` -> ``model.layers.3``)."""
    parts = module_path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return module_path


def check_gates_on_stage(model, boot: dict, hook: dict) -> None:
    """A gate's probes must run on the pipeline stage of the kernel it gates (probe values do not cross
    stages): a plan that needs that is refused on the stage that holds the kernel."""
    layers = {p["name"]: p["layer"] for p in boot["probes"]}
    root = layer_path(hook["module"]).rsplit(".", 1)[0]
    for site in hook["sites"]:
        for k in site["kernels"]:
            if k["gate"] is None:
                continue
            for name in gate_probes(boot["gates"][k["gate"]]):
                if not owns(model, f"{root}.{layers[name]}"):
                    raise PlanError("plan.boot.gates", f"probe `{name}` sits on another pipeline stage than "
                                                       f"the kernel it gates at {site['site']}")


def localise(hook: dict, heads: int, tp_rank: int, tp_size: int, head_dim: int, family: str) -> dict | None:
    """This rank's share of a hook: head sites keep the heads it holds, with local columns."""
    table = site_table(family, "vllm")
    local = heads // tp_size
    sites = []
    for site in hook["sites"]:
        refusal = table.tensor_parallel_refusal(site["site"].split("[", 1)[0], tp_size)
        if refusal is not None:
            raise PlanError("plan.boot.hooks", f"{site['site']}: {refusal}")
        if site["head"] is None:
            sites.append(dict(site, local_columns=None))
            continue
        h = site["head"]
        # Checked on every rank alike, so that a refused plan is refused everywhere.
        if site["probes"] and tp_size > 1:
            raise PlanError("plan.boot.hooks", f"probe at {site['site']}: a head probe cannot be shared across "
                                              "tensor-parallel ranks; read it at a residual site instead")
        if h // local != tp_rank:
            continue
        j = h % local
        sites.append(dict(site, local_columns=[j * head_dim, (j + 1) * head_dim]))
    return dict(hook, sites=sites) if sites else None
