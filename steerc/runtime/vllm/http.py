"""The serve plugin's HTTP front end: an ASGI middleware that admits steered requests.

vLLM's OpenAI-compatible server takes ASGI middleware by import path
(``--middleware steerc.runtime.serve_http.SteercAdmission``; ``steerc
serve`` passes it). It reads every POST body, whatever its headers (no or
another content type, a charset, chunks, UTF-16/32 or a BOM, gzip or deflate:
:func:`read_body`); for every one whose ``vllm_xargs`` carries steerc
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
  rather than run the request unsteered;
* a body it cannot read that mentions steerc, ``steerc_`` keys outside
  ``vllm_xargs``, and a non-map ``vllm_xargs`` naming steerc are 400 too;
* a plan whose steering depends on tokens a prefix-cache hit would skip
  (``Admitted.cacheable`` false) is forwarded with a ``cache_salt`` of its
  own, so it computes every token itself.

Requests without steerc fields pass through untouched (their bytes are
replayed as received).
"""

from __future__ import annotations

import base64
import json
import secrets
import zlib

from steerc.runtime.vllm.engine import (
    CONFIG_KEY,
    LOAD_FORMAT,
    EngineError,
    engine_key,
    facts_of,
    is_compiled,
    pipeline_stages,
    served_capacity,
    served_sites,
)
from steerc.runtime.vllm.receipt import take
from steerc.runtime.vllm.store import ArtifactStore
from steerc.targets.serve.admission import MAX_INLINE_CHARS, MAX_PLAN_CHARS, RequestError, admit
from steerc.targets.serve.capacity import capabilities
from steerc.targets.serve.request import (
    ARTIFACTS_KEY,
    CAPABILITIES_PATH,
    PARAMS_KEY,
    PLAN_KEY,
    RECEIPT_KEY,
    compact,
    unique_salt,
)

MAX_BODY = MAX_PLAN_CHARS + MAX_INLINE_CHARS + (1 << 20)


