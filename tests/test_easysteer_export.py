"""``steerc compile --target easysteer`` (issue 37): a program as EasySteer's v2 ``SteeringSpec`` and the GGUF
vectors it names. EasySteer does not run here, so these tests hold the export to the importer (export then
``steerc import --from easysteer`` gives the same plan), to golden files, to the GGUF reader EasySteer's ``direct``
uses (``gguf.GGUFReader``, as its ``read_gguf_directions``) and to what EasySteer cannot say (a diagnostic, exit 1,
nothing written).

The golden files under ``tests/fixtures/easysteer/<program>/`` are written by
``python tests/test_easysteer_export.py --write`` (with ``vectors.safetensors``, the programs' vectors, from closed
forms exact in float32); the programs beside them are written by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
from support import REPO, run_cli

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.ir import nodes as ir

FIXTURES = os.path.join(REPO, "tests", "fixtures", "easysteer")
MODEL = os.path.join(REPO, "tests", "fixtures", "examples", "models", "tiny-llama")  # llama, 4 layers, hidden 64
GOLDEN = ("joy_all", "windows", "stacked")
HIDDEN = 64


def _vectors() -> dict[str, np.ndarray]:
    """The golden programs' vectors: closed forms, exact in float32 on every platform."""
    i = np.arange(HIDDEN)
    return {"joy": ((i % 7 - 3) / 8).astype(np.float32), "calm": (((i * 5) % 11 - 5) / 16).astype(np.float32),
            "lift": ((i % 3) / 4 - 0.25).astype(np.float32)}


def _compile(program: str, out: str, model: str = MODEL) -> tuple[int, str, str]:
    return run_cli(["compile", program, "--model", model, "--target", "easysteer", "-o", out])


def _written(out: str) -> dict[str, bytes]:
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out)) if not n.startswith(".")}


# ------------------------------------------------------------------------------------------ the same plan back


def _selectors(scope) -> frozenset:
    """A scope as the positions it names, spans left out: ``all`` is the prompt and the generated tokens, and a
    whole phase covers its own positions and windows (EasySteer keeps the widest)."""
    out = set()
    for s in scope:
        if isinstance(s, ir.ScopeAll):
            out |= {("prompt", None), ("generated", None)}
            continue
        phase = "prompt" if isinstance(s, ir.ScopePrompt) else "generated"
        sel = s.sel
        out.add((phase, None if sel is None else ("at", sel.index) if isinstance(sel, ir.PosIndex)
                 else ("slice", sel.start or 0, sel.stop)))
    return frozenset(x for x in out if x[1] is None or (x[0], None) not in out)


def _meaning(plan) -> list:
    """What a plan does, site by site and kernel by kernel in order: the added float32 vector's bytes, the
    positions and preserve norm."""
    return [(sp.site.text, [(np.asarray(k.op.bias.array, np.float32).tobytes(), _selectors(k.scope), k.preserve_norm,
                             k.gate, k.op.schedule) for k in sp.kernels]) for sp in plan.sites]


def _round_trip(tmp_path, program: str):
    out = str(tmp_path / "out")
    code, _, err = _compile(program, out)
    assert code == 0, err
    back = str(tmp_path / "back.steer")
    code, _, err = run_cli(["import", os.path.join(out, "spec.json"), "--from", "easysteer", "-o", back,
                            "--model", MODEL])
    assert code == 0, err
    facts = load_facts(MODEL)
    before, after = check_file(program, facts=facts), check_file(back, facts=facts)
    assert before.ok and after.ok, before.render() + after.render()
    return before.plan, after.plan, out


@pytest.mark.parametrize("name", GOLDEN)
def test_export_then_import_is_the_same_plan(tmp_path, name):
    """issue 37: the same sites, kernels in the same order, the same float32 vectors, positions and preserve
    norm."""
    before, after, _ = _round_trip(tmp_path, os.path.join(FIXTURES, f"{name}.steer"))
    assert _meaning(after) == _meaning(before)
    assert [sp.site.text for sp in after.sites] == [sp.site.text for sp in before.sites]


