"""A served plan is admitted and built once per process (issue 33), and the worker still checks what it gets.

Before, one request of the offline API was admitted twice in a process that holds both its front end
(``SteercGuard.validate_params``) and its worker (the router), and its plan built three times (admission,
admission again, the worker's buffers); every later request of the same plan did it all again. Now admission
keeps each admitted plan with its build (``admission.PLANS``, bounded by ``MAX_SERVED_PLANS``), keyed by the
plan's text, the model's facts and a bound plan's param values, and the worker builds its buffers from that
build. The counts below are of ``check_document`` (a plan's admission) and of the vllm target's ``build``,
wherever either runs; the router is the real one, on a model without an engine.

A request served from the cache is still checked for everything that is its own: its inline artifacts
against their names, those it leaves out, the server's key and sites, its params, its salt; a refusal in the
worker fails that request alone, naming the field.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from support import examples_path  # noqa: E402

from steerc.api import check_source  # noqa: E402
from steerc.core.limits import MAX_SERVED_PLANS  # noqa: E402
from steerc.facts import load_facts  # noqa: E402
from steerc.runtime.vllm import request as request_module  # noqa: E402
from steerc.runtime.vllm import router as router_module  # noqa: E402
from steerc.runtime.vllm.guard import FAILED_KEY, SteercGuard  # noqa: E402
from steerc.runtime.vllm.request import RequestSteer  # noqa: E402
from steerc.serve_client import ARTIFACTS_KEY, extra_args, read_compiled  # noqa: E402
from steerc.targets.serve import admission  # noqa: E402
from steerc.targets.serve.admission import RequestError, admit  # noqa: E402
from steerc.targets.serve.emit import emit  # noqa: E402

MODEL = os.path.join(examples_path(), "models", "tiny-llama")
FACTS = load_facts(MODEL)


def _vec(seed: int) -> str:
    values = np.random.default_rng(seed).normal(size=FACTS.hidden)
    return "[" + ", ".join(f"{x:.6f}" for x in values) + "]"


def _compiled(tmp_path, text: str, name: str) -> tuple[dict, dict]:
    result = check_source(text, f"{name}.steer", facts=FACTS)
    assert result.ok, result.render()
    emit(result.plan, FACTS, str(tmp_path / name))
    return read_compiled(str(tmp_path / name))


@pytest.fixture
def plain(tmp_path):
    return _compiled(tmp_path, f"steer 1\nintervention x {{\n  at resid_post[1]\n  add 2.0 * {_vec(1)}\n}}\n",
                     "plain")


@pytest.fixture
def with_params(tmp_path):
    text = (f"steer 1\nparam strength = 1 in [0, 4] per request\nvector v = {_vec(2)}\n"
            "intervention x {\n  at resid_post[2]\n  add strength * v\n}\n")
    return _compiled(tmp_path, text, "params")


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """An empty plan cache and a private artifact store; counts of admissions and builds, wherever they run."""
    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    admission.PLANS.clear()
    counts = {"admitted": 0, "built": 0}

    def count(module, name: str, what: str) -> None:
        original = getattr(module, name)

        def counting(*args, **kwargs):
            counts[what] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)

    count(admission, "check_document", "admitted")
    count(admission, "build", "built")
    count(request_module, "build", "built")
    yield counts
    admission.PLANS.clear()


class _View:
    """The runner view a router reads a request's SamplingParams through."""

    def __init__(self):
        self.params: dict[str, object] = {}

    def sampling_params(self, rid: str):
        return self.params[rid]


class _Model(torch.nn.Module):
    """A model whose decoder layers are where vLLM's are (``model.layers.N``), so this rank owns them all."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(torch.nn.Linear(FACTS.hidden, FACTS.hidden)
                                                for _ in range(FACTS.layers))


def _router(monkeypatch, *, key_file: str | None = None, sites: str | None = None):
    """steerc's serve router as the loader installs it, on a model and config without an engine (one rank)."""
    monkeypatch.setattr(router_module, "tensor_parallel", lambda: (0, 1))
    with open(os.path.join(MODEL, "config.json"), encoding="utf-8") as fh:
        hf_config = json.load(fh)
    steerc = {"mode": "serve", **({"hmac_key_file": key_file} if key_file else {}),
              **({"sites": sites} if sites else {})}
    config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf_config, enforce_eager=True),
        compilation_config=SimpleNamespace(mode=0),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, tensor_parallel_size=1),
        additional_config={"steerc": steerc})
    return router_module.ServeRouter(_Model(), _View(), config)


def _worker(router, rid: str, extra: dict):
    """The router's admission of a new request (what it runs at the request's first step)."""
    params = SimpleNamespace(extra_args=extra)
    router.view.params[rid] = params
    return router._admit(rid), params


def test_a_request_through_the_offline_front_end_and_a_worker_is_admitted_and_built_once(
        counted, plain, monkeypatch):
    """issue 33: validate_params then the worker, in one process: one admission and one build, not 2 and 3."""
    doc, arts = plain
    params = SimpleNamespace(extra_args=extra_args(doc, arts))
    SteercGuard.validate_params(params)
    assert counted == {"admitted": 1, "built": 1}
    router = _router(monkeypatch)
    router.view.params["r1"] = params
    steer = router._admit("r1")
    assert isinstance(steer, RequestSteer) and steer.fns, "steered, with a function at the plan's module"
    assert counted == {"admitted": 1, "built": 1}
    assert FAILED_KEY not in params.extra_args


