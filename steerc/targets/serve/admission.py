"""What a steerc server accepts: a ``steerc.serve/1`` request, checked field by field before it runs.

The server's front end (the HTTP middleware, or the logits-processor hook
for the offline API) and its workers run the same :func:`admit`: whatever
passes it builds and runs in the worker, so nothing is left to fail there.
A process admits and builds each plan once (:data:`PLANS`, by the plan's
text and the model's facts); a later request of it is checked for what is
its own (see :func:`admit`).
It checks, with the field at fault in every refusal:

* the plan JSON against ``serve.schema.json`` (types, unknown keys, sizes,
  finite numbers, bounded indices and nesting);
* the model: the fingerprint is this server's, every layer and head
  exists;
* every artifact: present, hashing to its name, one finite float32 tensor,
  of the shape its role needs on this model (a ``[hidden]`` vector at a
  residual site, ``[head_dim]`` at a head, ``[k, width]`` bases and probe
  directions), and the plan's artifact list is exactly what it uses;
* gates name declared probes; no ``after`` scopes (not a serve feature);
  no head probes under tensor parallelism;
* per-request params: declared once, each binding names a declared param,
  fits the role of its kernel's op, and the plan's values are its
  coefficients times the defaults; the request's ``steerc_params`` are
  numbers the plan declares, inside their ranges (``steerc_params.<name>``
  at fault otherwise);
* the output constraint parses; ``cache_salt`` is the plan's own (recomputed,
  so a stale or forged salt cannot share another plan's prefix cache), and
  with per-request values, the salt of those values (:func:`request_salt`);
* the decoded plan passes the compiler's own verifier
  (:func:`steerc.passes.plan_pipeline.verify`: canonical sites each once,
  causality, orthonormal bases and planes, numbers float32 holds, probes,
  gates and params as the compiler writes them) and builds as the worker
  builds it; whether it may share prefix-cached KV is the vllm target's
  :func:`~steerc.targets.vllm.program.prefix_cache_safe` on that build;
* the request: ``extra_args`` a map, no ``steerc_`` key steerc does not read,
  a decoded (dict) plan only what JSON text could carry.

Pure Python (numpy and safetensors for the artifacts): the front end needs
neither torch nor vLLM to run it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

from steerc.core.errors import FieldError
from steerc.core.format_schema import SchemaError, check
from steerc.core.jsonio import JSONError, canonical, loads
from steerc.core.limits import MAX_SERVED_PLANS
from steerc.facts import ModelFacts
from steerc.facts.sites import site_table
from steerc.ir.kernels import KINDS
from steerc.ir.plan import ParamError, check_params, rebind
from steerc.passes.plan_pipeline import PROBE_ROWS, InvalidPlan, verify
from steerc.targets import signing
from steerc.targets.constraints import constraint_from_json
from steerc.targets.serve.capacity import capacity_refusal
from steerc.targets.serve.capacity import refusal as site_refusal
from steerc.targets.serve.format import FORMAT, artifact_id, cache_salt, from_serve, read_artifact, signed_bytes
from steerc.targets.serve.request import (
    ARTIFACTS_KEY,
    KEYS,
    PARAMS_KEY,
    PLAN_KEY,
    PREFIX,
    RECEIPT_ID,
    RECEIPT_KEY,
    request_salt,
)
from steerc.targets.vllm.program import build, prefix_cache_safe, split_gates

MAX_PLAN_CHARS = 4 * 1024 * 1024
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
MAX_INLINE_CHARS = 4 * MAX_ARTIFACT_BYTES
MAX_PARAMS_CHARS = 64 * 1024
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.schema.json")


class RequestError(FieldError):
    """A request whose steering is refused; ``field`` names the fault."""

    prefix = "steerc: "


def schema() -> dict:
    """The serve format's JSON Schema: ``serve.schema.json`` with each kernel kind's ``op`` fragment from the
    kernel seat (a kind registered at run time included)."""
    return _schema(tuple(KINDS))


@functools.lru_cache(maxsize=4)
def _schema(names: tuple) -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return with_kinds(json.load(fh))


def with_kinds(doc: dict) -> dict:
    """``doc`` with ``$defs.op`` (one fragment per kind) and the bindings' roles written from :data:`KINDS`:
    the published schema (``serve.schema.json``, ``spec/serve.schema.json``) is this of itself
    (:func:`published`)."""
    doc["$defs"]["op"] = {"oneOf": [kind.serve_schema for kind in KINDS.values()]}
    roles = list(dict.fromkeys(role for kind in KINDS.values() for role in kind.bindable))
    doc["$defs"]["binding"]["properties"]["role"] = {"enum": roles}
    return doc


def published() -> str:
    """The text of ``serve.schema.json`` as the built-in kinds make it."""
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        doc = json.load(fh)
    return json.dumps(with_kinds(doc), indent=2) + "\n"


def decode_json(field: str, value, limit: int):
    """A JSON value from a request field (a string, or already decoded), bounded in size and depth
    (steerc's one JSON reader, :mod:`steerc.core.jsonio`: no NaN, no huge integers, no lone surrogates)."""
    return _parse(field, json_text(field, value, limit), limit)


def json_text(field: str, value, limit: int) -> str:
    """A request field's JSON text, at most ``limit`` characters: the string it is, or the text of a value
    already decoded (which :func:`decode_json` reads back). Admission keeps plans by this text's hash."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        # Already decoded (a dict from the offline API, or a JSON object in the body): written out and read
        # again by the same reader, so it holds exactly what JSON text could (no NaN or infinities, no lone
        # surrogates, strings as keys, no huge integers) and hashes like it.
        try:
            value = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            value.encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise RequestError(field, f"not JSON steerc reads ({type(exc).__name__}: {str(exc)[:120]})") from None
    if len(value) > limit:
        raise RequestError(field, f"{len(value)} characters is over the {limit}-character cap")
    return value


def _parse(field: str, text: str, limit: int):
    try:
        return loads(text, max_bytes=4 * limit)
    except JSONError as exc:
        raise RequestError(field, f"not JSON steerc reads ({exc})") from None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def inline_artifacts(extra: dict) -> dict[str, bytes]:
    """The request's inline artifacts ``{id: bytes}``, each verified against its name."""
    raw = decode_json(ARTIFACTS_KEY, extra.get(ARTIFACTS_KEY) or {}, MAX_INLINE_CHARS)
    if not isinstance(raw, dict):
        raise RequestError(ARTIFACTS_KEY, "expected a map of artifact id to base64 bytes")
    out = {}
    for key, blob in raw.items():
        where = f"{ARTIFACTS_KEY}.{str(key)[:16]}"
        if not isinstance(key, str) or len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise RequestError(where, "artifact ids are sha256 hex digests")
        if not isinstance(blob, str):
            raise RequestError(where, "expected base64 text")
        try:
            data = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(where, "not base64") from None
        if len(data) > MAX_ARTIFACT_BYTES:
            raise RequestError(where, f"{len(data)} bytes is over the {MAX_ARTIFACT_BYTES}-byte cap")
        if artifact_id(data) != key:
            raise RequestError(where, "content does not hash to its name (tampered or corrupt)")
        out[key] = data
    return out


class Admitted:
    """An admitted request: its plan (steerc IR), its JSON document, artifacts and cache salt.

    ``cacheable``: whether a token's steering depends only on its own position
    and prefix (:func:`steerc.targets.vllm.program.prefix_cache_safe`, the vllm
    target's predicate, on the plan's boot section): only then may the request
    share prefix-cached KV with others of the same plan; otherwise the front end
    gives it a salt of its own (:func:`~steerc.targets.serve.request.unique_salt`).

    ``facts``: the model facts it was admitted against, which :meth:`built` builds for; ``contexts``: the
    servers (HMAC key, sites, tensor-parallel size) it has passed :func:`check_context` for.
    """

    __slots__ = ("plan", "doc", "artifacts", "salt", "cacheable", "params", "facts", "contexts", "_built",
                 "_plan_id")

    def __init__(self, plan, doc, artifacts, salt, cacheable: bool, params: dict | None = None, *,
                 facts=None, built: tuple[dict, dict] | None = None):
        self.plan, self.doc, self.artifacts, self.salt = plan, doc, artifacts, salt
        self.cacheable = cacheable
        self.params = params if params is not None else (check_params(plan, {}) if plan.params else {})
        self.facts = facts
        self.contexts: set = set()
        self._built = None if built is None else _read_only(built)
        self._plan_id: str | None = None

    @property
    def plan_id(self) -> str:
        """The plan's identity: the sha256 of what its HMAC covers (the canonical plan, artifacts by name)."""
        if self._plan_id is None:
            self._plan_id = hashlib.sha256(signed_bytes(self.doc)).hexdigest()
        return self._plan_id

    def built(self) -> tuple[dict, dict]:
        """The plan as the vllm runtime runs it, ``(boot, tensors)``
        (:func:`steerc.targets.vllm.program.build` on :attr:`facts`): built once, then shared by every request
        of this admitted plan. Its arrays are read-only; a worker copies them into its own buffers."""
        if self._built is None:
            if self.facts is None:
                raise ValueError("an Admitted built without the facts it was admitted against")
            self._built = _read_only(build(self.plan, self.facts))
        return self._built


def _read_only(built: tuple[dict, dict]) -> tuple[dict, dict]:
    """``build``'s result with its arrays frozen: it is shared between requests, so none may change it."""
    for value in built[1].values():
        if hasattr(value, "flags"):
            value.flags.writeable = False
    return built


def cacheable(doc: dict, artifacts: dict[str, bytes]) -> bool:
    """Whether requests of a compiled plan may share prefix-cached KV (:attr:`Admitted.cacheable`), on the
    facts the plan was compiled for."""
    boot, _ = build(from_serve(doc, artifacts.__getitem__), ModelFacts(**doc["model"]["facts"]))
    return prefix_cache_safe(boot)


def _fail(field: str, message: str):
    raise RequestError(f"{PLAN_KEY}.{field}" if field else PLAN_KEY, message)


def _check_site(field: str, site: dict, facts, tp_size: int, sites) -> int:
    """The site's width on this model (refusing layers and heads it lacks, sites the ranks only hold in part,
    and sites the server has no steer points at)."""
    why = None if sites is None else site_refusal(site["kind"], sites)  # the schema admits only site kinds
    if why is not None:
        _fail(f"{field}.kind", why)
    refusal = site_table(facts.family, "vllm").tensor_parallel_refusal(site["kind"], tp_size)
    if refusal is not None:
        _fail(f"{field}.kind", refusal)
    if site["layer"] >= facts.layers:
        _fail(f"{field}.layer", f"layer {site['layer']}, but the model has {facts.layers} layers")
    if (site["kind"] == "head") != (site["head"] is not None):
        _fail(f"{field}.head", "a head is given exactly for head sites")
    if site["head"] is not None and site["head"] >= facts.heads:
        _fail(f"{field}.head", f"head {site['head']}, but the model has {facts.heads} heads")
    return facts.width(site["kind"])


class _Refs:
    """Every artifact reference of a plan, with the shape its role needs."""

    def __init__(self, artifacts: dict[str, bytes]):
        self.artifacts = artifacts
        self.used: dict[str, object] = {}

    def tensor(self, field: str, ref: dict, rows: tuple[int, int | None] | None, width: int):
        key = ref["artifact"]
        if key not in self.used:
            data = self.artifacts.get(key)
            if data is None:
                raise RequestError(f"{ARTIFACTS_KEY}.{key[:16]}",
                                   f"the plan uses artifact {key[:16]}... (at {PLAN_KEY}.{field}), which the "
                                   "request does not carry")
            try:
                self.used[key] = read_artifact(data, key)
            except Exception as exc:  # noqa: BLE001 - any malformed artifact is refused the same way
                raise RequestError(f"{ARTIFACTS_KEY}.{key[:16]}", str(exc)) from None
        value = self.used[key]
        shape = tuple(value.shape)
        if rows is None:
            if shape != (width,):
                _fail(field, f"a vector of length {width} is needed here, the artifact has shape {list(shape)}")
        else:
            lo, hi = rows
            if len(shape) != 2 or shape[1] != width or shape[0] < lo or (hi is not None and shape[0] > hi):
                want = f"[{lo}, {width}]" if lo == hi else f"[k, {width}] with k >= {lo}"
                _fail(field, f"{want} is needed here, the artifact has shape {list(shape)}")
        return value


def _check_bindings(field: str, k: dict, refs: _Refs, width: int) -> None:
    """Vector coefficients are artifacts of the site's width (the rest is the plan verifier's)."""
    for b, binding in enumerate(k.get("bindings") or ()):
        if "artifact" in binding["coefficient"]:
            refs.tensor(f"{field}.bindings[{b}].coefficient", binding["coefficient"], None, width)


def check_document(doc, facts, artifacts: dict[str, bytes], *, tp_size: int = 1,
                   key: bytes | None = None, sites=None) -> Admitted:
    """Admit one plan document against a model's facts (raises RequestError naming the field).

    With ``key``, the plan must carry a valid HMAC (:mod:`steerc.targets.signing`); with ``sites``
    (:mod:`steerc.targets.serve.capacity`), it may steer and probe only those site groups.
    """
    try:
        check(doc, schema(), PLAN_KEY)
    except SchemaError as exc:
        raise RequestError(exc.field, exc.message) from None
    _check_hmac(doc, key)
    if doc["model"]["fingerprint"] != facts.fingerprint:
        _fail("model.fingerprint", "compiled for another model than this server's (its layout facts differ)")
    mine = facts.to_json()
    stated = {"family": doc["model"]["family"], **{f"facts.{k}": v for k, v in doc["model"]["facts"].items()}}
    for name, value in stated.items():  # the facts the fingerprint stands for (the schema names them all)
        have = mine[name.removeprefix("facts.")]
        if have != value or type(have) is not type(value):
            _fail(f"model.{name}", f"is {value!r}, this server's model has {have!r}, which the fingerprint names")
    refs = _Refs(artifacts)
    for i, p in enumerate(doc["probes"]):
        field = f"probes[{i}]"
        width = _check_probe_site(field, p["site"], facts, tp_size, sites)
        lo, hi = PROBE_ROWS[p["readout"]]
        if hi == 0:
            if p["vectors"] is not None:
                _fail(f"{field}.vectors", f"a {p['readout']} readout takes no vectors")
        elif p["vectors"] is None:
            _fail(f"{field}.vectors", f"a {p['readout']} readout needs its direction vectors")
        else:
            refs.tensor(f"{field}.vectors", p["vectors"], (lo, hi), width)
        if ("threshold" in p) != (p["readout"] == "sae_feature"):
            _fail(f"{field}.threshold", "an sae_feature readout has a threshold (its JumpReLU's, 0 for ReLU), "
                  "no other readout does")
    for i, entry in enumerate(doc["sites"]):
        width = _check_site(f"sites[{i}].site", entry["site"], facts, tp_size, sites)
        for j, k in enumerate(entry["kernels"]):
            field = f"sites[{i}].kernels[{j}]"
            op = k["op"]  # the schema admits only registered kinds
            KINDS[op["kind"]].check_serve(f"{field}.op", op, refs.tensor, width, _fail)
            for s, scope in enumerate(k["scope"]):
                if scope["kind"] == "after":
                    _fail(f"{field}.scope[{s}]", "`after` scopes are not supported by the serve target")
            _check_bindings(field, k, refs, width)
    if sorted(refs.used) != doc["artifacts"]:
        extra = sorted(set(doc["artifacts"]) - set(refs.used))
        _fail("artifacts", f"lists {extra[0][:16]}..., which the plan does not use" if extra
              else "is not the sorted list of the artifacts the plan uses")
    try:
        constraint_from_json(doc["constraint"])
    except Exception as exc:  # noqa: BLE001 - any malformed constraint
        _fail("constraint", f"not a constraint steerc reads ({exc})")
    try:
        plan = from_serve(doc, artifacts.__getitem__)
    except Exception as exc:  # noqa: BLE001 - a document that passed every check above still did not build
        _fail("", f"does not build ({type(exc).__name__}: {exc})")
    try:
        verify(plan, facts)  # the compiler's own verifier: every invariant a plan it produces holds
    except InvalidPlan as exc:
        _fail(exc.field, exc.message)
    try:
        boot, tensors = build(plan, facts)  # what the worker runs (steerc.runtime.vllm.request.RequestSteer)
    except Exception as exc:  # noqa: BLE001 - a verified plan that still does not lower is refused, not run
        _fail("", f"does not build ({type(exc).__name__}: {exc})")
    salt = cache_salt(doc)
    if doc["cache_salt"] != salt:
        _fail("cache_salt", "is not this plan's salt (recomputed from the plan and its artifacts)")
    used = {k: artifacts[k] for k in refs.used}
    admitted = Admitted(plan, doc, used, salt, prefix_cache_safe(boot), facts=facts, built=(boot, tensors))
    admitted.contexts.add(_context(key, tp_size, sites))
    return admitted


def _check_hmac(doc: dict, key: bytes | None) -> None:
    if key is not None:
        if not signing.verify(key, signed_bytes(doc), doc.get("hmac")):
            _fail("hmac", "missing or wrong: this server accepts only plans signed with its key "
                          "(steerc compile --hmac-key-file)")


def _check_probe_site(field: str, site: dict, facts, tp_size: int, sites) -> int:
    """A probe's site as :func:`_check_site` checks it, and no head probe under tensor parallelism."""
    width = _check_site(f"{field}.site", site, facts, tp_size, sites)
    if site["kind"] == "head" and tp_size > 1:
        _fail(f"{field}.site", "a head probe cannot be shared across tensor-parallel ranks")
    return width


def _context(key: bytes | None, tp_size: int, sites) -> tuple:
    """What of a server admission depends on besides the plan and the model (the key by its hash only)."""
    return (None if key is None else hashlib.sha256(key).hexdigest(), int(tp_size),
            None if sites is None else tuple(sites))


def check_context(admitted: Admitted, *, tp_size: int = 1, key: bytes | None = None, sites=None) -> None:
    """The checks of :func:`check_document` that depend on the server, not on the plan or the model: the
    HMAC key, the sites it has steer points at, what its tensor-parallel ranks can hold. A plan admitted
    on the same model for one server is admitted for another once these pass: they run in
    :func:`check_document`'s order, and everything else passed already, so a refusal names the field a whole
    admission would name. Remembered per server."""
    context = _context(key, tp_size, sites)
    if context in admitted.contexts:
        return
    doc, facts = admitted.doc, admitted.facts
    _check_hmac(doc, key)
    for i, p in enumerate(doc["probes"]):
        _check_probe_site(f"probes[{i}]", p["site"], facts, tp_size, sites)
    for i, entry in enumerate(doc["sites"]):
        _check_site(f"sites[{i}].site", entry["site"], facts, tp_size, sites)
    admitted.contexts.add(context)


def bind_request(admitted: Admitted, raw) -> Admitted:
    """The admitted plan at the request's ``steerc_params`` (a JSON object of numbers), with their salt."""
    values = decode_json(PARAMS_KEY, raw, MAX_PARAMS_CHARS)
    if not isinstance(values, dict):
        raise RequestError(PARAMS_KEY, "expected a JSON object of param name to number")
    try:
        full = check_params(admitted.plan, values)
    except ParamError as exc:
        raise RequestError(f"{PARAMS_KEY}.{exc.field}", exc.message) from None
    return Admitted(rebind(admitted.plan, full), admitted.doc, admitted.artifacts,
                    request_salt(admitted.doc, values), admitted.cacheable, full, facts=admitted.facts)


class PlanCache:
    """Admitted plans with their builds, by content: at most ``size``, the least recently used out first.

    A key names everything an admission read besides the server's own settings: the plan's JSON text (by
    its sha256; its artifacts are named by theirs), the model's facts and, for a plan bound to a request's
    params, their text. Only plans that passed are kept. Safe to share between threads.
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


# This process's admitted plans (the HTTP front end's, the offline front end's and a worker's alike).
PLANS = PlanCache(MAX_SERVED_PLANS)


def admit(extra_args, facts, *, store=None, tp_size: int = 1, salt=None,
          key: bytes | None = None, sites=None, stages=None, capacity=None) -> Admitted | None:
    """A request's steering from its ``extra_args`` (None when it asks for none).

    ``store`` (an :class:`~steerc.runtime.vllm.store.ArtifactStore`) supplies
    artifacts the request references without carrying them; ``salt`` is the
    request's ``cache_salt`` where the caller sees it (the HTTP front end):
    it must be the plan's; ``key``: the HMAC key every plan must be signed with; ``sites``: the site
    groups the server has steer points at (all when None); ``stages``: under pipeline parallelism, each
    stage's first layer (a gate must read probes on its own stage); ``capacity``: the server's plan tables
    (:class:`~steerc.targets.serve.capacity.Capacity`; without a per-request path, a plan they cannot hold
    is refused, naming the flag that would hold it).

    A plan is admitted (:func:`check_document`) and built once per process: :data:`PLANS` keeps it by the
    sha256 of its text and the model's facts, and a request bound to params keeps its bound plan by their
    text too. A later request of a plan admitted here, the same request passing the offline front end and
    a worker in one process among them, is checked only for what is its own: its fields, its inline
    artifacts (each hashed against its name) or the store's, the server's key, sites and ranks
    (:func:`check_context`), its params, receipt id, salt and pipeline stages. The worker still admits
    what the front end admitted: where they are two processes, what reaches the worker came over the wire,
    and a worker runs only what it checked itself (nothing the front end concluded travels with the
    request; the cache holds only this process's own admissions).
    """
    if extra_args is None:
        return None
    if not isinstance(extra_args, Mapping):
        raise RequestError("extra_args", f"expected a map of field to value, got {type(extra_args).__name__}")
    for name in extra_args:
        if isinstance(name, str) and name.startswith(PREFIX) and name not in KEYS:
            raise RequestError(name[:64], f"not a steerc request field (steerc reads {', '.join(KEYS)})")
    if PLAN_KEY not in extra_args:
        for orphan in (ARTIFACTS_KEY, PARAMS_KEY, RECEIPT_KEY):
            if orphan in extra_args:
                raise RequestError(orphan, f"{orphan} without a plan ({PLAN_KEY} is missing)")
        return None
    text = json_text(PLAN_KEY, extra_args[PLAN_KEY], MAX_PLAN_CHARS)
    plan_key = ("plan", _digest(text), canonical(facts.to_json()))
    admitted = _admit_plan(plan_key, text, extra_args, facts, store=store, tp_size=tp_size, key=key, sites=sites)
    if extra_args.get(PARAMS_KEY) is not None:
        admitted = _bind(plan_key, admitted, extra_args[PARAMS_KEY])
    receipt = extra_args.get(RECEIPT_KEY)
    if receipt is not None and not (isinstance(receipt, str) and RECEIPT_ID.fullmatch(receipt)):
        raise RequestError(RECEIPT_KEY, "set by the server's front end (ask with `steerc_receipt: true` at the "
                                        "top level of the request)")
    if salt is not None and salt != admitted.salt:
        raise RequestError("cache_salt", "is not the plan's cache_salt (request_fields() sets it)")
    if stages is not None and len(stages) > 1:
        why = split_gates(admitted.built()[0], stages)
        if why is not None:
            raise RequestError(f"{PLAN_KEY}.probes", why)
    if capacity is not None:
        why = capacity_refusal(*admitted.built(), capacity)
        if why is not None:
            raise RequestError(PLAN_KEY, why)
    return admitted


def _admit_plan(plan_key: tuple, text: str, extra_args, facts, *, store, tp_size: int, key, sites) -> Admitted:
    """The request's plan, admitted: :data:`PLANS`' entry when this process admitted it on these facts and
    the request still supplies every artifact it uses (checked against their names here), else a whole
    admission (which names whatever is wrong), kept for the next request."""
    known = PLANS.get(plan_key)
    if known is not None:
        artifacts = _artifacts(extra_args, known.doc, store)
        if all(name in artifacts for name in known.doc["artifacts"]):
            check_context(known, tp_size=tp_size, key=key, sites=sites)
            return known
    doc = _parse(PLAN_KEY, text, MAX_PLAN_CHARS)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RequestError(f"{PLAN_KEY}.format", f"expected a {FORMAT} plan")
    admitted = check_document(doc, facts, _artifacts(extra_args, doc, store), tp_size=tp_size, key=key,
                              sites=sites)
    PLANS.put(plan_key, admitted)
    return admitted


def _artifacts(extra_args, doc: dict, store) -> dict[str, bytes]:
    """The artifacts a request supplies: those it carries, each verified against its name, then those of
    the plan's list the store holds (verified when first read)."""
    artifacts = inline_artifacts(extra_args)
    if store is not None and isinstance(doc.get("artifacts"), list):  # a malformed list: the schema names it
        for name in doc["artifacts"]:
            if isinstance(name, str) and name not in artifacts and len(name) == 64:
                data = store.lookup(name)
                if data is not None:
                    artifacts[name] = data
    return artifacts


def _bind(plan_key: tuple, admitted: Admitted, raw) -> Admitted:
    """:func:`bind_request`, kept in :data:`PLANS` by the params' text: the same values again reuse the bound
    plan and its build."""
    text = json_text(PARAMS_KEY, raw, MAX_PARAMS_CHARS)
    bound_key = ("params", *plan_key[1:], _digest(text))
    bound = PLANS.get(bound_key)
    if bound is None:
        bound = bind_request(admitted, text)
        PLANS.put(bound_key, bound)
    return bound
