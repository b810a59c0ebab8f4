"""What a compiled steerc server provisions (--steer-sites), what it says it can do, and the client's check.

Admission refuses a plan at a site group the server has no steer points at, naming the flag; the
capabilities answer lists only what it provisioned; ``steerc serve --dry-run`` runs compiled (no
``--enforce-eager``); ``steerc.serve_client.check_server`` refuses a server that does not answer, answers
for another model, or lacks the plan's sites. The HTTP peer here is a stand-in on loopback (a plain
``http.server``): the real server's answer is tested in tests/engine/test_serve.py.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from support import examples_path, run_cli

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.serve_client import ServerRefused, check_server, extra_args, read_compiled, request_fields
from steerc.targets.serve.admission import RequestError, admit
from steerc.targets.serve.capacity import ALL_SITES, capabilities, parse_sites, point_hooks
from steerc.targets.serve.emit import emit

EXAMPLES = examples_path()


@pytest.fixture(scope="module")
def facts():
    return load_facts(os.path.join(EXAMPLES, "models", "tiny-llama"))


@pytest.fixture(scope="module")
def heads_plan(facts, tmp_path_factory):
    """06_heads: steers head sites (and residual ones)."""
    result = check_file(os.path.join(EXAMPLES, "06_heads.steer"), facts=facts)
    assert result.ok, result.render()
    out = tmp_path_factory.mktemp("heads")
    emit(result.plan, facts, str(out))
    return str(out)


def _kinds(folder):
    plan, _ = read_compiled(folder)
    return {e["site"]["kind"] for e in plan["sites"]} | {p["site"]["kind"] for p in plan["probes"]}


def test_a_plan_at_a_site_the_server_did_not_provision_is_refused_naming_the_flag(facts, heads_plan):
    assert "head" in _kinds(heads_plan)
    plan, artifacts = read_compiled(heads_plan)
    xargs = extra_args(plan, artifacts)
    assert admit(xargs, facts, sites=ALL_SITES) is not None
    with pytest.raises(RequestError) as err:
        admit(xargs, facts, sites=("resid", "attn_out", "mlp_out"))
    assert err.value.field.endswith(".site.kind")
    assert "--steer-sites resid,attn_out,mlp_out,head" in str(err.value)


def test_steer_points_cover_every_hook_a_plan_at_those_sites_asks_for(facts):
    from steerc.targets.hooks import lower_hooks

    every = set(point_hooks(facts, ALL_SITES))
    assert len(every) == 4 * facts.layers + 1  # resid_pre[0], then resid_post, attn_out, mlp_out, heads per layer
    for path in sorted(os.listdir(EXAMPLES)):
        if not path.endswith(".steer"):
            continue
        result = check_file(os.path.join(EXAMPLES, path), facts=facts)
        if not result.ok:
            continue
        for h in lower_hooks(result.plan, facts, "vllm").hooks:
            assert (h.module, h.kind, h.tensor) in every, (path, h)
    assert set(point_hooks(facts, ("resid",))) == {k for k in every if k[2] in ("input", "input1", "fused_pair")}


def test_site_groups_parse_and_refuse_by_name():
    assert parse_sites("head, resid,head") == ("resid", "head")
    for bad in ("", "resid,mlp", "all"):
        with pytest.raises(ValueError):
            parse_sites(bad)
    code, out, err = run_cli(["serve", "/m", "--dry-run", "--steer-sites", "resid,heads"])
    assert code == 2 and "--steer-sites" in err and "'heads'" in err and "Traceback" not in err


def test_serve_runs_compiled_unless_asked_for_eager():
    code, out, err = run_cli(["serve", "/m", "--dry-run", "--steer-sites", "resid"])
    assert code == 0, err
    assert "--enforce-eager" not in out
    config = json.loads(out.split("--additional-config ")[1].split("' ")[0].strip("'"))
    assert config["steerc"]["sites"] == ["resid"] and config["steerc"]["mode"] == "serve"
    code, out, _ = run_cli(["serve", "/m", "--dry-run", "--", "--enforce-eager"])
    assert code == 0 and out.count("--enforce-eager") == 1


def test_capabilities_list_only_the_provisioned_sites(facts):
    doc = capabilities(facts, sites=("resid",), compiled=True, tp_size=2, pp_size=1, prefix_caching=True,
                       signed_only=False, max_num_seqs=8)
    assert doc["model"] == {"fingerprint": facts.fingerprint, "family": facts.family}
    assert {"site:resid_pre", "site:resid_post"} <= set(doc["features"])
    assert not {"site:head", "site:attn_out", "site:mlp_out"} & set(doc["features"])
    assert "scope:after" not in doc["features"] and "op:ablate" in doc["features"]
    assert doc["format"] == "steerc.serve/1" and doc["compiled"] is True
    json.dumps(doc, allow_nan=False)


class _Peer:
    """A loopback HTTP server answering GET /steerc/v1/capabilities with ``answer`` (None: 404, as vLLM)."""

    def __init__(self, answer):
        self.asked = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                peer.asked += 1
                if answer is None or self.path != "/steerc/v1/capabilities":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def peer():
    made = []

    def make(answer):
        made.append(_Peer(answer))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_the_client_checks_the_server_once_and_refuses_one_without_steerc(facts, heads_plan, peer):
    good = peer(capabilities(facts, sites=ALL_SITES, compiled=True, tp_size=1, pp_size=1, prefix_caching=True,
                             signed_only=False, max_num_seqs=8))
    fields = request_fields(heads_plan, server=good.url + "/v1")  # an OpenAI base URL
    assert "vllm_xargs" in fields["extra_body"]
    request_fields(heads_plan, server=good.url)
    assert good.asked == 1, "asked once per server"

    plain = peer(None)  # vLLM without steerc: 404, and it would have answered a steered request unsteered
    with pytest.raises(ServerRefused, match="not a steerc server"):
        request_fields(heads_plan, server=plain.url)

    other = dict(capabilities(facts, sites=ALL_SITES, compiled=True, tp_size=1, pp_size=1, prefix_caching=True,
                              signed_only=False, max_num_seqs=8), model={"fingerprint": "0" * 64, "family": "x"})
    with pytest.raises(ServerRefused, match="another model"):
        request_fields(heads_plan, server=peer(other).url)

    narrow = peer(capabilities(facts, sites=("resid",), compiled=True, tp_size=1, pp_size=1, prefix_caching=True,
                               signed_only=False, max_num_seqs=8))
    plan, _ = read_compiled(heads_plan)
    with pytest.raises(ServerRefused, match="no steer points at head"):
        check_server(narrow.url, plan)

    with pytest.raises(ServerRefused, match="no answer"):
        request_fields(heads_plan, server="http://127.0.0.1:9")  # nothing listens there


def test_under_pipeline_parallelism_a_gate_must_read_probes_on_its_own_stage(facts, tmp_path):
    """03_cast_gate's probe and the kernels it gates: admitted when one stage holds them, refused (naming
    the probe, both stages and the field) when vLLM's layer split would put them on two."""
    result = check_file(os.path.join(EXAMPLES, "03_cast_gate.steer"), facts=facts)
    assert result.ok, result.render()
    emit(result.plan, facts, str(tmp_path / "gate"))
    xargs = extra_args(*read_compiled(str(tmp_path / "gate")))
    doc, _ = read_compiled(str(tmp_path / "gate"))
    probe = doc["probes"][0]["site"]["layer"]
    gated = sorted({e["site"]["layer"] for e in doc["sites"]})
    assert all(layer > probe for layer in gated)
    assert admit(xargs, facts, stages=None) is not None
    assert admit(xargs, facts, stages=(0,)) is not None
    assert admit(xargs, facts, stages=(0, max(gated) + 1)) is not None  # both on the first stage
    with pytest.raises(RequestError) as err:
        admit(xargs, facts, stages=(0, probe + 1))  # the probe on stage 0, its kernels on stage 1
    assert err.value.field == "steerc_plan.probes"
    assert "stage 0" in str(err.value) and "stage 1" in str(err.value) and "do not cross" in str(err.value)


