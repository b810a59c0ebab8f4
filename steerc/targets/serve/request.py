"""The fields of a steered request to a steerc server, and their cache salts: what client and server share.

The client (:mod:`steerc.serve_client`) writes these fields and the server
(:mod:`steerc.targets.serve.admission`) reads them; both import them from
here, so neither imports the other for them.

>>> plan = {"cache_salt": "steerc-" + "0" * 32, "params": [{"name": "s", "default": 1.0}]}
>>> request_salt(plan, {"s": 1}) == plan["cache_salt"], request_salt(plan, {"s": 2}) == plan["cache_salt"]
(True, False)
"""

from __future__ import annotations

import hashlib
import json
import re

PLAN_KEY = "steerc_plan"
ARTIFACTS_KEY = "steerc_artifacts"
PARAMS_KEY = "steerc_params"
PREFIX = "steerc_"
RECEIPT_KEY = "steerc_receipt"  # top level: `true` asks for a receipt; in vllm_xargs: the front end's receipt id
RECEIPT_ID = re.compile(r"[0-9a-f]{32}")  # the front end's receipt ids: a file name, never a path
KEYS = (PLAN_KEY, ARTIFACTS_KEY, PARAMS_KEY, RECEIPT_KEY)  # every steerc_ field extra_args may carry
CAPABILITIES_PATH = "/steerc/v1/capabilities"  # what a steerc server answers (capacity.capabilities)


def compact(value) -> str:
    """A request field's JSON text: sorted keys, no spaces; what the client sends is left as it is (a NaN
    stays NaN, for the server's reader to refuse by name), where :func:`steerc.core.jsonio.canonical`, the
    text steerc hashes and stores, would write it out as data."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def request_salt(plan: dict, params: dict | None) -> str:
    """The ``cache_salt`` of a request: the plan's, or — when ``params`` move a per-request param off its
    default — a hash of the plan's salt and every param's value (KV under other values is never shared)."""
    defaults = {p["name"]: float(p["default"]) for p in plan.get("params") or ()}
    values = dict(defaults, **{k: _number(v) for k, v in (params or {}).items()})
    if values == defaults:
        return plan["cache_salt"]
    digest = hashlib.sha256((plan["cache_salt"] + compact(values)).encode("utf-8")).hexdigest()
    return "steerc-" + digest[:32]


def unique_salt(salt: str) -> str:
    """A ``cache_salt`` no other request has: its KV is never served from, nor to, another request."""
    import secrets

    return f"{salt}-once-{secrets.token_hex(16)}"
