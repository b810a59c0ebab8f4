"""BrainPatch archives in and out without BrainPatch (issue 37): ``steerc import``, ``load("x.brainpatch")`` and
``--target brainpatch`` on archives this test writes itself (``steerc.io.brainpatch.archive_bytes``, which
tests/peers/test_brainpatch.py holds byte-identical to BrainPatch's ``save_patch``): the program's text, round
trips, every refusal of a malformed archive and of what BrainPatch cannot say, and malformed ZIPs fuzzed."""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_cli

from steerc.formats.brainpatch import cells, program
from steerc.io.brainpatch import ArchiveError, archive_bytes, full_manifest, read_archive, read_archive_bytes

HIDDEN, LAYERS = 8, 4
CONFIG = {"model_type": "llama", "num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": 2,
          "num_key_value_heads": 2, "intermediate_size": 16, "vocab_size": 32, "architectures": ["LlamaForCausalLM"],
          "torch_dtype": "float32", "_name_or_path": "org/tiny"}


def _vec(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(HIDDEN)).astype(np.float32)


def _manifest(**over) -> dict:
    m = {"name": "joy", "base_model": {"model_id": "org/tiny", "architecture": "LlamaForCausalLM",
                                       "hidden_size": HIDDEN, "num_layers": LAYERS, "torch_dtype": "float32"},
         "interventions": [{"layer": 1, "vector": "joy", "coefficient": 4.0}], "description": "cheer up"}
    m.update(over)
    return full_manifest(m)


def _archive(manifest=None, vectors=None, readme=None) -> bytes:
    vectors = vectors if vectors is not None else {"joy": ("F16", _vec(1)), "calm": ("F32", _vec(2))}
    return archive_bytes(manifest or _manifest(), vectors, readme)


def _write(folder, name: str, blob: bytes) -> str:
    path = os.path.join(str(folder), name)
    with open(path, "wb") as fh:
        fh.write(blob)
    return path


def _model(folder) -> str:
    path = os.path.join(str(folder), "model")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(CONFIG, fh)
    return path