# ------------------------------------------------------------------- the plan tables' bounds (issue 35)


def _served(facts, tmp_path, body: str, name: str):
    from steerc.api import check_source

    result = check_source("steer 1\nvector v = " + json.dumps([0.1] * facts.hidden) + "\n"
                          "vector u = " + json.dumps([0.2 * (i % 3) for i in range(facts.hidden)]) + "\n" + body,
                          f"{name}.steer", facts=facts)
    assert result.ok, result.render()
    emit(result.plan, facts, str(tmp_path / name))
    return extra_args(*read_compiled(str(tmp_path / name)))


@pytest.mark.parametrize("body,flag", [
    ("intervention a {\n  at resid_post[1]\n  ablate v, u\n}\n", "--max-steer-rank 2"),
    ("intervention a {\n  at resid_post[1]\n  ablate v\n}\nintervention b {\n  at resid_post[1]\n  add 2.0 * v\n}\n",
     "--max-steer-kernels 2"),
    ("probe p {\n  at resid_pre[1]\n  read dot(v)\n  pool token\n}\n"
     "intervention a {\n  at resid_post[1]\n  add 2.0 * v\n  when p > 0 and p < 9\n}\n", "--max-steer-conditions 2"),
    ("probe p {\n  at resid_pre[1]\n  read dot(v)\n  pool token\n}\nprobe q {\n  at resid_pre[1]\n  read norm\n"
     "  pool prompt.mean\n}\nintervention a {\n  at resid_post[1]\n  add 2.0 * v\n  when p > 0\n}\n"
     "intervention b {\n  at resid_post[2]\n  add 2.0 * u\n  tokens generated\n  when q > 1\n}\n", "--max-steer-probes 2"),
    ("intervention a {\n  at head[1, 0]\n  scale 0.5\n  preserve norm\n}\n", "--steer-per-request on"),
])
def test_without_the_per_request_path_a_plan_past_the_tables_is_refused_naming_the_flag(facts, tmp_path, body,
                                                                                         flag):
    from steerc.targets.serve.capacity import Capacity

    xargs = _served(facts, tmp_path, body, "p")
    tight = Capacity(rank=1, kernels=1, probes=1, conditions=1, per_request=False)
    with pytest.raises(RequestError) as err:
        admit(xargs, facts, capacity=tight)
    assert err.value.field == "steerc_plan" and flag in str(err.value), str(err.value)
    assert admit(xargs, facts, capacity=Capacity(rank=1, kernels=1, probes=1, conditions=1)) is not None, \
        "the per-request path takes it"
    if "head" not in body:  # gates and probes included: the tables hold them within their bounds
        assert admit(xargs, facts, capacity=Capacity(rank=2, kernels=2, probes=2, conditions=2,
                                                     per_request=False)) is not None