def test_a_program_of_its_own_vectors_round_trips(tmp_path):
    """issue 37: literal vectors, a folded scale and every scope the export maps."""
    v = ", ".join(repr(float(x)) for x in _vectors()["calm"] * np.float32(0.1))
    prog = tmp_path / "own.steer"
    prog.write_text(f"steer 1\nvector v = [{v}]\n"
                    "intervention a {\n  at resid_post[1:4]\n  add 3.0 * v\n  tokens prompt, generated[2:]\n}\n"
                    "intervention b {\n  at resid_post[2]\n  add -1.0 * v\n  tokens prompt[1], prompt[-2], "
                    "generated[0]\n  preserve norm\n}\n")
    before, after, out = _round_trip(tmp_path, str(prog))
    assert _meaning(after) == _meaning(before)
    spec = json.loads(open(os.path.join(out, "spec.json"), encoding="utf-8").read())
    assert [v["apply"] for v in spec["vectors"]] == [
        {"prompt": "all", "generation_window": [2, None]},
        {"prompt_positions": [1, -2], "generation_positions": [0]}]
    assert [v["layers"] for v in spec["vectors"]] == [[1, 2, 3], [2]] and spec["conflict"] == "sequential"


# ------------------------------------------------------------------------------------------ golden files


def write_golden() -> None:
    """Write ``vectors.safetensors`` and each golden program's export (``--write``)."""
    import tempfile

    from steerc.io.brainpatch import safetensors_bytes

    with open(os.path.join(FIXTURES, "vectors.safetensors"), "wb") as fh:
        fh.write(safetensors_bytes({k: ("F32", v) for k, v in _vectors().items()}, None))
    for name in GOLDEN:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            code, _, err = _compile(os.path.join(FIXTURES, f"{name}.steer"), out)
            if code != 0:
                raise SystemExit(err)
            folder = os.path.join(FIXTURES, name)
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            for file, data in _written(out).items():
                with open(os.path.join(folder, file), "wb") as fh:
                    fh.write(data)
        print(folder)


@pytest.mark.parametrize("name", GOLDEN)
def test_the_export_is_its_golden_files_byte_for_byte(tmp_path, name):
    """issue 37: the same program and model give the same bytes (regenerate: python tests/test_easysteer_export.py
    --write)."""
    for run in ("a", "b"):
        out = str(tmp_path / run)
        code, _, err = _compile(os.path.join(FIXTURES, f"{name}.steer"), out)
        assert code == 0, err
        assert _written(out) == _written(os.path.join(FIXTURES, name))


def test_the_vectors_are_the_programs_closed_forms():
    from steerc.io.vectors import open_vector_file

    f = open_vector_file(os.path.join(FIXTURES, "vectors.safetensors"))
    for key, v in _vectors().items():
        assert f.read(key).tobytes() == v.tobytes()


def test_easysteers_gguf_reader_reads_the_layers_steerc_wrote(tmp_path):
    """issue 37: read as EasySteer's ``read_gguf_directions`` reads it (gguf.GGUFReader, ``direction.<layer>``,
    the layer ``int(name.split(".")[1])``): each layer's vector is the plan's, float32."""
    gguf = pytest.importorskip("gguf")
    plan = check_file(os.path.join(FIXTURES, "windows.steer"), facts=load_facts(MODEL)).plan
    out = str(tmp_path / "out")
    assert _compile(os.path.join(FIXTURES, "windows.steer"), out)[0] == 0
    spec = json.loads(open(os.path.join(out, "spec.json"), encoding="utf-8").read())
    expected = {(sp.site.layer, k.names[0]): np.asarray(k.op.bias.array, np.float32)
                for sp in plan.sites for k in sp.kernels}
    for vector in spec["vectors"]:
        reader = gguf.GGUFReader(os.path.join(out, vector["source"]))
        found = {int(t.name.split(".")[1]): np.array(t.data, copy=True) for t in reader.tensors
                 if t.name.startswith("direction.")}
        assert sorted(found) == vector["layers"]
        for layer, data in found.items():
            assert data.dtype == np.float32
            assert data.reshape(-1).tobytes() == expected[(layer, vector["name"])].tobytes()