def _zip(members: dict, modes: dict | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out.getvalue()


def _members(blob: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        return {i.filename: zf.read(i.filename) for i in zf.infolist()}


# ---------------------------------------------------------------- the program


def test_the_import_of_a_schedule_and_sites_is_its_segments(tmp_path):
    """issue 37: site all at a schedule is `prompt, generated[0:b]`, then steps; a step of 0 is left out;
    continuation starts at generated[0] (BrainPatch's index 0 covers the prompt and the first token fed back)."""
    m = _manifest(interventions=[{"layer": 1, "vector": "joy", "coefficient": 4.0},
                                 {"layer": 2, "vector": "calm", "coefficient": 1.0, "site": "continuation"},
                                 {"layer": 3, "vector": "calm", "coefficient": 2.0, "site": "prompt"}],
                  schedule={"0": 1.0, "5": 0.5, "10": 0.0}, default_strength=2.0, max_abs_strength=4.0)
    made = program(read_archive_bytes(_archive(m), "joy.brainpatch"), "joy")
    text = made.text
    assert "param strength = 2.0 in [-4.0, 4.0] per request" in text
    assert "  at resid_post[1]\n  add strength * 4.0 * joy\n  tokens prompt, generated[0:5]\n" in text
    assert "  at resid_post[1]\n  add strength * 2.0 * joy\n  tokens generated[5:10]\n" in text
    assert "  at resid_post[2]\n  add strength * calm\n  tokens generated[0:5]\n" in text
    assert "  at resid_post[3]\n  add strength * 2.0 * calm\n  tokens prompt\n" in text
    assert "generated[10:]" not in text and "# description: cheer up" in text
    assert list(made.files) == ["joy.safetensors"]


def test_several_vectors_at_one_layer_are_summed_in_float32_in_brainpatchs_order():
    """issue 37: the prompt cell of a layer reached by an all and a prompt intervention adds one vector, the
    float32 sum of the float32 products in the manifest's order."""
    m = _manifest(interventions=[{"layer": 1, "vector": "joy", "coefficient": 0.1},
                                 {"layer": 1, "vector": "calm", "coefficient": 3.0, "site": "prompt"}])
    patch = read_archive_bytes(_archive(m), "joy.brainpatch")
    found = cells(patch)
    assert [(c.prompt, c.start, c.end, len(c.terms)) for c in found] == [(True, None, None, 2), (False, 0, None, 1)]
    made = program(patch, "joy")
    stored = read_archive_bytes(_archive(m), "x").vectors  # the same vectors, read back as float32
    want = (stored["joy"].values * np.float32(0.1)).astype(np.float32) + \
        (stored["calm"].values * np.float32(3.0)).astype(np.float32)
    from steerc.io.vectors import open_vector_file

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bp-{os.getpid()}.safetensors")
    with open(path, "wb") as fh:
        fh.write(made.files["joy.safetensors"])
    try:
        got = open_vector_file(path).read("layer1_prompt.sum")
    finally:
        os.unlink(path)
    assert got.tobytes() == want.astype(np.float32).tobytes()
    assert "add strength * 0.10000000149011612 * joy" in made.text  # 0.1 as float32, exactly


def test_import_writes_a_formatted_checked_program_and_its_vectors(tmp_path):
    """issue 37: steerc import writes what steerc fmt would, checks it against --model, and the program runs
    through check with the vectors beside it."""
    archive = _write(tmp_path, "joy.brainpatch", _archive())
    out = str(tmp_path / "joy.steer")
    code, stdout, err = run_cli(["import", archive, "-o", out, "--model", _model(tmp_path)])
    assert code == 0, err
    assert stdout.split() == [out, str(tmp_path / "joy.safetensors")]
    assert run_cli(["fmt", "--check", out])[0] == 0
    code, _, err = run_cli(["check", out, "--model", _model(tmp_path)])
    assert code == 0, err
    assert "org/tiny" in open(out).read()


def test_import_refuses_to_replace_without_force_and_links_ever(tmp_path):
    """issue 37: user files are sacred: an existing OUT or vector file needs --force (its mode kept); a link is
    never replaced; a refusal writes nothing."""
    archive = _write(tmp_path, "joy.brainpatch", _archive())
    out = tmp_path / "joy.steer"
    (tmp_path / "joy.safetensors").write_bytes(b"mine")
    code, _, err = run_cli(["import", archive, "-o", str(out)])
    assert code == 2 and "joy.safetensors exists" in err and not out.exists()
    assert (tmp_path / "joy.safetensors").read_bytes() == b"mine"
    os.chmod(tmp_path / "joy.safetensors", 0o600)
    assert run_cli(["import", archive, "-o", str(out), "--force"])[0] == 0
    assert (os.stat(tmp_path / "joy.safetensors").st_mode & 0o777) == 0o600
    os.symlink(str(tmp_path / "elsewhere.steer"), str(tmp_path / "link.steer"))
    code, _, err = run_cli(["import", archive, "-o", str(tmp_path / "link.steer"), "--force"])
    assert code == 2 and "symbolic link" in err and not (tmp_path / "elsewhere.steer").exists()


def test_a_program_the_model_refutes_writes_nothing(tmp_path):
    """issue 37: checked against --model before anything is moved into place: a model with other sizes is
    model-mismatch, and no file is left behind (the temporary folder included)."""
    archive = _write(tmp_path, "joy.brainpatch", _archive(_manifest(
        base_model={"model_id": "org/tiny", "hidden_size": HIDDEN, "num_layers": 6})))
    code, _, err = run_cli(["import", archive, "-o", str(tmp_path / "joy.steer"), "--model", _model(tmp_path)])
    assert code == 1 and "model-mismatch" in err
    assert sorted(os.listdir(tmp_path)) == ["joy.brainpatch", "model"]


def test_load_reads_a_vector_from_an_archive(tmp_path):
    """issue 37: load("x.brainpatch", key=...) is a vector source: the archive's vector as float32."""
    from steerc.api import Options, check_source

    _write(tmp_path, "joy.brainpatch", _archive())
    text = 'steer 1\nvector v = load("joy.brainpatch", key="joy")\nintervention a {\n  at resid_post[1]\n  add v\n}\n'
    r = check_source(text, "p.steer", path=str(tmp_path / "p.steer"), options=Options())
    assert r.ok, r.render()
    assert r.values["v"].astype(np.float32).tobytes() == _vec(1).astype(np.float16).astype(np.float32).tobytes()
    r = check_source(text.replace('key="joy"', 'key="jo"'), "p.steer", path=str(tmp_path / "p.steer"),
                     options=Options())
    assert [d.code for d in r.errors] == ["missing-key"]


# ---------------------------------------------------------------- malformed archives


def _good_members() -> dict:
    return _members(_archive())


def _resum(members: dict) -> dict:
    import hashlib

    sums = {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != "checksums.json"}
    return {**members, "checksums.json": json.dumps(sums).encode()}


MALFORMED = {
    "not a zip": (lambda: b"hello", "not a readable ZIP archive"),
    "traversal": (lambda: _zip({**_good_members(), "../evil": b"x"}), "escapes the archive"),
    "absolute": (lambda: _zip({**_good_members(), "/etc/x": b"x"}), "absolute path"),
    "extra member": (lambda: _zip({**_good_members(), "run.py": b"x"}), "is not one a BrainPatch holds"),
    "folder": (lambda: _zip({**_good_members(), "dir/": b""}), "is a folder"),
    "link": (lambda: _zip(_good_members(), {"README.md": 0o120777, "manifest.json": 0o120777}), "symbolic link"),
    "bomb": (lambda: _zip({**_good_members(), "README.md": b"\0" * 5_000_000}), "ZIP bomb"),
    "no manifest": (lambda: _zip({k: v for k, v in _good_members().items() if k != "manifest.json"}),
                    "no `manifest.json`"),
    "checksum": (lambda: _zip({**_good_members(), "manifest.json": _good_members()["manifest.json"] + b" "}),
                 "does not match its checksum"),
    "manifest not json": (lambda: _zip(_resum({**_good_members(), "manifest.json": b"{"})), "not JSON"),
    "layer past the model": (lambda: _archive(_manifest(interventions=[{"layer": 9, "vector": "joy"}])),
                             "`layer` must be a whole number from 0 to 3"),
    "layer a float": (lambda: _archive(_manifest(interventions=[{"layer": 1.5, "vector": "joy"}])), "`layer`"),
    "unknown hook": (lambda: _archive(_manifest(interventions=[{"layer": 1, "vector": "joy", "hook": "mlp"}])),
                     "residual_post"),
    "unknown site": (lambda: _archive(_manifest(interventions=[{"layer": 1, "vector": "joy", "site": "x"}])),
                     "`site`"),
    "missing vector": (lambda: _archive(_manifest(interventions=[{"layer": 1, "vector": "nope"}])),
                       "vector `nope` is not in vectors.safetensors"),
    "short vector": (lambda: _archive(vectors={"joy": ("F32", np.ones(3, np.float32))}), "not base_model.hidden_size"),
    "nan": (lambda: _archive(vectors={"joy": ("F32", np.full(HIDDEN, np.nan, np.float32))}), "NaN"),
    "huge coefficient": (lambda: _archive(_manifest(interventions=[{"layer": 1, "vector": "joy",
                                                                    "coefficient": 2000.0}])), "1024"),
    "unknown key": (lambda: _archive({**_manifest(), "exec": "rm -rf /"}), "does not define: `exec`"),
    "bad schedule": (lambda: _archive(_manifest(schedule={"-1": 1.0})), "schedule key"),
    "bad name": (lambda: _archive(_manifest(name="Joy Patch")), "`name`"),
    "default past max": (lambda: _archive(_manifest(default_strength=9.0)), "exceeds max_abs_strength"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_every_malformed_archive_is_a_diagnostic_and_writes_nothing(tmp_path, case):
    """issue 37: each is invalid-foreign-file with a caret (under the manifest's field, or the file on the
    command line), exit 1, nothing written."""
    make, words = MALFORMED[case]
    archive = _write(tmp_path, "x.brainpatch", make())
    code, out, err = run_cli(["import", archive, "-o", str(tmp_path / "x.steer")])
    assert code == 1, err
    assert "error[invalid-foreign-file]" in err and words in err, err
    assert "^" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["x.brainpatch"] and out == ""


def test_a_manifest_fields_caret_is_under_it(tmp_path):
    """issue 37: the diagnostic points into manifest.json at the field at fault."""
    archive = _write(tmp_path, "x.brainpatch", _archive(_manifest(interventions=[{"layer": 9, "vector": "joy"}])))
    _, _, err = run_cli(["import", archive, "-o", str(tmp_path / "x.steer")])
    assert "x.brainpatch:manifest.json:" in err and '"layer": 9' in err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_archives_are_read_or_refused_never_a_traceback(data):
    """issue 37: bytes of a good archive flipped, cut or extended, and ZIPs of arbitrary members: the reader
    returns a patch or raises ArchiveError, nothing else, and the importer likewise."""
    blob = bytearray(_archive())
    how = data.draw(st.sampled_from(["flip", "cut", "members"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
    elif how == "cut":
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    else:
        names = st.sampled_from(["manifest.json", "vectors.safetensors", "checksums.json", "README.md", "x", "a/../b"])
        members = data.draw(st.dictionaries(names, st.binary(max_size=200), max_size=5))
        blob = bytearray(_zip(_resum(members) if data.draw(st.booleans()) else members))
    try:
        patch = read_archive_bytes(bytes(blob), "f.brainpatch")
    except ArchiveError as exc:
        assert exc.code == "invalid-foreign-file" and exc.message
        return
    program(patch, "f")  # a readable archive always makes a program


# ---------------------------------------------------------------- export


def _compile(tmp_path, text: str):
    prog = tmp_path / "joy.steer"
    prog.write_text(text)
    out = tmp_path / "out"
    code, stdout, err = run_cli(["compile", str(prog), "--model", _model(tmp_path), "--target", "brainpatch",
                                 "-o", str(out)])
    return code, out, err


def test_import_then_export_means_the_same_and_export_then_import_is_stable(tmp_path):
    """issue 37: an archive imported and exported again has the same manifest but for the vectors' names and
    coefficients folded in (the export stores coefficient vectors), and the same bytes when exported twice."""
    from steerc.io.brainpatch import read_archive

    m = _manifest(interventions=[{"layer": 1, "vector": "joy", "coefficient": 4.0},
                                 {"layer": 2, "vector": "calm", "coefficient": 1.0, "site": "continuation"}],
                  schedule={"0": 1.0, "5": 0.5, "10": 0.0}, default_strength=2.0, max_abs_strength=4.0)
    archive = _write(tmp_path, "joy.brainpatch", _archive(m))
    assert run_cli(["import", archive, "-o", str(tmp_path / "p.steer")])[0] == 0
    code, out, err = _compile(tmp_path, (tmp_path / "p.steer").read_text())
    assert code == 0, err
    back = read_archive(str(out / "joy.brainpatch"))
    assert back.schedule == ((0, 1.0), (5, 0.5), (10, 0.0))
    assert (back.default_strength, back.max_abs_strength) == (2.0, 4.0)
    assert [(iv.layer, iv.site, iv.coefficient) for iv in back.interventions] == [(1, "all", 1.0),
                                                                                   (2, "continuation", 1.0)]
    original = read_archive(archive)
    first = back.vectors[back.interventions[0].vector].values
    assert first.tobytes() == (original.vectors["joy"].values * np.float32(4.0)).astype(np.float32).tobytes()
    assert back.base_model["model_id"] == "org/tiny" and back.name == "joy"
    again = tmp_path / "again"
    again.mkdir()
    (again / "joy.steer").write_text((tmp_path / "p.steer").read_text())
    (again / "p.safetensors").write_bytes((tmp_path / "p.safetensors").read_bytes())
    code, out2, err = _compile(again, (again / "joy.steer").read_text())
    assert code == 0, err
    assert (out2 / "joy.brainpatch").read_bytes() == (out / "joy.brainpatch").read_bytes()


REFUSED = {
    "scale": ("intervention a {\n  at resid_post[1]\n  scale 2\n}\n", "`scale`"),
    "gate": ('probe p {\n  at resid_post[0]\n  read cosine(v)\n  pool prompt.mean\n}\n'
             "intervention a {\n  at resid_post[1]\n  add v\n  when p > 0.1\n}\n", "gate"),
    "site": ("intervention a {\n  at mlp_out[1]\n  add v\n}\n", "mlp_out"),
    "prompt slice": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens prompt[-1:]\n}\n", "prompt"),
    "steerc schedule": ("intervention a {\n  at resid_post[1]\n  add decay(0.9) * v\n  tokens generated\n}\n",
                        "schedule"),
    "two params": ("param s = 1 per request\nparam t = 1 per request\nintervention a {\n  at resid_post[1]\n"
                   "  add s * v\n}\nintervention b {\n  at resid_post[2]\n  add t * v\n}\n", "two per-request"),
    "unbound beside bound": ("param s = 1 per request\nintervention a {\n  at resid_post[1]\n  add s * v\n}\n"
                             "intervention b {\n  at resid_post[2]\n  add v\n}\n", "without the strength"),
    "asymmetric range": ("param s = 1 in [0, 4] per request\nintervention a {\n  at resid_post[1]\n  add s * v\n}\n",
                         "[-m, m]"),
    "segments not one vector": ("intervention a {\n  at resid_post[1]\n  add v\n  tokens generated[0:3]\n}\n"
                                "intervention b {\n  at resid_post[1]\n  add w\n  tokens generated[3:]\n}\n",
                                "not one vector times a number"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_brainpatch_cannot_say_is_refused_before_writing(tmp_path, case):
    """issue 37: unsupported-by-target with the reason, at the program's line, and no output folder."""
    body, words = REFUSED[case]
    text = "steer 1\nvector v = [" + ", ".join(["1.0"] * HIDDEN) + "]\nvector w = [" + \
        ", ".join(["1.0", "2.0"] * (HIDDEN // 2)) + "]\n" + body
    code, out, err = _compile(tmp_path, text)
    assert code == 1, err
    assert "unsupported-by-target" in err and words in err, err
    assert not out.exists()


def test_the_export_picks_the_narrowest_exact_dtype(tmp_path):
    """issue 37: vectors exact in float16 are stored F16 (BrainPatch's default), others F32."""
    ones = "[" + ", ".join(["0.5"] * HIDDEN) + "]"
    code, out, err = _compile(tmp_path, f"steer 1\nintervention a {{\n  at resid_post[1]\n  add {ones}\n}}\n")
    assert code == 0, err
    patch = read_archive(str(out / "joy.brainpatch"))
    assert [v.dtype for v in patch.vectors.values()] == ["F16"]
    assert (patch.default_strength, patch.max_abs_strength) == (1.0, 8.0)
    odd = "[" + ", ".join(["0.1"] * HIDDEN) + "]"
    (tmp_path / "b").mkdir()
    code, out, err = _compile(tmp_path / "b", f"steer 1\nintervention a {{\n  at resid_post[1]\n  add {odd}\n}}\n")
    assert code == 0, err
    assert [v.dtype for v in read_archive(str(out / "joy.brainpatch")).vectors.values()] == ["F32"]