class SteercAdmission:
    """Pure ASGI middleware (no framework dependency)."""

    def __init__(self, app):
        self.app = app
        self._engine = None
        self._store = None
        self._key = None
        self._sites = None
        self._capacity = None
        self._stages = None
        self._config = None

    async def __call__(self, scope, receive, send):
        if scope.get("type") == "http" and scope.get("method") in ("GET", "HEAD") \
                and scope.get("path") == CAPABILITIES_PATH:
            return await self._capabilities(scope, send)
        # Every POST is read, whatever its headers say (a missing or other content type, a charset, chunks,
        # UTF-16 or a BOM, a content encoding): FastAPI parses a body without a content type as JSON, so
        # a header is no reason to let steerc fields through unadmitted.
        if scope.get("type") != "http" or scope.get("method") != "POST":
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
            doc = read_body(body, _header(scope, b"content-encoding"))
        except RequestError as exc:
            return await _error(send, 400, exc)
        if doc is None:  # not JSON and nothing of steerc's in it: vLLM answers it as it would
            return await self.app(scope, _replay(body, receive), send)
        receipt = doc.pop(RECEIPT_KEY, False) if isinstance(doc, dict) else False
        if not isinstance(receipt, bool):
            return await _error(send, 400, RequestError(RECEIPT_KEY, "expected true or false"))
        xargs = doc.get("vllm_xargs") if isinstance(doc, dict) else None
        stray = _stray_fields(doc)
        if stray is not None:
            return await _error(send, 400, RequestError(stray, "steerc fields go in vllm_xargs (where vLLM passes "
                                                               "them on); here they would be ignored"))
        if not _mentions_steerc(xargs):
            if receipt:
                return await _error(send, 400, RequestError(RECEIPT_KEY, "a receipt is for a steered request, and "
                                                                         "this one carries no plan"))
            return await self.app(scope, _replay(body, receive), send)
        try:
            if not isinstance(xargs, dict):
                raise RequestError("vllm_xargs", f"expected a map of field to value, got {type(xargs).__name__}")
            if RECEIPT_KEY in xargs:
                raise RequestError(f"vllm_xargs.{RECEIPT_KEY}", "set by the server; ask for a receipt with "
                                                                f"`{RECEIPT_KEY}: true` at the top level")
            if receipt and doc.get("n") not in (None, 1):
                raise RequestError("n", "a receipt covers one choice: send n = 1 (or no receipt)")
            facts, tp_size, prefix_caching = self._engine_facts(scope)
            salt = doc.get("cache_salt")
            admitted = admit(xargs, facts, store=self._artifact_store(), tp_size=tp_size, salt=salt,
                             key=self._key, sites=self._sites, stages=self._stages, capacity=self._capacity)
            if admitted is None:  # admit() refuses every steerc_ field without a plan; never run it unsteered
                raise RequestError("vllm_xargs", "steerc fields without a plan")
            if salt is None and prefix_caching:
                raise RequestError("cache_salt", "required for a steered request while prefix caching is on "
                                                 "(steerc.serve_client.request_fields sets it)")
            for key, data in admitted.artifacts.items():
                self._artifact_store().put(data, expected=key)
        except RequestError as exc:
            return await _error(send, 400, exc)
        xargs = dict(xargs)
        xargs[ARTIFACTS_KEY] = json.dumps({k: base64.b64encode(v).decode("ascii")
                                           for k, v in sorted(admitted.artifacts.items())},
                                          separators=(",", ":"))
        if not isinstance(xargs.get(PARAMS_KEY, ""), str):  # a JSON object is fine here; vLLM takes strings
            xargs[PARAMS_KEY] = compact(xargs[PARAMS_KEY])
        if not isinstance(xargs[PLAN_KEY], str):
            xargs[PLAN_KEY] = compact(xargs[PLAN_KEY])
        if receipt:
            rid = secrets.token_hex(16)
            xargs[RECEIPT_KEY] = rid
            send = _with_receipt(send, rid, stream=bool(doc.get("stream")))
        doc["vllm_xargs"] = xargs
        if prefix_caching and not admitted.cacheable:
            # Its steering depends on tokens a cache hit would skip (a prompt-pooled probe, a scope relative
            # to the prompt's length): it must compute every token itself, so no block is shared with it.
            doc["cache_salt"] = unique_salt(admitted.salt)
        new_body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        scope = _with_headers(scope, len(new_body))
        return await self.app(scope, _replay(new_body, receive), send)

    def _engine_facts(self, scope):
        if self._engine is None:
            state = getattr(scope.get("app"), "state", None)
            config = getattr(state, "vllm_config", None)
            if config is None:
                raise RequestError("server", "the served model is not known yet; retry once the server is up")
            extra = config.additional_config if isinstance(config.additional_config, dict) else {}
            if config.load_config.load_format != LOAD_FORMAT or (extra.get(CONFIG_KEY) or {}).get("mode") != "serve":
                raise RequestError("server", "this server was not started with steerc's serve plugin "
                                             "(`steerc serve MODEL`); it would run the request unsteered")
            try:
                self._key = engine_key(config)
                self._sites = served_sites(config)
                self._capacity = served_capacity(config)
                self._stages = pipeline_stages(config)
            except EngineError as exc:
                raise RequestError("server", str(exc)) from None
            self._config = config
            self._engine = (facts_of(config), int(config.parallel_config.tensor_parallel_size),
                            bool(config.cache_config.enable_prefix_caching))
        return self._engine

    async def _capabilities(self, scope, send) -> None:
        try:
            facts, tp_size, prefix_caching = self._engine_facts(scope)
        except RequestError as exc:
            return await _error(send, 503, exc)
        config = self._config
        doc = capabilities(facts, sites=self._sites, compiled=is_compiled(config), tp_size=tp_size,
                           pp_size=int(config.parallel_config.pipeline_parallel_size),
                           prefix_caching=prefix_caching, signed_only=self._key is not None,
                           max_num_seqs=int(config.scheduler_config.max_num_seqs), capacity=self._capacity)
        doc["tables"]["free"] = await _free_slots(getattr(getattr(scope.get("app"), "state", None), "engine_client",
                                                          None))
        await _json(send, 200, doc, body=scope.get("method") == "GET")

    def _artifact_store(self):
        if self._store is None:
            self._store = ArtifactStore()
        return self._store


async def _free_slots(client) -> int | None:
    """How many plan slots the workers' tables have free now (the fewest over the workers; a slot a finished
    request held is freed at the next step), asked over ``collective_rpc``; None when they cannot answer."""
    import asyncio

    try:
        statuses = await asyncio.wait_for(client.collective_rpc("steerc_requests"), timeout=5)
        return min(int(s["tables"]["free"]) for s in statuses)
    except Exception:  # noqa: BLE001 - an answer without the count beats no answer
        return None