def test_requests_of_the_same_plan_are_admitted_and_built_once(counted, plain, with_params, monkeypatch):
    """issue 33: every later request of a plan (new bytes of the same text) reuses its admission and build;
    a bound plan is built once per param values."""
    router = _router(monkeypatch)
    for rid in ("a", "b", "c"):
        steer, _ = _worker(router, rid, extra_args(*plain))
        assert isinstance(steer, RequestSteer)
    assert counted == {"admitted": 1, "built": 1}
    doc, arts = with_params
    for rid, values in (("p1", {"strength": 2.0}), ("p2", {"strength": 2.0}), ("p3", {"strength": 3.0}),
                        ("p4", None)):
        steer, _ = _worker(router, rid, extra_args(doc, arts, params=values))
        assert isinstance(steer, RequestSteer)
    # the plan once, built at its defaults once (p4), and at each of the two param values once
    assert counted == {"admitted": 2, "built": 1 + 1 + 2}


def test_requests_of_one_plan_share_its_build_but_never_their_buffers(counted, plain, monkeypatch):
    router = _router(monkeypatch)
    one, _ = _worker(router, "a", extra_args(*plain))
    two, _ = _worker(router, "b", extra_args(*plain))
    (name,) = [n for n in one.state.boot["buffers"] if n.endswith(".bias")]
    assert one.state.buffer(name).data_ptr() != two.state.buffer(name).data_ptr()
    shared = admission.PLANS.get(next(iter(admission.PLANS._entries))).built()[1]
    assert not any(a.flags.writeable for a in shared.values()), "the shared build cannot be changed in place"


def test_a_cached_plan_still_checks_what_each_request_brings(counted, plain, with_params, tmp_path):
    """issue 33: the cache keeps the plan's admission, never a request's own fields."""
    doc, arts = plain
    assert admit(extra_args(doc, arts), FACTS) is not None
    name = doc["artifacts"][0]
    tampered = extra_args(doc, arts)
    blobs = json.loads(tampered[ARTIFACTS_KEY])
    blobs[name] = blobs[name][:-4] + ("AAAA" if blobs[name][-4:] != "AAAA" else "BBBB")
    tampered[ARTIFACTS_KEY] = json.dumps(blobs)
    with pytest.raises(RequestError) as err:
        admit(tampered, FACTS)
    assert err.value.field == f"{ARTIFACTS_KEY}.{name[:16]}"
    with pytest.raises(RequestError, match="does not carry"):
        admit(extra_args(doc, arts, inline=False), FACTS)
    with pytest.raises(RequestError, match="cache_salt"):
        admit(extra_args(doc, arts), FACTS, salt="steerc-" + "1" * 32)
    with pytest.raises(RequestError) as err:
        admit(extra_args(doc, arts), FACTS, key=b"a serving key of more than 16 bytes")
    assert err.value.field == "steerc_plan.hmac"
    with pytest.raises(RequestError) as err:
        admit(extra_args(doc, arts), FACTS, sites=("attn_out",))
    assert err.value.field == "steerc_plan.sites[0].site.kind"
    other = load_facts(os.path.join(examples_path(), "models", "tiny-qwen2"))
    with pytest.raises(RequestError) as err:
        admit(extra_args(doc, arts), other)
    assert err.value.field == "steerc_plan.model.fingerprint"
    pdoc, parts = with_params
    assert admit(extra_args(pdoc, parts, params={"strength": 2.0}), FACTS) is not None
    with pytest.raises(RequestError) as err:
        admit(extra_args(pdoc, parts, params={"strength": 9.0}), FACTS)
    assert err.value.field == "steerc_params.strength"
    # the plain plan; again for the request that lacks an artifact (a whole admission names it) and on the
    # other model; the plan with params once
    assert counted["admitted"] == 4


def test_a_request_refused_by_the_worker_on_a_cached_plan_fails_alone_naming_the_field(
        counted, plain, monkeypatch, tmp_path):
    """A front end without the server's key admits a plan; the worker, which requires one, refuses it, and
    only it."""
    doc, arts = plain
    key = tmp_path / "key"
    key.write_bytes(b"a serving key of more than 16 bytes")
    SteercGuard.validate_params(SimpleNamespace(extra_args=extra_args(doc, arts)))
    router = _router(monkeypatch, key_file=str(key))
    steer, params = _worker(router, "bad", extra_args(doc, arts))
    assert not isinstance(steer, RequestSteer)
    assert "steerc_plan.hmac" in params.extra_args[FAILED_KEY]
    assert router.failures == 1
    unsteered, _ = _worker(router, "plain", {})
    assert unsteered is None and router.failures == 1


def test_the_plan_cache_is_bounded_and_least_recently_used_first_out(counted, with_params, monkeypatch):
    doc, arts = with_params
    values = [{"strength": round(0.1 * i, 1)} for i in range(MAX_SERVED_PLANS + 8)]
    for v in values:
        admit(extra_args(doc, arts, params=v), FACTS).built()  # as the worker does: a bound plan, built
    assert len(admission.PLANS) == MAX_SERVED_PLANS
    assert counted["admitted"] == 1, "the plan itself is used by every request: it stays"
    built = counted["built"]
    admit(extra_args(doc, arts, params=values[-1]), FACTS).built()
    assert counted["built"] == built, "the most recent binding is kept, built"
    admit(extra_args(doc, arts, params=values[0]), FACTS).built()
    assert counted["built"] == built + 1, "the oldest binding fell out: bound and built again"
