"""The serve plugin's HTTP front end: an ASGI middleware that admits steered requests.

vLLM's OpenAI-compatible server takes ASGI middleware by import path
(``--middleware steerc.runtime.serve_http.SteercAdmission``; ``steerc
serve`` passes it). For every JSON POST whose ``vllm_xargs`` carries steerc
fields, :class:`SteercAdmission` runs
:func:`steerc.targets.serve.admission.admit` against the served model before
vLLM parses the request:

* a bad request is answered ``400`` with an OpenAI-style error whose
  ``param`` names the field at fault; vLLM never sees it;
* ``cache_salt`` must be the plan's own, or with ``steerc_params`` the salt
  of those values (required while prefix caching is on, so that a steered
  prefix is never served to another plan or other values); a bad param value
  is a 400 whose ``param`` is ``steerc_params.<name>``;
* artifacts the request names but does not carry come from the server's
  store and are inlined, and inline ones are staged there, so the workers
  read nothing but the request;
* a server not started with steerc's loader in serve mode answers 400
  rather than run the request unsteered.

Requests without steerc fields pass through untouched (their bytes are
replayed as received).
"""

from __future__ import annotations

import base64
import json

from steerc.serve_client import ARTIFACTS_KEY, PARAMS_KEY
from steerc.targets.serve.admission import MAX_INLINE_CHARS, MAX_PLAN_CHARS, RequestError, admit

MAX_BODY = MAX_PLAN_CHARS + MAX_INLINE_CHARS + (1 << 20)


class SteercAdmission:
    """Pure ASGI middleware (no framework dependency)."""

    def __init__(self, app):
        self.app = app
        self._engine = None
        self._store = None
        self._key = None

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or not _is_json(scope):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay(body, receive, message), send)
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                return await _error(send, 413, RequestError("body", f"over the {MAX_BODY}-byte cap"))
            if not message.get("more_body"):
                break
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None  # vLLM answers malformed JSON itself
        xargs = doc.get("vllm_xargs") if isinstance(doc, dict) else None
        if not isinstance(xargs, dict) or not any(isinstance(k, str) and k.startswith("steerc_") for k in xargs):
            return await self.app(scope, _replay(body, receive), send)
        try:
            facts, tp_size, prefix_caching = self._engine_facts(scope)
            salt = doc.get("cache_salt")
            if salt is None and prefix_caching:
                raise RequestError("cache_salt", "required for a steered request while prefix caching is on "
                                                 "(steerc.serve_client.request_fields sets it)")
            admitted = admit(xargs, facts, store=self._artifact_store(), tp_size=tp_size, salt=salt,
                             key=self._key)
            for key, data in admitted.artifacts.items():
                self._artifact_store().put(data, expected=key)
        except RequestError as exc:
            return await _error(send, 400, exc)
        xargs = dict(xargs)
        xargs[ARTIFACTS_KEY] = json.dumps({k: base64.b64encode(v).decode("ascii")
                                           for k, v in sorted(admitted.artifacts.items())},
                                          separators=(",", ":"))
        if not isinstance(xargs.get(PARAMS_KEY, ""), str):  # a JSON object is fine here; vLLM takes strings
            xargs[PARAMS_KEY] = json.dumps(xargs[PARAMS_KEY], sort_keys=True, separators=(",", ":"))
        doc["vllm_xargs"] = xargs
        new_body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        return await self.app(_with_length(scope, len(new_body)), _replay(new_body, receive), send)

    def _engine_facts(self, scope):
        if self._engine is None:
            state = getattr(scope.get("app"), "state", None)
            config = getattr(state, "vllm_config", None)
            if config is None:
                raise RequestError("server", "the served model is not known yet; retry once the server is up")
            from steerc.runtime.serve import facts_of
            from steerc.runtime.vllm_engine import CONFIG_KEY, LOAD_FORMAT

            extra = config.additional_config if isinstance(config.additional_config, dict) else {}
            if config.load_config.load_format != LOAD_FORMAT or (extra.get(CONFIG_KEY) or {}).get("mode") != "serve":
                raise RequestError("server", "this server was not started with steerc's serve plugin "
                                             "(`steerc serve MODEL`); it would run the request unsteered")
            from steerc.runtime.vllm_engine import EngineError, engine_key

            try:
                self._key = engine_key(config)
            except EngineError as exc:
                raise RequestError("server", str(exc)) from None
            self._engine = (facts_of(config), int(config.parallel_config.tensor_parallel_size),
                            bool(config.cache_config.enable_prefix_caching))
        return self._engine

    def _artifact_store(self):
        if self._store is None:
            from steerc.runtime.serve import ArtifactStore

            self._store = ArtifactStore()
        return self._store


def _is_json(scope) -> bool:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-type":
            return b"json" in value.lower()
    return False


def _with_length(scope, n: int) -> dict:
    headers = [(k, v) for k, v in scope.get("headers") or () if k.lower() != b"content-length"]
    return dict(scope, headers=headers + [(b"content-length", str(n).encode())])


def _replay(body: bytes, receive, pending=None):
    """A ``receive`` that yields ``body`` once, then whatever the client sends next."""
    sent = False

    async def again():
        nonlocal sent, pending
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    return again


async def _error(send, status: int, exc: RequestError) -> None:
    payload = json.dumps({"error": {"message": str(exc), "type": "BadRequestError", "param": exc.field,
                                    "code": status}, "object": "error"}).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