def test_the_tables_flags_reach_the_engine_and_refuse_bad_values():
    from steerc.targets.serve.capacity import Capacity, check_capacity

    code, out, err = run_cli(["serve", "/m", "--dry-run", "--max-steer-plans", "8", "--max-steer-rank", "2",
                              "--max-steer-kernels", "3", "--max-steer-probes", "1", "--max-steer-conditions", "3",
                              "--steer-per-request", "off"])
    assert code == 0, err
    config = json.loads(out.split("--additional-config ")[1].split("' ")[0].strip("'"))["steerc"]
    assert check_capacity(config) == Capacity(plans=8, rank=2, kernels=3, probes=1, conditions=3, per_request=False)
    for flag, value in (("--max-steer-plans", "0"), ("--max-steer-rank", "-1"), ("--max-steer-kernels", "99"),
                        ("--max-steer-probes", "-1"), ("--max-steer-conditions", "9")):
        code, out, err = run_cli(["serve", "/m", "--dry-run", flag, value])
        assert code == 2 and flag in err and "Traceback" not in err, (flag, err)
    for cfg, key in (({"plans": True}, "plans"), ({"rank": "4"}, "rank"), ({"per_request": "no"}, "per_request")):
        with pytest.raises(ValueError, match=key):
            check_capacity(cfg)
    assert check_capacity({}) == Capacity()
    # traced, probe rows cost every point every step: asked for, not given, without the per-request path
    assert check_capacity({}, cuda=True) == Capacity(probes=0, per_request=False)
    assert check_capacity({"probes": 2}, cuda=True).probes == 2 and check_capacity({"per_request": True}).probes == 2


def test_capabilities_say_what_the_tables_hold(facts):
    from steerc.targets.serve.capacity import Capacity

    doc = capabilities(facts, sites=ALL_SITES, compiled=True, tp_size=1, pp_size=1, prefix_caching=False,
                       signed_only=False, max_num_seqs=8, capacity=Capacity(plans=16, per_request=False))
    assert doc["tables"] == {"plans": 16, "rank": 4, "kernels": 2, "probes": 2, "conditions": 4, "per_request": False}
