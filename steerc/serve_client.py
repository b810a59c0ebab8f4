"""Client side of the serve target: a compiled plan as request fields.

A steered request to a vLLM server running the steerc plugin carries the
plan JSON and its artifacts (base64, verified against their sha256 by the
server) in ``vllm_xargs`` — which vLLM copies into
``SamplingParams.extra_args`` — plus a ``cache_salt`` derived from the plan,
so the prefix cache never reuses KV computed under other steering. A JSON
Schema, regex, grammar or choice constraint adds the structured-output
fields.

With the ``openai`` client::

    from steerc.serve_client import request_fields
    fields = request_fields("out/")          # the folder `steerc compile --target serve` wrote
    client.chat.completions.create(model=..., messages=..., **fields)

``fields`` is ``{"extra_body": {...}}`` (and ``response_format`` for a
schema). With ``server="http://127.0.0.1:8000"`` it first asks that server's
``GET /steerc/v1/capabilities`` (once per server) and raises
:class:`ServerRefused` when it does not answer (a vLLM server without steerc
would ignore the plan and answer unsteered), serves another model, or has no
steer points at the plan's sites. A plan with per-request params (``param strength = 1 in [0, 4]
per request``) takes values: ``request_fields("out/", params={"strength":
2})`` adds ``steerc_params`` and the salt of those values. Offline, :func:`offline_request` gives the prompt dict and the
``extra_args`` for ``vllm.SamplingParams``. Needs neither torch nor vLLM.
"""

from __future__ import annotations

import base64
import os

from steerc.targets.serve.request import (
    ARTIFACTS_KEY,
    CAPABILITIES_PATH,
    PARAMS_KEY,
    PLAN_KEY,
    RECEIPT_KEY,
    compact,
    request_salt,
    unique_salt,
)

_ANSWERS: dict[str, dict] = {}  # server base URL -> its capabilities


class ServerRefused(RuntimeError):
    """The server would not run this plan steered (the message says why)."""


def capabilities(server: str, *, timeout: float = 10.0, fresh: bool = False) -> dict:
    """``GET /steerc/v1/capabilities`` of ``server`` (a base URL; a trailing ``/v1`` is dropped), asked once
    per server; :class:`ServerRefused` when it does not answer as a steerc server."""
    import json
    import urllib.error
    import urllib.request

    base = server.rstrip("/").removesuffix("/v1")
    if not fresh and base in _ANSWERS:
        return _ANSWERS[base]
    try:
        with urllib.request.urlopen(base + CAPABILITIES_PATH, timeout=timeout) as reply:
            doc = json.loads(reply.read())
    except urllib.error.HTTPError as err:
        raise ServerRefused(f"{base} answered {err.code} to {CAPABILITIES_PATH}: it is not a steerc server "
                            "(`steerc serve MODEL`), and would run a plan unsteered") from None
    except (OSError, ValueError) as exc:
        raise ServerRefused(f"{base}{CAPABILITIES_PATH}: no answer a steerc server gives ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict) or "format" not in doc:
        raise ServerRefused(f"{base}{CAPABILITIES_PATH}: not a steerc server's answer")
    _ANSWERS[base] = doc
    return doc


def check_server(server: str, plan: dict) -> dict:
    """The server's capabilities, once they show it runs ``plan`` steered (:class:`ServerRefused` if not)."""
    caps = capabilities(server)
    if caps["format"] != plan.get("format"):
        raise ServerRefused(f"the server reads {caps['format']} plans; this one is {plan.get('format')}")
    if caps["model"].get("fingerprint") != plan["model"]["fingerprint"]:
        raise ServerRefused(f"the server serves another model ({caps['model'].get('family')}, fingerprint "
                            f"{str(caps['model'].get('fingerprint'))[:12]}...) than the plan was compiled for "
                            f"({plan['model']['family']}, {plan['model']['fingerprint'][:12]}...)")
    kinds = {entry["site"]["kind"] for entry in plan.get("sites", ())} | {
        p["site"]["kind"] for p in plan.get("probes", ())}
    missing = sorted(k for k in kinds if f"site:{k}" not in caps.get("features", ()))
    if missing:
        raise ServerRefused(f"the server has no steer points at {', '.join(missing)} sites (its --steer-sites is "
                            f"{','.join(caps.get('sites', ())) or 'empty'})")
    if plan.get("params") and "param:per-request" not in caps.get("features", ()):
        raise ServerRefused("the server does not take per-request params")
    return caps


def read_compiled(folder: str) -> tuple[dict, dict[str, bytes]]:
    """(plan JSON, {artifact id: bytes}) from a compile output folder."""
    from steerc.core.jsonio import read_file

    _, plan = read_file(os.path.join(folder, "plan.json"))
    artifacts = {}
    for key in plan["artifacts"]:
        with open(os.path.join(folder, "artifacts", f"{key}.safetensors"), "rb") as fh:
            artifacts[key] = fh.read()
    return plan, artifacts


def extra_args(plan: dict, artifacts: dict[str, bytes], *, inline: bool = True, params: dict | None = None) -> dict:
    """``SamplingParams.extra_args`` for a steered request (strings only: ``vllm_xargs`` takes no maps)."""
    out = {PLAN_KEY: compact(plan)}
    if params:
        out[PARAMS_KEY] = compact(params)
    if inline:
        encoded = {k: base64.b64encode(v).decode("ascii") for k, v in sorted(artifacts.items())}
        out[ARTIFACTS_KEY] = compact(encoded)
    return out


def request_fields(folder: str, *, inline: bool = True, params: dict | None = None,
                   server: str | None = None, receipt: bool = False) -> dict:
    """Keyword arguments for the OpenAI client's ``create(...)`` call (``params``: per-request values;
    ``server``: the base URL it goes to, checked first with :func:`check_server`; ``receipt``: the response
    carries a ``steerc`` object saying what the plan steered)."""
    plan, artifacts = read_compiled(folder)
    if server is not None:
        check_server(server, plan)
    body = {"vllm_xargs": extra_args(plan, artifacts, inline=inline, params=params),
            "cache_salt": request_salt(plan, params)}
    if receipt:
        body[RECEIPT_KEY] = True
    request = plan.get("request") or {}
    if "structured_outputs" in request:
        body["structured_outputs"] = request["structured_outputs"]
    fields = {"extra_body": body}
    if "response_format" in request:
        fields["response_format"] = request["response_format"]
    return fields


def offline_request(folder: str, prompt, *, inline: bool = True, params: dict | None = None) -> tuple[dict, dict]:
    """(prompt dict with ``cache_salt``, ``extra_args``) for ``LLM.generate`` with ``SamplingParams``.

    A plan whose steering depends on every prompt token (a prompt-pooled probe, a scope relative to the
    prompt's length) gets a salt of its own per call, so vLLM never serves it cached KV; the HTTP
    front end does the same for :func:`request_fields`."""
    from steerc.targets.serve.admission import cacheable

    plan, artifacts = read_compiled(folder)
    prompt_dict = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": list(prompt)}
    prompt_dict["cache_salt"] = request_salt(plan, params)
    if not cacheable(plan, artifacts):  # steering that depends on every prompt token: KV of its own
        prompt_dict["cache_salt"] = unique_salt(prompt_dict["cache_salt"])
    return prompt_dict, extra_args(plan, artifacts, inline=inline, params=params)
