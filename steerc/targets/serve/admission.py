"""What a steerc server accepts: a ``steerc.serve/1`` request, checked field by field before it runs.

The server's front end (the HTTP middleware, or the logits-processor hook
for the offline API) and its workers run the same :func:`admit`: whatever
passes it builds and runs in the worker, so nothing is left to fail there.
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
from collections.abc import Mapping

from steerc.core.errors import FieldError
from steerc.core.format_schema import SchemaError, check
from steerc.core.jsonio import JSONError, loads
from steerc.facts import ModelFacts
from steerc.facts.sites import site_table
from steerc.ir.plan import ParamError, check_params, rebind
from steerc.passes.plan_pipeline import PROBE_ROWS, InvalidPlan, verify
from steerc.targets import signing
from steerc.targets.constraints import constraint_from_json
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
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.schema.json")


class RequestError(FieldError):
    """A request whose steering is refused; ``field`` names the fault."""

    prefix = "steerc: "


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return json.load(fh)


def decode_json(field: str, value, limit: int):
    """A JSON value from a request field (a string, or already decoded), bounded in size and depth
    (steerc's one JSON reader, :mod:`steerc.core.jsonio`: no NaN, no huge integers, no lone surrogates)."""
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
    try:
        return loads(value, max_bytes=4 * limit)
    except JSONError as exc:
        raise RequestError(field, f"not JSON steerc reads ({exc})") from None


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
    """

    __slots__ = ("plan", "doc", "artifacts", "salt", "cacheable", "params")

    def __init__(self, plan, doc, artifacts, salt, cacheable: bool, params: dict | None = None):
        self.plan, self.doc, self.artifacts, self.salt = plan, doc, artifacts, salt
        self.cacheable = cacheable
        self.params = params if params is not None else (check_params(plan, {}) if plan.params else {})

    @property
    def plan_id(self) -> str:
        """The plan's identity: the sha256 of what its HMAC covers (the canonical plan, artifacts by name)."""
        return hashlib.sha256(signed_bytes(self.doc)).hexdigest()


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
    if key is not None:
        if not signing.verify(key, signed_bytes(doc), doc.get("hmac")):
            _fail("hmac", "missing or wrong: this server accepts only plans signed with its key "
                          "(steerc compile --hmac-key-file)")
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
        width = _check_site(f"{field}.site", p["site"], facts, tp_size, sites)
        if p["site"]["kind"] == "head" and tp_size > 1:
            _fail(f"{field}.site", "a head probe cannot be shared across tensor-parallel ranks")
        lo, hi = PROBE_ROWS[p["readout"]]
        if hi == 0:
            if p["vectors"] is not None:
                _fail(f"{field}.vectors", f"a {p['readout']} readout takes no vectors")
        elif p["vectors"] is None:
            _fail(f"{field}.vectors", f"a {p['readout']} readout needs its direction vectors")
        else:
            refs.tensor(f"{field}.vectors", p["vectors"], (lo, hi), width)
    for i, entry in enumerate(doc["sites"]):
        width = _check_site(f"sites[{i}].site", entry["site"], facts, tp_size, sites)
        for j, k in enumerate(entry["kernels"]):
            field = f"sites[{i}].kernels[{j}]"
            op = k["op"]
            if op["kind"] == "affine":
                if "artifact" in op["scale"]:
                    refs.tensor(f"{field}.op.scale", op["scale"], None, width)
                if op["bias"] is not None:
                    refs.tensor(f"{field}.op.bias", op["bias"], None, width)
            elif op["kind"] == "project":
                basis = refs.tensor(f"{field}.op.basis", op["basis"], (1, width), width)
                if op["target"] is not None and len(op["target"]) != basis.shape[0]:
                    _fail(f"{field}.op.target", f"{len(op['target'])} targets for {basis.shape[0]} directions")
            else:
                refs.tensor(f"{field}.op.e1", op["e1"], None, width)
                refs.tensor(f"{field}.op.e2", op["e2"], None, width)
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
        boot, _ = build(plan, facts)  # what the worker builds (steerc.runtime.vllm.serve.RequestSteer)
    except Exception as exc:  # noqa: BLE001 - a verified plan that still does not lower is refused, not run
        _fail("", f"does not build ({type(exc).__name__}: {exc})")
    salt = cache_salt(doc)
    if doc["cache_salt"] != salt:
        _fail("cache_salt", "is not this plan's salt (recomputed from the plan and its artifacts)")
    used = {k: artifacts[k] for k in refs.used}
    return Admitted(plan, doc, used, salt, prefix_cache_safe(boot))


def bind_request(admitted: Admitted, raw) -> Admitted:
    """The admitted plan at the request's ``steerc_params`` (a JSON object of numbers), with their salt."""
    values = decode_json(PARAMS_KEY, raw, 64 * 1024)
    if not isinstance(values, dict):
        raise RequestError(PARAMS_KEY, "expected a JSON object of param name to number")
    try:
        full = check_params(admitted.plan, values)
    except ParamError as exc:
        raise RequestError(f"{PARAMS_KEY}.{exc.field}", exc.message) from None
    return Admitted(rebind(admitted.plan, full), admitted.doc, admitted.artifacts,
                    request_salt(admitted.doc, values), admitted.cacheable, full)


def admit(extra_args, facts, *, store=None, tp_size: int = 1, salt=None,
          key: bytes | None = None, sites=None, stages=None) -> Admitted | None:
    """A request's steering from its ``extra_args`` (None when it asks for none).

    ``store`` (an :class:`~steerc.runtime.vllm.serve.ArtifactStore`) supplies
    artifacts the request references without carrying them; ``salt`` is the
    request's ``cache_salt`` where the caller sees it (the HTTP front end):
    it must be the plan's; ``key``: the HMAC key every plan must be signed with; ``sites``: the site
    groups the server has steer points at (all when None); ``stages``: under pipeline parallelism, each
    stage's first layer (a gate must read probes on its own stage).
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
    doc = decode_json(PLAN_KEY, extra_args[PLAN_KEY], MAX_PLAN_CHARS)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RequestError(f"{PLAN_KEY}.format", f"expected a {FORMAT} plan")
    artifacts = inline_artifacts(extra_args)
    if store is not None and isinstance(doc.get("artifacts"), list):  # a malformed list: the schema names it
        for name in doc["artifacts"]:
            if isinstance(name, str) and name not in artifacts and len(name) == 64:
                data = store.lookup(name)
                if data is not None:
                    artifacts[name] = data
    admitted = check_document(doc, facts, artifacts, tp_size=tp_size, key=key, sites=sites)
    if extra_args.get(PARAMS_KEY) is not None:
        admitted = bind_request(admitted, extra_args[PARAMS_KEY])
    receipt = extra_args.get(RECEIPT_KEY)
    if receipt is not None and not (isinstance(receipt, str) and RECEIPT_ID.fullmatch(receipt)):
        raise RequestError(RECEIPT_KEY, "set by the server's front end (ask with `steerc_receipt: true` at the "
                                        "top level of the request)")
    if salt is not None and salt != admitted.salt:
        raise RequestError("cache_salt", "is not the plan's cache_salt (request_fields() sets it)")
    if stages is not None and len(stages) > 1:
        why = split_gates(build(admitted.plan, facts)[0], stages)
        if why is not None:
            raise RequestError(f"{PLAN_KEY}.probes", why)
    return admitted