# ------------------------------------------------------------------------------------------ refusals


REFUSED = {
    "gate": ("probe p {\n  at resid_post[0]\n  read cosine(v)\n  pool prompt.mean\n}\n"
             "intervention a {\n  at resid_post[1]\n  add v\n  when p > 0.1\n}\n", "gate"),
    "projection": ("intervention a {\n  at resid_post[1]\n  ablate v\n}\n", "`ablate`"),
    "scale": ("intervention a {\n  at resid_post[1]\n  scale 2\n}\n", "`scale`"),
    "site": ("intervention a {\n  at mlp_out[1]\n  add v\n}\n", "mlp_out"),
    "layer 0": ("intervention a {\n  at resid_post[0]\n  add v\n}\n", "direction.0"),
    "per-request param": ("param s = 1.0 per request\nintervention a {\n  at resid_post[1]\n  add s * v\n}\n",
                          "per request"),
    "schedule": ("intervention a {\n  at resid_post[1]\n  add decay(0.9) * v\n  tokens generated\n}\n",
                 "schedule"),
    "absolute positions": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens [0, 1]\n}\n", "positions"),
    "after": ('intervention a {\n  at resid_post[1]\n  add v\n  tokens after "Answer:"\n}\n', "after"),
    "two generation windows": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens generated[0:2], "
                               "generated[4:6]\n}\n", "two generation windows"),
    "two windows": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens prompt[0:2], prompt[-2:]\n}\n",
                    "two prompt windows"),
    "empty prompt window": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens prompt[2:1]\n}\n",
                            "prompt window EasySteer rejects"),
    "constraint": ('constrain choice ["yes", "no"]\nintervention a {\n  at resid_post[1]\n  add v\n}\n',
                   "constraint"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_easysteer_cannot_say_is_refused_before_writing(tmp_path, case):
    """issue 37: unsupported-by-target with the reason and a caret at the program's line, exit 1, no output
    folder."""
    body, words = REFUSED[case]
    v = ", ".join(["0.5"] * HIDDEN)
    prog = tmp_path / "p.steer"
    prog.write_text(f"steer 1\nvector v = [{v}]\n" + body)
    out = tmp_path / "out"
    code, stdout, err = _compile(str(prog), str(out))
    assert code == 1, err
    assert "unsupported-by-target" in err and words in err, err
    assert "the easysteer target cannot express" in err and "p.steer:" in err and "^" in err, err
    assert not out.exists() and stdout == ""


def test_a_refusal_leaves_an_earlier_export_as_it_was(tmp_path):
    """issue 37: a refused compile into a folder an earlier one wrote changes nothing there."""
    out = str(tmp_path / "out")
    assert _compile(os.path.join(FIXTURES, "stacked.steer"), out)[0] == 0
    before = _written(out)
    prog = tmp_path / "p.steer"
    prog.write_text("steer 1\nvector v = [" + ", ".join(["0.5"] * HIDDEN) + "]\n"
                    "intervention a {\n  at mlp_out[1]\n  add v\n}\n")
    assert _compile(str(prog), out)[0] == 1
    assert _written(out) == before


def test_the_table_and_the_registry_name_it():
    from steerc.formats import FORMATS
    from steerc.targets.registry import REGISTRY, selected

    assert FORMATS["easysteer"].export == ("easysteer", "steerc")
    assert selected("easysteer") is REGISTRY["easysteer"]
    caps = REGISTRY["easysteer"].capabilities
    assert caps.supports("op:add") and caps.supports("op:preserve-norm") and not caps.supports("op:ablate")
    assert not caps.supports("param:per-request") and not caps.supports("scope:after")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_easysteer_export.py --write  (rewrites tests/fixtures/easysteer)")
    write_golden()
