"""The steerc serve plugin for vLLM: a plan per request, applied to that request's rows only.

Start a server with ``steerc serve MODEL [vLLM options]``: it runs vLLM's
OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``)
with the pieces below switched on through vLLM's own mechanisms — no patch
of vLLM:

* ``--middleware steerc.runtime.serve_http.SteercAdmission`` — the HTTP
  front end (:mod:`.http`) admits each request before vLLM parses it
  (:func:`steerc.targets.serve.admission.admit`: the plan, its artifacts,
  the model, the cache salt); a bad one gets HTTP 400 naming the field.
  Artifacts a request names but does not carry are inlined from the
  server's store (:mod:`.store`), so the workers never depend on it.
* ``--logits-processors steerc.runtime.serve:SteercGuard`` — the guard
  (:mod:`.guard`): its ``validate_params`` admits requests of the offline
  API (``vllm.LLM``) the same way; in the worker it ends any request whose
  steering could not be built (it never runs unsteered).
* ``--load-format steerc`` with ``--additional-config
  '{"steerc": {"mode": "serve"}}'`` — steerc's model loader
  (:mod:`steerc.runtime.vllm.loader`) calls :func:`attach`, which installs
  the router (:mod:`.router`) on the loaded model; ``--enforce-eager`` runs
  it eager (per-request plans then dispatch in Python each step).
* ``--worker-extension-cls steerc.runtime.serve.SteercServeExtension`` —
  :class:`SteercServeExtension`: the router's status and artifact staging
  over ``collective_rpc``.

In the worker, the router reads each new request's plan from its
``SamplingParams.extra_args``, admits it again (the same function, on the
same inline bytes: the worker trusts nothing that came over the wire), builds
its steering (:class:`~.request.RequestSteer`, with the vllm target's
machinery: the same kernels, probes and gates) and hooks the modules its plan
touches. A plan is admitted and built once per process: admission keeps the
admitted, built form by the plan's content and the model's facts (at most
``MAX_SERVED_PLANS``, least recently used first out), so a request that
passes the offline front end and the worker in one process, and every later
request of the same plan, reuse it.

This module only wires those pieces together; each has its module:
:mod:`.store` (artifacts by hash), :mod:`.request` (one request's steering),
:mod:`.router` (the requests of a step, the steer points), :mod:`.guard`
(the logits processor).
"""

from __future__ import annotations

from steerc.runtime.vllm.guard import FAILED_KEY, SteercGuard
from steerc.runtime.vllm.request import RequestSteer
from steerc.runtime.vllm.router import ServeRouter, slot_id
from steerc.runtime.vllm.store import ArtifactStore

__all__ = ["FAILED_KEY", "ArtifactStore", "RequestSteer", "ServeRouter", "SteercGuard", "SteercServeExtension",
           "attach", "slot_id"]


def attach(model, runner, view, vllm_config, cfg: dict) -> ServeRouter:
    """Install the serve plugin's router on a freshly loaded model (called by steerc's model loader)."""
    router = ServeRouter(model, view, vllm_config)
    object.__setattr__(model, "_steerc_router", router)
    return router


class SteercServeExtension:
    """Worker extension (``--worker-extension-cls``) for introspection and staging over RPC."""

    def steerc_requests(self) -> dict:
        router = getattr(self.model_runner.get_model(), "_steerc_router", None)
        return router.status() if router is not None else {"steered": [], "hooks": 0, "failures": 0}

    def steerc_stage(self, data: bytes, key: str | None = None) -> str:
        """Stage one artifact in this worker's store."""
        return ArtifactStore().put(bytes(data), expected=key)
