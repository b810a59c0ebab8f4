"""steerc on vLLM: one seat for the engine, in layers that import only downward.

* :mod:`.engine` — engine access: the configuration steerc reads, the runner's batch layout (V1 and V2
  runners), request slots, the per-step token metadata and the step hooks; beside it :mod:`.store`, the
  serve plugin's content-addressed artifact store;
* :mod:`.parallel` — a worker's share: its tensor-parallel rank, the layers its pipeline stage holds;
* :mod:`.steer` — steering state: fixed-shape buffers and the site functions (the one kernel dispatch of
  :mod:`steerc.runtime.kernels`); beside it :mod:`.points` (the serve plugin's steer points), :mod:`.tables`
  (its plan tables: every kernel kind batched), :mod:`.receipt` (a request's receipt) and :mod:`.activations` (the hooks
  that read sites for a capture);
* the two modes, side by side: :mod:`.plan` (one plan for every request: the vllm target) and the serve
  plugin (each request's own plan): :mod:`.request` (a request's steering) and :mod:`.guard` (the logits
  guard), the :mod:`.router` above them, :mod:`.serve` wiring them as the worker extension, and its HTTP
  front end :mod:`.http`;
* :mod:`.loader` — steerc's model loader, choosing the mode from a table, and the vLLM plugin;
* :mod:`.api` — the offline API on top: :func:`load`, :func:`swap`, :func:`install`,
  :func:`set_params`, :func:`enable`, :func:`status`, :func:`call`, :func:`sampling_params`,
  :func:`capture` (activations read through the engine, :mod:`.activations` in the workers) and
  :func:`probe_values` (a plan's probe, as its gates read it).

The API's names are read from :mod:`.api` when first used, so that importing a lower layer (the
``steerc serve`` command reads :mod:`.engine`'s constants) does not import torch.
"""

from __future__ import annotations

API = ("load", "swap", "install", "set_params", "enable", "status", "call", "sampling_params", "read_plan",
       "plan_file", "check_coverage", "capture", "capture_items", "captured", "probe_values", "answer_array",
       "checkpoint_dtype", "logs_to_stderr")


def __getattr__(name: str):
    if name in API:
        from steerc.runtime.vllm import api

        return getattr(api, name)
    raise AttributeError(f"module 'steerc.runtime.vllm' has no attribute {name!r}")


def __dir__():
    return sorted((*globals(), *API))
