"""What vLLM builds for each family, without an engine: module names and decoder-layer signatures.

``python tests/engine/vllm_modules.py OUT.json [FAMILY ...]`` builds each family's tiny config (the
widened ``tiny-<family>`` config of ``models.py``, config only, no weights) as vLLM's own model class
on the ``meta`` device, in one process with a one-rank gloo group, and writes per family: the model
class, every module's name and class, the decoder layers' path, the class and ``forward`` parameters
of layer 0, or the error that stopped the build. ``test_vllm_site_tables.py`` judges the result
against steerc's vllm site tables; a separate process keeps vLLM's distributed state out of the
test process, which boots engines.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_one_rank() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)


def _config_folder(family: str, root: str) -> str:
    from models import tiny_config
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    raw = tiny_config(family)
    model_type = raw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **raw)
    cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    folder = os.path.join(root, family)
    cfg.save_pretrained(folder)
    return folder


def describe(family: str, root: str) -> dict:
    import torch
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    try:
        folder = _config_folder(family, root)
        model_config = ModelConfig(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=256,
                                   enforce_eager=True)
        vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig("cpu"))
        with set_current_vllm_config(vllm_config), torch.device("meta"):
            model = initialize_model(vllm_config=vllm_config)
    except Exception as exc:  # noqa: BLE001 - reported, and judged by the test
        return {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    modules = dict(model.named_modules())
    # The first decoder layer: element 0 of the largest ModuleList (as steerc.runtime.hf.discover finds layers).
    lists = [(len(m), name) for name, m in modules.items() if isinstance(m, torch.nn.ModuleList) and len(m)]
    layers = max(lists)[1]
    layer = modules[f"{layers}.0"]
    return {
        "model_class": type(model).__name__,
        "modules": {name: type(m).__name__ for name, m in sorted(modules.items())},
        "layers": layers,
        "layer0_class": type(layer).__name__,
        "layer0_forward": list(inspect.signature(layer.forward).parameters),
    }


def main(argv: list[str]) -> int:
    sys.path.insert(0, HERE)
    from steerc.facts.families import FAMILIES

    out, families = argv[0], argv[1:] or list(FAMILIES)
    from vllm.model_executor.models import registry

    # vLLM inspects each model class in a fresh interpreter (to keep CUDA out of the caller) unless its
    # modelinfo cache has it: on a clean machine that is ~10 s of importing vLLM per family, 4 minutes for all
    # of them. Here, on the meta device, there is no CUDA to keep out: inspected in this process, and cached
    # as vLLM caches them, for the engines the other tests boot.
    registry._run_in_subprocess = lambda fn: fn()
    _init_one_rank()
    with tempfile.TemporaryDirectory() as root:
        report = {family: describe(family, root) for family in families}
    with open(out, "w") as fh:
        json.dump(report, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