def _with_receipt(send, rid: str, *, stream: bool):
    """``send`` with the request's receipt added to its response: a ``steerc`` member of the JSON body, or
    (streaming) a last event before ``data: [DONE]`` with the stream's id, object and model, no choices, and
    ``steerc``. A response that is not a success goes out as it is."""
    start: dict = {}
    parts: list[bytes] = []
    last: dict = {}

    def receipt() -> dict:
        return take(rid) or {"error": "no receipt was written for this request (it did not run a step)"}

    async def wrapped(message):
        kind = message.get("type")
        if kind == "http.response.start":
            start.update(message)
            return await send(message) if stream or message.get("status") != 200 else None
        if kind != "http.response.body" or start.get("status") != 200:
            if kind == "http.response.body" and not message.get("more_body"):
                take(rid)
            return await send(message)
        body = message.get("body", b"")
        if stream:
            head, done, tail = body.partition(b"data: [DONE]")
            for line in head.split(b"\n"):
                if line.startswith(b"data: {"):
                    try:
                        last.update({k: v for k, v in json.loads(line[6:]).items()
                                     if k in ("id", "object", "created", "model")})
                    except ValueError:
                        pass
            if done:
                event = dict(last, choices=[], steerc=receipt())
                body = head + b"data: " + json.dumps(event).encode("utf-8") + b"\n\n" + done + tail
            return await send(dict(message, body=body))
        parts.append(body)
        if message.get("more_body"):
            return None
        full = b"".join(parts)
        try:
            doc = json.loads(full)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            doc["steerc"] = receipt()
            full = json.dumps(doc).encode("utf-8")
        else:
            take(rid)
        headers = [(k, v) for k, v in start.get("headers") or () if k.lower() != b"content-length"]
        await send(dict(start, headers=headers + [(b"content-length", str(len(full)).encode())]))
        return await send({"type": "http.response.body", "body": full, "more_body": False})

    return wrapped


def _header(scope, name: bytes) -> bytes:
    values = [v for k, v in scope.get("headers") or () if k.lower() == name]
    return b",".join(values)


def _mentions_steerc(xargs) -> bool:
    """Whether ``vllm_xargs`` could carry a steerc field: a map with a ``steerc_`` key, or anything else
    that names one (vLLM refuses a non-map itself; steerc refuses it first rather than let it by)."""
    if xargs is None:
        return False
    if isinstance(xargs, dict):
        return any(not isinstance(k, str) or k.lower().startswith("steerc") for k in xargs)
    return "steerc" in json.dumps(xargs, ensure_ascii=False).lower()


def _stray_fields(doc):
    """A top-level ``steerc_`` key (or every such key of a batch of documents): vLLM would drop it."""
    for item in doc if isinstance(doc, list) else (doc,):
        if isinstance(item, dict):
            for key in item:
                if key.lower().startswith("steerc"):
                    return key[:64]
    return None


def read_body(body: bytes, encoding: bytes = b""):
    """The JSON document of a request body, or None when it is not JSON and carries nothing of steerc's.

    The body is decoded as vLLM's JSON reader decodes it (UTF-8, UTF-16 or
    UTF-32, with or without a byte-order mark), after undoing a
    ``Content-Encoding`` of gzip or deflate. A body that cannot be read but
    mentions steerc is refused (:class:`RequestError`), never forwarded.
    """
    raw = body
    codings = [c.strip().lower() for c in encoding.decode("latin-1").split(",") if c.strip()]
    if any(c not in ("identity", "gzip", "x-gzip", "deflate") for c in codings):
        if _could_carry(raw):
            raise RequestError("content-encoding", f"{encoding.decode('latin-1')[:40]!r} is not one steerc reads "
                                                   "for a steered request (send it uncompressed or gzip)")
        return None
    try:
        for c in reversed(codings):
            if c in ("gzip", "x-gzip", "deflate"):
                raw = _inflate(raw, c)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        if _could_carry(body):
            raise RequestError("content-encoding", f"the body is not valid {codings[-1]} ({exc})") from None
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if doc is None and _could_carry(raw):
        raise RequestError("body", "not JSON steerc reads, and it mentions steerc fields: refused rather than "
                                   "run unsteered")
    return doc


def _inflate(data: bytes, coding: str) -> bytes:
    d = zlib.decompressobj(wbits=(16 + zlib.MAX_WBITS) if coding != "deflate" else zlib.MAX_WBITS)
    out = d.decompress(data, MAX_BODY + 1)
    if len(out) > MAX_BODY or d.unconsumed_tail:
        raise ValueError(f"over the {MAX_BODY}-byte cap once decompressed")
    if not d.eof:
        raise ValueError("truncated")
    return out


def _could_carry(raw: bytes) -> bool:
    """Whether bytes steerc cannot parse might still name a steerc field, in any text encoding."""
    low = raw.lower()  # lowers the ASCII bytes of UTF-16 and UTF-32 text too
    return any("steerc".encode(codec) in low for codec in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le",
                                                            "utf-32-be"))


def _with_headers(scope, n: int) -> dict:
    """The scope of the rewritten body: plain UTF-8 JSON of ``n`` bytes, sent whole."""
    drop = (b"content-length", b"content-encoding", b"transfer-encoding", b"content-type")
    headers = [(k, v) for k, v in scope.get("headers") or () if k.lower() not in drop]
    return dict(scope, headers=headers + [(b"content-type", b"application/json"),
                                          (b"content-length", str(n).encode())])


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
    await _json(send, status, {"error": {"message": str(exc), "type": "BadRequestError", "param": exc.field,
                                         "code": status}, "object": "error"})


async def _json(send, status: int, doc: dict, body: bool = True) -> None:
    payload = json.dumps(doc, sort_keys=True).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload if body else b""})
