"""``--target export``: a program baked into a torch.export'ed steered model with a static KV cache.

On a tiny random Llama: the exported program, loaded with ``torch.export.load`` in a process where steerc
cannot be imported, and its AOTInductor package, give the HF target's logits for the prefill and every
decode step of a greedy generation (scopes, a schedule, a per-token gate, a prompt-pooled gate, a head); its
steering tensors are
buffers (new values change the logits: zero gives the unsteered model's); what it cannot express is refused
before anything is built, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import vec  # noqa: E402
from support import run_cli  # noqa: E402

PROGRAM = ("steer 1\n"
           "probe q {\n  at   resid_post[0]\n  read norm\n  pool token\n}\n"
           f"intervention a {{\n  at resid_post[1]\n  add 6.0 * decay(0.8) * {vec(64, 70)}\n"
           "  tokens prompt[-1:], generated\n}\n"
           f"intervention b {{\n  at head[2, 1]\n  scale 2.0\n  tokens generated[:3]\n  when q > 0.5\n}}\n"
           f"intervention c {{\n  at mlp_out[3]\n  ablate {vec(64, 71)}\n  tokens prompt\n}}\n"
           f"probe m {{\n  at resid_pre[1]\n  read cosine({vec(64, 72)})\n  pool prompt.mean\n}}\n"
           f"intervention d {{\n  at resid_post[2]\n  add 5.0 * {vec(64, 73)}\n  tokens generated\n"
           "  when m > -2.0\n}\n")
PROMPT = [3, 4, 5, 6, 7, 8]
NEW = 5

RUN = """
import sys, json, torch
sys.modules["steerc"] = None  # the exported program runs without steerc
kind, path, prompt, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
if kind == "program":
    run = torch.export.load(path).module()
else:
    run = torch._inductor.aoti_load_package(path)
ids = torch.tensor([prompt]); plen = torch.tensor([len(prompt)])
logits = run(ids, torch.arange(len(prompt)).unsqueeze(0), plen)
rows = [logits[0, -1]]
for step in range(new - 1):
    tok = int(rows[-1].argmax())
    logits = run(torch.tensor([[tok]]), torch.tensor([[len(prompt) + step]]), plen)
    rows.append(logits[0, -1])
print(json.dumps(torch.stack(rows).tolist()))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The export built twice (minutes with a cold Inductor cache), once per run: under pytest-xdist the first
    worker to get here builds it in the run's shared temporary folder, holding a lock, and the others read it
    (the tests only read it). Without workers, in this session's own folder."""
    import fcntl

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _build(tmp_path_factory.mktemp("export"))
    shared = tmp_path_factory.getbasetemp().parent  # one run's folder, beside each worker's own
    with open(shared / "export-built.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = shared / "export-built"
        if (root / "listed").exists():
            return root, (root / "listed").read_text()
        root.mkdir(exist_ok=True)
        root, out = _build(root)
        (root / "listed").write_text(out)
        return root, out


def _build(root):
    from tiny_models import save_tiny_llama

    save_tiny_llama(root / "model")
    (root / "steer.toml").write_text("")
    (root / "p.steer").write_text(PROGRAM)
    old = os.getcwd()
    os.chdir(root)
    try:
        for folder in ("again", "out"):
            code, out, err = run_cli(["compile", "p.steer", "--model", "model", "--target", "export", "-o", folder])
            assert code == 0, err[-3000:]
    finally:
        os.chdir(old)
    return root, out


def _hf_logits(root, program: str = PROGRAM):
    from hf_util import plan_for
    from transformers import AutoModelForCausalLM

    from steerc.runtime.hf import install

    model = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with install(model, plan_for(model, program)):
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    return torch.stack(out.logits, dim=1)[0]


def _run(kind: str, path: str):
    proc = subprocess.run([sys.executable, "-c", RUN, kind, path, json.dumps(PROMPT), str(NEW)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.tensor(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("kind,name", [("program", "program.pt2"), ("aoti", "model.aoti.pt2")])
def test_the_exported_model_gives_the_hf_targets_logits_without_steerc(built, kind, name):
    root, _ = built
    want = _hf_logits(root)
    got = _run(kind, str(root / "out" / name))
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_the_artifacts_and_their_description(built):
    root, out = built
    for name in ("program.pt2", "hooks/__init__.py", "hooks/tensors.safetensors"):  # same input, same bytes
        assert (root / "out" / name).read_bytes() == (root / "again" / name).read_bytes(), name
    listed = sorted(os.path.relpath(line, "out") for line in out.split())
    assert {"program.pt2", "model.aoti.pt2", "steer.json", "hooks/__init__.py", "hooks/_support.py"} <= set(listed)
    info = json.loads((root / "out" / "steer.json").read_text())
    assert info["format"] == "steerc.export/1" and info["max_len"] == 512
    assert set(info["inputs"]) == {"input_ids", "position_ids", "prompt_len"} and info["buffers"]
    archive = zipfile.ZipFile(root / "out" / "program.pt2")
    pickled = [n for n in archive.namelist() if n.endswith((".pkl", ".pt")) and archive.read(n)]
    assert not pickled, pickled  # the sample inputs' entry is there, empty
    assert {n.split("/")[0] for n in archive.namelist()} == {"program"}


def test_the_steering_tensors_are_buffers_that_take_new_values(built):
    """The program's tensors are (persistent) buffers, not constants; written to zero, the prompt's logits are
    the plain model's (on the prompt only the add, at zero, and the ablation, of a zero basis, act; the pooled
    gate's add is on generated tokens)."""
    from transformers import AutoModelForCausalLM

    root, _ = built
    program = torch.export.load(str(root / "out" / "program.pt2"))
    steering = set(json.loads((root / "out" / "steer.json").read_text())["buffers"].values())
    assert steering and steering <= set(program.state_dict) and not steering & set(program.constants)
    module = program.module()
    ids, where = torch.tensor([PROMPT]), torch.arange(len(PROMPT)).unsqueeze(0)
    steered = module(ids, where, torch.tensor([len(PROMPT)]))[0, -1]
    for name in steering:
        module.get_buffer(name).zero_()
    for name, value in module.named_buffers():  # a fresh cache for the second prefill
        if name.startswith(("key_cache", "value_cache")):
            value.zero_()
    zeroed = module(ids, where, torch.tensor([len(PROMPT)]))[0, -1]
    plain = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    with torch.no_grad():
        want = plain(input_ids=ids).logits[0, -1]
    assert float((zeroed - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert float((steered - want).abs().max()) > 1e-2


@pytest.mark.parametrize("line,feature", [
    ("param s = 2.0 per request\nintervention x {\n  at resid_post[2]\n  scale s\n}\n", "param:per-request"),
    ('intervention x {\n  at resid_post[2]\n  scale 2.0\n  tokens after "c"\n}\n', "scope:after"),
    ('intervention x {\n  at resid_post[2]\n  scale 2.0\n}\nconstrain regex "a+"\n', "constraint:regex"),
])
def test_what_it_cannot_express_is_refused_before_building(tmp_path, monkeypatch, line, feature):
    from tiny_models import tiny_model

    monkeypatch.chdir(tmp_path)
    tiny_model("llama", "float32").save_pretrained(tmp_path / "model")
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text("steer 1\n" + line)
    code, _, err = run_cli(["compile", "p.steer", "--model", "model", "--target", "export", "-o", "out"])
    assert code == 1 and "unsupported-by-target" in err and "^" in err, err
    assert not (tmp_path / "out").exists()


def test_a_model_without_weights_is_a_diagnostic_before_building(tmp_path, monkeypatch):
    from tiny_models import tiny_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").mkdir()
    tiny_model("llama", "float32").config.save_pretrained(tmp_path / "cfg")
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text("steer 1\nintervention x {\n  at resid_post[1]\n  scale 2.0\n}\n")
    code, _, err = run_cli(["compile", "p.steer", "--model", "cfg", "--target", "export", "-o", "out"])
    assert code == 1 and "model-without-weights" in err and "^" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
