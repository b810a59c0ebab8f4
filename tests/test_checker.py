"""The check passes, one behaviour at a time, on small inline programs.

Programs that load vectors are written into a temporary project (a folder
holding ``steer.toml``) next to the vector files the test writes.
"""

from __future__ import annotations

import json
import os
import pickle
import struct

import numpy as np
import pytest
from support import needs_constraints

from steerc.api import Options, check_source
from steerc.ir.values import PerLayer

# ------------------------------------------------------------------ helpers

V4 = "vector v = [1.0, 0.0, 0.0, 0.0]\nvector u = [0.0, 1.0, 0.0, 0.0]\n"


def lit(width: int, hot: int = 0, value: float = 1.0) -> str:
    """A vector literal of ``width`` with ``value`` at index ``hot``."""
    return "[" + ", ".join(str(value) if i == hot else "0.0" for i in range(width)) + "]"


V64 = f"vector v = {lit(64)}\nvector u = {lit(64, 1)}\n"


def check(text: str, project=None, *, facts=None, name: str = "prog.steer", root=None, overrides=None):
    """Check ``text``; with ``project`` (a folder) the program lives there as ``name``."""
    path = None
    if project is not None:
        path = os.path.join(str(project), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    options = Options(root=str(root) if root else None, overrides=dict(overrides or {}))
    return check_source(text, name, path=path, options=options, facts=facts)


def codes(result, severity: str | None = None) -> list[tuple[str, int | None]]:
    return [(d.code, d.span.line if d.span else None) for d in result.diagnostics
            if severity is None or d.severity == severity]


def errors(result) -> list[tuple[str, int | None]]:
    return codes(result, "error")


def one(result, code: str):
    found = [d for d in result.diagnostics if d.code == code]
    assert len(found) == 1, (code, [(d.code, d.message) for d in result.diagnostics])
    return found[0]


def clean(result) -> None:
    assert not result.errors, [(d.code, d.span and d.span.line, d.message) for d in result.errors]


def iv_block(site: str, op: str, *lines: str, name: str = "x") -> str:
    body = "".join(f"  {line}\n" for line in lines)
    return f"intervention {name} {{\n  at {site}\n  {op}\n{body}}}\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "steer.toml").write_text("")
    return tmp_path


def write_safetensors(path, tensors: dict) -> None:
    """Write a .safetensors file by hand: ``{name: (dtype, shape, raw bytes)}``."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    blob = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob + b"".join(blobs))


def f32(values) -> tuple[str, tuple, bytes]:
    arr = np.asarray(values, dtype="<f4")
    return ("F32", arr.shape, arr.tobytes())


def folded(result, index: int = 0, vector: int = 0):
    """The first folded operand of intervention ``index``."""
    assert result.checked is not None
    return result.checked.interventions[index].op.vectors[vector]


class Boom:
    """Unpickling this runs code: creates the file named by ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


# -------------------------------------------------------------------- names


def test_undefined_name_with_did_you_mean():
    r = check("steer 1\n" + V4 + iv_block("resid_post[1]", "add 2.0 * vv"))
    d = one(r, "undefined-name")
    assert d.span.as_tuple() == (6, 13, 6, 15)
    assert d.help == "did you mean `v`?" or d.help == "did you mean `u`?"


def test_undefined_name_far_from_everything_suggests_declaring_it():
    d = one(check("steer 1\n" + V4 + iv_block("resid_post[1]", "add zzzqqq")), "undefined-name")
    assert "zzzqqq" in d.message and "declare" in d.help


def test_unknown_function_and_pool_suggest():
    r = check("steer 1\n" + V4 + "vector w = normalise(v)\n")
    assert one(r, "undefined-name").help == "did you mean `normalize`?"
    r = check("steer 1\n" + V4 + "probe p {\n  at resid_pre[0]\n  read norm\n  pool prompt.mena\n}\n")
    d = one(r, "undefined-name")
    assert d.span.line == 7 and d.help == "did you mean `prompt.mean`?"


def test_use_before_declaration_has_a_note():
    r = check("steer 1\nparam a = b + 1\nparam b = 2\n")
    d = one(r, "undefined-name")
    assert d.span.line == 2 and "before it is declared" in d.message
    (note,) = d.notes
    assert note.span.line == 3 and note.message == "declared here"


def test_self_reference():
    d = one(check("steer 1\nvector w = 2 * w\n"), "undefined-name")
    assert "itself" in d.message


@pytest.mark.parametrize(
    "first, second",
    [
        ("param g = 1", "param g = 2"),
        ("param g = 1", "vector g = [1.0]"),
        ("vector g = [1.0]", "probe g {\n  at resid_pre[0]\n  read norm\n  pool token\n}"),
        ("probe g {\n  at resid_pre[0]\n  read norm\n  pool token\n}",
         "intervention g {\n  at resid_pre[0]\n  scale 2\n}"),
    ],
)
def test_duplicate_name_at_the_second_declaration(first, second):
    text = f"steer 1\n{first}\n{second}\n"
    r = check(text)
    d = one(r, "duplicate-name")
    second_line = 2 + first.count("\n") + 1
    assert d.span.line == second_line
    assert d.notes[0].span.line == 2 and "first declared here" in d.notes[0].message


# -------------------------------------------------------------------- types


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("vector w = 1 + v", 4, "scalar and a vector"),
        ("vector w = v - 1", 4, "scalar and a vector"),
        ("vector w = v * u", 4, "multiplied by a number"),
        ("vector w = 2 / v", 4, "divide by a vector"),
        ("param p = v", 4, "expected a scalar"),
        ("param p = -v * 2", 4, "expected a scalar"),
        ("param p = normalize(v)", 4, "expected a scalar"),
        ("vector w = 2.0", 4, "expected a vector"),
        ("vector w = [1.0, v]", 4, "expected a scalar"),
        ("vector w = normalize(v, u)", 4, "exactly one vector"),
        ('vector w = load(1)', 4, "must be a string"),
        ('vector w = load("a.npy", keys="x")', 4, "no argument `keys`"),
        ('vector w = load("a.npy", per_layer="yes")', 4, "must be a boolean"),
        ('vector w = load("a.npy", "b.npy")', 4, "one path"),
    ],
)
def test_type_errors_in_declarations(text, line, fragment):
    r = check("steer 1\n" + V4 + text + "\n")
    assert ("type-error", line) in errors(r)
    assert any(fragment in d.message for d in r.errors), [d.message for d in r.errors]


@pytest.mark.parametrize(
    "op, fragment",
    [
        ("clamp v to v", "expected a scalar"),
        ("clamp 2 to 1", "expected a vector"),
        ("add 2", "expected a vector"),
        ("set 1 + 2", "expected a vector"),
        ("ablate v, 3", "expected a vector"),
        ("rotate in (v, 1) to 30deg", "expected a vector"),
        ("rotate in (v, u) to v", "expected a scalar"),
        ("scale v * u", "multiplied by a number"),
        ("add v + 1", "scalar and a vector"),
    ],
)
def test_type_errors_in_operations(op, fragment):
    r = check("steer 1\n" + V4 + iv_block("resid_pre[0]", op))
    assert ("type-error", 6) in errors(r), r.render()
    assert any(fragment in d.message for d in r.errors)


def test_clamp_to_a_vector_points_at_the_value():
    d = one(check("steer 1\n" + V4 + iv_block("resid_pre[0]", "clamp v to u")), "type-error")
    assert d.span.as_tuple() == (6, 14, 6, 15)
    assert d.help and "number" in d.help


PROBE = "probe p {\n  at resid_pre[0]\n  read norm\n  pool token\n}\n"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("param q = p + 1", "arithmetic"),
        ("param q = -p", "compared in `when`"),
        ("vector w = p * v", "arithmetic"),
    ],
)
def test_probe_in_arithmetic(text, fragment):
    r = check("steer 1\n" + V4 + PROBE + text + "\n")
    d = one(r, "type-error")
    assert d.span.line == 9 and fragment in d.message


@pytest.mark.parametrize(
    "gate, fragment",
    [
        ("1 < 2", "compares a probe with a number"),
        ("p > p", "not with another probe"),
        ("p > v", "not with a vector"),
        ("p + 1 > 2", "arithmetic"),
    ],
)
def test_type_errors_in_gates(gate, fragment):
    r = check("steer 1\n" + V4 + PROBE + iv_block("resid_post[0]", "add v", f"when {gate}"))
    d = one(r, "type-error")
    assert d.span.line == 12 and fragment in d.message


def test_an_intervention_is_not_a_value():
    r = check("steer 1\n" + V4 + iv_block("resid_pre[0]", "scale 2", name="a")
              + iv_block("resid_pre[1]", "add a", name="b"))
    assert "intervention, not a value" in one(r, "type-error").message


def test_a_gate_with_the_probe_on_the_right_is_flipped():
    r = check("steer 1\n" + V4 + PROBE + iv_block("resid_post[0]", "add v", "when 0.5 < p and not p >= 2"))
    clean(r)
    gate = r.checked.interventions[0].gate
    first, second = gate.parts
    assert (first.probe, first.op, first.threshold) == ("p", ">", 0.5)
    assert (second.operand.probe, second.operand.op, second.operand.threshold) == ("p", ">=", 2.0)


# -------------------------------------------------------------------- sites


def test_unknown_site_with_suggestion():
    d = one(check("steer 1\n" + V4 + iv_block("resid_prex[1]", "add v")), "unknown-site")
    assert d.span.as_tuple() == (5, 6, 5, 16) and d.help == "did you mean `resid_pre`?"
    d = one(check("steer 1\n" + V4 + iv_block("attention[1]", "add v")), "unknown-site")
    assert "resid_pre" in d.help and "head" in d.help


@pytest.mark.parametrize("site", ["head[1]", "head[1, 2, 3]"])
def test_head_takes_two_axes(site):
    d = one(check("steer 1\n" + iv_block(site, "scale 0")), "type-error")
    assert d.span.line == 3 and "layer axis and a head axis" in d.message


def test_groups_only_on_head_axes():
    d = one(check("steer 1\n" + iv_block("resid_pre[(1, 2)]", "scale 0")), "type-error")
    assert "parentheses" in d.message
    clean(check("steer 1\n" + iv_block("head[(1, 3), (0:2, 3)]", "scale 0")))


def test_percent_over_100():
    d = one(check("steer 1\n" + iv_block("resid_pre[150%]", "scale 0")), "layer-out-of-range")
    assert d.span.as_tuple() == (3, 16, 3, 20) and "150%" in d.message
    d = one(check("steer 1\n" + iv_block("head[0, 10%:101%]", "scale 0")), "head-out-of-range")
    assert d.span.line == 3
    clean(check("steer 1\n" + iv_block("resid_pre[100%]", "scale 0")))


def test_a_probe_reads_one_site():
    r = check("steer 1\nprobe p {\n  at resid_pre[0:2]\n  read norm\n  pool token\n}\n")
    assert ("type-error", 3) in errors(r)


@pytest.mark.parametrize("site", ["resid_prex[0]", "head[1]", "resid_pre[(1, 2)]"])
def test_a_probe_with_a_bad_site_does_not_crash(site, tiny_facts):
    text = ("steer 1\n" f"probe p {{\n  at {site}\n  read norm\n  pool token\n}}\n"
            + iv_block("resid_post[1]", "scale 2", "when p > 1"))
    for facts in (None, tiny_facts("tiny-llama")):
        r = check(text, facts=facts)  # raised KeyError / IndexError / AttributeError
        assert r.errors and all(d.span.line == 3 for d in r.errors)


# ------------------------------------------------------------ block shapes


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("intervention x {\n  add v\n}", 4, "`at` line"),
        ("intervention x {\n  at resid_pre[0]\n}", 4, "operation"),
        ("probe x {\n  read norm\n  pool token\n}", 4, "`at` line"),
        ("probe x {\n  at resid_pre[0]\n  pool token\n}", 4, "`read` line"),
        ("probe x {\n  at resid_pre[0]\n  read norm\n}", 4, "`pool` line"),
    ],
)
def test_missing_field(text, line, fragment):
    r = check("steer 1\n" + V4 + text + "\n")
    d = one(r, "missing-field")
    assert d.span.line == line and fragment in d.message and d.help


def test_empty_blocks_miss_every_line():
    r = check("steer 1\nprobe p {}\n")
    assert [c for c in errors(r)] == [("missing-field", 2)] * 3


@pytest.mark.parametrize(
    "lines, dup_line",
    [
        (["at resid_pre[0]", "add v", "at resid_pre[1]"], 7),
        (["at resid_pre[0]", "add v", "scale 2"], 7),
        (["at resid_pre[0]", "add v", "tokens all", "tokens prompt"], 8),
        (["at resid_pre[0]", "add v", "preserve norm", "preserve norm"], 8),
    ],
)
def test_duplicate_block_lines(lines, dup_line):
    body = "".join(f"  {line}\n" for line in lines)
    r = check("steer 1\n" + V4 + f"intervention x {{\n{body}}}\n")
    d = one(r, "duplicate-field")
    assert d.span.line == dup_line
    assert d.notes and d.notes[0].span.line < dup_line


def test_multiple_constraints_at_the_second():
    needs_constraints()
    r = check('steer 1\nconstrain choice ["a", "b"]\nconstrain regex "[a-z]+"\nconstrain regex "x"\n')
    found = [c for c in errors(r) if c[0] == "multiple-constraints"]
    assert found == [("multiple-constraints", 3), ("multiple-constraints", 4)]
    assert all(d.notes[0].span.line == 2 for d in r.errors if d.code == "multiple-constraints")


def test_model_block_fields():
    r = check('steer 1\nmodel {\n  layrs = 4\n  family = 3\n  heads = 0\n  hidden = 64\n  hidden = 64\n}\n')
    assert errors(r) == [("unknown-field", 3), ("type-error", 4), ("type-error", 5), ("duplicate-field", 7)]
    assert one(r, "unknown-field").help == "did you mean `layers`?"


def test_a_second_model_block():
    r = check('steer 1\nmodel {\n  layers = 4\n}\nmodel {\n  layers = 5\n}\n')
    assert errors(r) == [("duplicate-field", 5)]


def test_unsupported_version_stops():
    r = check("steer 3\nparam x = nope\n")
    assert errors(r) == [("unsupported-version", 1)]


# ----------------------------------------------------------------- vectors


def test_safetensors_keys_are_checked_from_the_header(project, monkeypatch):
    write_safetensors(project / "t.safetensors", {"joy": f32(np.ones(4)), "bank.0": f32(np.ones(4))})
    from steerc.io import vectors as vectorio

    def no_read(self, name):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(vectorio.VectorFile, "read", no_read)
    line = 'vector v = load("t.safetensors", key="jo")'
    r = check(f"steer 1\n{line}\n", project)
    d = one(r, "missing-key")
    at = line.index('"jo"') + 1
    assert d.span.as_tuple() == (2, at, 2, at + 4) and d.help == "did you mean `joy`?"
    r = check('steer 1\nvector v = load("t.safetensors")\n', project)
    assert "say which with `key=`" in one(r, "missing-key").message
    r = check('steer 1\nvector v = load("t.safetensors", key="nope", per_layer=true)\n', project)
    assert one(r, "missing-key").span.line == 2


def test_safetensors_values(project):
    x = np.array([1.5, -2.0, 0.25, 3.0], dtype=np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype("<u2").tobytes()
    write_safetensors(project / "t.safetensors", {
        "b": ("BF16", (4,), bf16),
        "h": ("F16", (4,), x.astype("<f2").tobytes()),
        "d": ("F64", (4,), x.astype("<f8").tobytes()),
        "i": ("I32", (4,), np.arange(4, dtype="<i4").tobytes()),
        "inf": f32([np.inf, 0, 0, 0]),
        "nan": f32([np.nan, 0, 0, 0]),
        "m": f32(np.ones((2, 4))),
    })
    for key in ("b", "h", "d"):
        text = f'steer 1\nvector v = load("t.safetensors", key="{key}")\n' + iv_block("resid_pre[0]", "add v")
        r = check(text, project)
        clean(r)
        assert np.array_equal(folded(r), x.astype(np.float64)), key
    for key in ("i", "inf", "nan"):
        text = f'steer 1\nvector v = load("t.safetensors", key="{key}")\n' + iv_block("resid_pre[0]", "add v")
        r = check(text, project)
        assert errors(r) == [("invalid-vector-file", 2)], key
    r = check('steer 1\nvector v = load("t.safetensors", key="m")\n', project)
    assert errors(r) == [("shape-mismatch", 2)] and "per_layer=true" in one(r, "shape-mismatch").help


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{}", struct.pack("<Q", 2) + b"[]",
     struct.pack("<Q", 4) + b"{]}x", struct.pack("<Q", 2**40) + b"{}"],
)
def test_corrupt_safetensors(project, raw):
    (project / "bad.safetensors").write_bytes(raw)
    r = check('steer 1\nvector v = load("bad.safetensors", key="a")\n', project)
    assert errors(r) == [("invalid-vector-file", 2)]


def test_safetensors_entry_outside_the_data(project):
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 160]}}).encode()
    (project / "bad.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    r = check('steer 1\nvector v = load("bad.safetensors", key="a")\n', project)
    assert errors(r) == [("invalid-vector-file", 2)]


def test_npy_is_read_without_pickle(project):
    marker = project / "unpickled"
    np.save(project / "obj.npy", np.array([Boom(str(marker))], dtype=object), allow_pickle=True)
    r = check('steer 1\nvector v = load("obj.npy")\n', project)
    d = one(r, "invalid-vector-file")
    assert d.span.line == 2 and "pickle" in d.message
    assert not marker.exists()


def test_npy_values_and_dtypes(project):
    np.save(project / "h.npy", np.array([1.0, 2.0, 0.5, 0.0], dtype=np.float16))
    np.save(project / "i.npy", np.arange(4))
    np.save(project / "nan.npy", np.array([1.0, np.nan, 0.0, 0.0]))
    r = check('steer 1\nvector v = load("h.npy")\n' + iv_block("resid_pre[0]", "add v"), project)
    clean(r)
    assert np.array_equal(folded(r), [1.0, 2.0, 0.5, 0.0])
    assert errors(check('steer 1\nvector v = load("i.npy")\n', project)) == [("invalid-vector-file", 2)]
    assert errors(check('steer 1\nvector v = load("nan.npy")\n', project)) == [("invalid-vector-file", 2)]
    assert errors(check('steer 1\nvector v = load("h.npy", key="x")\n', project)) == [("missing-key", 2)]


def test_truncated_npy_header_is_an_invalid_vector_file(project):
    np.save(project / "ok.npy", np.arange(4, dtype=np.float32))
    raw = (project / "ok.npy").read_bytes()
    brace = raw.index(b"}")
    (project / "bad.npy").write_bytes(raw[:brace] + b" " + raw[brace + 1:])
    r = check('steer 1\nvector v = load("bad.npy")\n', project)  # raised TokenError
    assert errors(r) == [("invalid-vector-file", 2)]


@pytest.mark.parametrize("shape, nbytes", [([True, 4], 16), ([2**62, 2**62], 0), ([2**62, 4], 0), ([2**64], 0)])
def test_crafted_safetensors_shapes_are_invalid_vector_files(project, shape, nbytes):
    # 2**62 * 4 elements of 4 bytes wrap around to 0 bytes in int64 arithmetic
    header = json.dumps({"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    (project / "bad.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * nbytes)
    per_layer = "true" if len(shape) == 2 else "false"
    r = check(f'steer 1\nvector v = load("bad.safetensors", key="a", per_layer={per_layer})\n'
              + iv_block("resid_pre[0]", "add v"), project)  # raised TypeError / ValueError / OverflowError
    assert errors(r) == [("invalid-vector-file", 2)]


@pytest.mark.parametrize("stmt", ['vector v = load("a\\u0000.npy")', 'constrain regex from "\\u0000"'])
def test_a_nul_character_in_a_path_is_a_diagnostic(project, stmt):
    if stmt.startswith("constrain"):
        needs_constraints()
    r = check(f"steer 1\n{stmt}\n", project)  # raised ValueError
    assert [c[1] for c in errors(r)] == [2]


def test_unknown_vector_format(project):
    (project / "v.txt").write_text("1 2 3")
    r = check('steer 1\nvector v = load("v.txt")\n', project)
    assert errors(r) == [("invalid-vector-file", 2)]


def test_pt_tensors_load_through_weights_only(project):
    torch = pytest.importorskip("torch")
    torch.save(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16), project / "t.pt")
    torch.save({"joy": torch.ones(4), "bank": torch.ones(4, 4)}, project / "d.pth")
    r = check('steer 1\nvector v = load("t.pt")\nvector w = load("d.pth", key="joy")\n'
              + iv_block("resid_pre[0]", "add v + w"), project)
    clean(r)
    assert np.array_equal(folded(r), [2.0, 3.0, 4.0, 5.0])


def test_pt_pickled_objects_are_refused(project):
    pytest.importorskip("torch")
    marker = project / "unpickled"
    with open(project / "evil.pt", "wb") as fh:
        pickle.dump({"joy": Boom(str(marker))}, fh, protocol=2)
    r = check('steer 1\nvector v = load("evil.pt", key="joy")\n', project)
    assert errors(r) == [("invalid-vector-file", 2)]
    assert not marker.exists()


def test_per_layer_banks(project):
    bank = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    np.save(project / "bank.npy", bank)
    write_safetensors(project / "t.safetensors", {"b.0": f32(bank[0]), "b.2": f32(bank[2]), "m": f32(bank)})
    r = check('steer 1\nvector a = load("bank.npy", per_layer=true)\n'
              'vector b = load("t.safetensors", key="b", per_layer=true)\n'
              'vector m = load("t.safetensors", key="m", per_layer=true)\n'
              + iv_block("resid_pre[0]", "add a + b + m"), project)
    clean(r)
    value = folded(r)
    assert isinstance(value, PerLayer) and sorted(value.rows) == [0, 2]
    assert np.array_equal(value.rows[0], 3 * bank[0].astype(np.float64))
    assert np.array_equal(value.rows[2], 3 * bank[2].astype(np.float64))


def test_bank_rows_known_without_a_model(project):
    write_safetensors(project / "t.safetensors", {"b.0": f32(np.ones(4)), "b.2": f32(np.ones(4))})
    np.save(project / "short.npy", np.ones((2, 4), dtype=np.float32))
    bank = 'steer 1\nvector b = load("t.safetensors", key="b", per_layer=true)\n'
    r = check(bank + iv_block("resid_pre[1]", "add b"), project)
    assert errors(r) == [("missing-key", 5)]
    r = check('steer 1\nvector b = load("short.npy", per_layer=true)\n' + iv_block("resid_pre[0:3]", "add b"), project)
    assert errors(r) == [("shape-mismatch", 5)]


def test_path_escape(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    np.save(outside / "o.npy", np.ones(4, dtype=np.float32))
    os.symlink(outside / "o.npy", project / "link.npy")
    os.symlink(outside, project / "linkdir")
    up = os.path.relpath(outside / "o.npy", project)
    text = (f'steer 1\nvector a = load("{up}")\nvector b = load("link.npy")\n'
            'vector c = load("linkdir/o.npy")\nvector d = load("/etc/hostname")\n')
    r = check(text, project)
    assert errors(r) == [("path-escape", 2), ("path-escape", 3), ("path-escape", 4), ("path-escape", 5)]
    assert "leaves the project root" in r.errors[0].message


def test_root_override(project, tmp_path_factory):
    top = tmp_path_factory.mktemp("top")
    np.save(top / "o.npy", np.ones(4, dtype=np.float32))
    sub = top / "sub"
    sub.mkdir()
    text = 'steer 1\nvector a = load("../o.npy")\n' + iv_block("resid_pre[0]", "add a")
    assert errors(check(text, sub)) == [("path-escape", 2)]  # root: the file's own folder
    clean(check(text, sub, root=top))
    assert errors(check(text, sub, root=sub)) == [("path-escape", 2)]


def test_steer_toml_marks_the_root(tmp_path):
    (tmp_path / "steer.toml").write_text("")
    np.save(tmp_path / "o.npy", np.ones(4, dtype=np.float32))
    text = 'steer 1\nvector a = load("../../o.npy")\n' + iv_block("resid_pre[0]", "add a")
    clean(check(text, tmp_path / "a" / "b"))
    (tmp_path / "a" / "steer.toml").write_text("")
    assert errors(check(text, tmp_path / "a" / "b")) == [("path-escape", 2)]


def test_file_not_found(project):
    d = one(check('steer 1\nvector v = load("nope.npy")\n', project), "file-not-found")
    assert d.span.as_tuple() == (2, 17, 2, 27)


# ------------------------------------------------------------------ values


def test_set_overrides_change_folded_values():
    text = "steer 1\nparam s = 1.5\nparam t = s * 2\n" + V4 + iv_block("resid_pre[0]", "add t * v")
    r = check(text)
    clean(r)
    assert r.checked.params == {"s": 1.5, "t": 3.0}
    assert np.array_equal(folded(r), [3.0, 0, 0, 0])
    r = check(text, overrides={"s": 4})
    clean(r)
    assert r.checked.params == {"s": 4.0, "t": 8.0}
    assert np.array_equal(folded(r), [8.0, 0, 0, 0])
    r = check(text, overrides={"t": -1})
    assert r.checked.params["t"] == -1.0 and np.array_equal(folded(r), [-1.0, 0, 0, 0])


def test_unknown_set_name():
    r = check("steer 1\nparam strength = 1\n", overrides={"strenght": 2})
    d = one(r, "undefined-name")
    assert d.span is None and "strenght" in d.message and d.help == "did you mean `strength`?"


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("vector z = normalize(0 * v)", 4, "normalize a zero vector"),
        ("vector z = normalize([0.0, 0.0])", 4, "normalize a zero vector"),
        ("param z = 1 / (2 - 2)", 4, "division by zero"),
        ("vector z = v / 0", 4, "division by zero"),
        ("param z = 1e300 * 1e300", 4, "not finite"),
    ],
)
def test_invalid_values(text, line, fragment):
    d = one(check("steer 1\n" + V4 + text + "\n"), "invalid-value")
    assert d.span.line == line and fragment in d.message


@pytest.mark.parametrize(
    "op",
    ["rotate in (v, 2 * v) to 30deg", "rotate in (v, 0 * u) by 1", "rotate in (v, -v) by 1", "ablate v, 0 * u",
     "clamp 0 * v to 1", "rotate in (0 * v, u) to 1"],
)
def test_degenerate_directions_are_invalid_values(op):
    d = one(check("steer 1\n" + V4 + iv_block("resid_pre[0]", op)), "invalid-value")
    assert d.span.line == 6


@pytest.mark.parametrize("scope", ["[-1]", "generated[-1:]", "after \"\""])
def test_impossible_scopes(scope):
    d = one(check("steer 1\n" + V4 + iv_block("resid_pre[0]", "add v", f"tokens {scope}")), "invalid-value")
    assert d.span.line == 7


def test_folding_arithmetic():
    r = check("steer 1\nparam a = -(1 + 2) * 3 / 4 - 5\n"
              "vector w = normalize([3.0, 4.0, 0.0, 0.0]) * 10 - [0, 0, 1, 0] / 2\n"
              + iv_block("resid_pre[0]", "rotate in (w, [0, 0, 0, 1]) to 90deg"))
    clean(r)
    assert r.checked.params["a"] == -(1 + 2) * 3 / 4 - 5
    op = r.checked.interventions[0].op
    assert np.allclose(op.vectors[0], [6.0, 8.0, -0.5, 0.0]) and op.scalar == pytest.approx(np.pi / 2)


# ---------------------------------------------------------------- causality


def gate_program(pool: str, tokens: str | None, probe_site: str = "resid_pre[1]", iv_site: str = "resid_post[2]",
                 vectors: str = V4) -> str:
    """Vectors on lines 2-3, the probe on 4-8 (site 5, pool 7), the intervention from 9 (`when` last)."""
    lines = [f"tokens {tokens}"] if tokens else []
    return ("steer 1\n" + vectors + f"probe p {{\n  at   {probe_site}\n  read cosine(v)\n  pool {pool}\n}}\n"
            + iv_block(iv_site, "add v", *lines, "when p > 0.1"))


@pytest.mark.parametrize("pool", ["prompt.mean", "prompt.last"])
@pytest.mark.parametrize("tokens", ["generated", "generated[:8]", "generated[2], generated[4:]"])
def test_prompt_pooled_gate_on_generated_tokens_is_fine(pool, tokens):
    clean(check(gate_program(pool, tokens)))


@pytest.mark.parametrize("tokens, when_line", [("all", 13), (None, 12), ("prompt", 13), ("generated, prompt[-1:]", 13),
                                                ("[0, 1]", 13), ('after "x"', 13)])
def test_prompt_pooled_gate_reaching_the_prompt_is_a_causality_error(tokens, when_line):
    r = check(gate_program("prompt.mean", tokens))
    d = one(r, "causality")
    assert d.span.line == when_line
    assert d.notes and d.notes[0].span.line == 7  # the pool line


@pytest.mark.parametrize(
    "probe_site, iv_site, ok",
    [
        ("resid_pre[1]", "resid_pre[1]", True),
        ("resid_pre[1]", "resid_post[2]", True),
        ("resid_post[0]", "resid_pre[1]", True),  # the same tensor
        ("resid_pre[1]", "resid_post[0]", True),  # the same tensor
        ("attn_out[1]", "mlp_out[1]", True),
        ("head[1, 0]", "attn_out[1]", True),
        ("resid_post[3]", "resid_pre[1]", False),
        ("mlp_out[1]", "attn_out[1]", False),
        ("attn_out[1]", "head[1, 0]", False),
        ("resid_pre[2]", "resid_post[0:3]", False),
        ("resid_pre[2]", "mlp_out[1]", False),
    ],
)
def test_per_token_gate_site_order(probe_site, iv_site, ok):
    r = check(gate_program("token", None, probe_site, iv_site))
    if ok:
        clean(r)
    else:
        d = one(r, "causality")
        assert d.span.line == 12 and d.notes[0].span.line == 5  # at `when`; a note at the probe's site


def test_per_token_causality_with_negative_layers_needs_the_model(tiny_facts):
    text = gate_program("token", None, "resid_post[-1]", "resid_pre[1]", vectors=V64)
    clean(check(text))
    assert errors(check(text, facts=tiny_facts("tiny-llama"))) == [("causality", 12)]
    text = gate_program("token", None, "resid_post[3]", "resid_pre[*]", vectors=V64)
    assert errors(check(text, facts=tiny_facts("tiny-llama"))) == [("causality", 12)]


# ------------------------------------------------------------- with facts


def test_layers_and_heads_out_of_range(tiny_facts):
    facts = tiny_facts("tiny-llama")
    for site, code, col in [("resid_post[7]", "layer-out-of-range", 14), ("resid_post[-5]", "layer-out-of-range", 14),
                            ("mlp_out[0, 4]", "layer-out-of-range", 14), ("head[0, 4]", "head-out-of-range", 11),
                            ("head[4, 0]", "layer-out-of-range", 8), ("head[0, (1, -5)]", "head-out-of-range", 15)]:
        r = check("steer 1\n" + iv_block(site, "scale 0"), facts=facts)
        d = one(r, code)
        assert (d.span.line, d.span.column) == (3, 3 + col), site
        assert "4" in d.message


def test_percent_selectors_follow_the_model(tiny_facts):
    r = check("steer 1\n" + iv_block("resid_post[50%]", "scale 0")
              + iv_block("head[25%:75%, 100%]", "scale 0", name="y"),
              facts=tiny_facts("tiny-llama"))
    clean(r)
    sites = [s.site.text for s in r.plan.sites]
    assert "resid_post[2]" in sites and "head[1, 3]" in sites and "head[2, 3]" in sites


def test_empty_slices_are_no_effect(tiny_facts):
    r = check("steer 1\n" + iv_block("resid_post[3:1]", "scale 0"), facts=tiny_facts("tiny-llama"))
    assert codes(r) == [("no-effect", 3)]


def test_width_mismatch_at_the_operation_line(tiny_facts):
    facts = tiny_facts("tiny-llama")
    r = check("steer 1\n" + V4 + iv_block("resid_pre[1]", "add 2 * v"), facts=facts)
    d = one(r, "shape-mismatch")
    assert d.span.line == 6 and "64" in d.message and "4" in d.message
    r = check("steer 1\n" + V64 + iv_block("head[1, 0]", "add v"), facts=facts)
    d = one(r, "shape-mismatch")
    assert d.span.line == 6 and "head_dim" in d.message
    clean(check("steer 1\n" + f"vector h = {lit(16)}\n" + iv_block("head[1, 0]", "add h"), facts=facts))
    r = check("steer 1\n" + V4 + "probe p {\n  at resid_pre[1]\n  read cosine(v)\n  pool token\n}\n", facts=facts)
    assert ("shape-mismatch", 6) in errors(r)  # at the probe's `read` line


def test_mixed_widths_without_a_model():
    d = one(check("steer 1\nvector a = [1.0, 0.0]\nvector b = [1.0, 0.0, 0.0]\nvector c = a + b\n"), "shape-mismatch")
    assert d.span.line == 4


def test_missing_per_layer_rows(project, tiny_facts):
    write_safetensors(project / "t.safetensors", {f"b.{i}": f32(np.ones(64)) for i in (0, 1, 3)})
    np.save(project / "short.npy", np.ones((3, 64), dtype=np.float32))
    facts = tiny_facts("tiny-llama")
    bank = 'steer 1\nvector b = load("t.safetensors", key="b", per_layer=true)\n'
    r = check(bank + iv_block("resid_post[*]", "add b"),
              project, facts=facts)
    d = one(r, "missing-key")
    assert d.span.line == 5 and "layer 2" in d.message
    r = check('steer 1\nvector b = load("short.npy", per_layer=true)\n' + iv_block("resid_pre[-2:]", "add 0.5 * b"),
              project, facts=facts)
    d = one(r, "shape-mismatch")
    assert d.span.line == 5 and "3 rows" in d.message
    clean(check('steer 1\nvector b = load("short.npy", per_layer=true)\n' + iv_block("resid_pre[:3]", "add b"),
                project, facts=facts))


def test_model_mismatch_at_the_failing_assertion(tiny_facts):
    text = 'steer 1\nmodel {\n  family = "llama"\n  layers = 32\n  hidden = 64\n  tied_embeddings = true\n}\n'
    r = check(text, facts=tiny_facts("tiny-llama"))
    assert errors(r) == [("model-mismatch", 4), ("model-mismatch", 6)]
    assert "32" in r.errors[0].message and "4" in r.errors[0].message
    clean(check(text))  # without a model nothing is asserted
    r = check('steer 1\nmodel {\n  family = "llama"\n}\n', facts=tiny_facts("tiny-gpt2"))
    assert errors(r) == [("model-mismatch", 3)]


def test_ill_typed_model_facts_are_not_also_mismatches(tiny_facts):
    r = check('steer 1\nmodel {\n  layrs = 4\n  family = 3\n}\n', facts=tiny_facts("tiny-llama"))
    assert errors(r) == [("unknown-field", 3), ("type-error", 4)]


def test_dead_intervention(tiny_facts):
    facts = tiny_facts("tiny-llama")
    first = "steer 1\n" + V64 + iv_block("resid_post[1]", "add v", name="a")
    text = first + iv_block("resid_pre[2]", "set u", name="b")
    r = check(text, facts=facts)
    assert codes(r) == [("dead-intervention", 4)]
    d = r.diagnostics[0]
    assert "`b`" in d.message and d.notes[0].span.line == 8
    # a narrower later scope, a gate or `preserve norm` on the later one keep the first one alive
    probe = "probe p {\n  at resid_pre[0]\n  read norm\n  pool token\n}\n"
    for extra in (["tokens prompt"], ["preserve norm"], ["when p > 1"]):
        text = first + probe + iv_block("resid_post[1]", "suppress", *extra, name="b")
        assert not [c for c in codes(check(text, facts=facts)) if c[0] == "dead-intervention"], extra
    same_scope = ("steer 1\n" + V64 + iv_block("resid_post[1]", "add v", "tokens prompt", name="a")
                  + iv_block("resid_post[1]", "suppress", "tokens prompt", name="b"))
    assert ("dead-intervention", 4) in codes(check(same_scope, facts=facts))


@pytest.mark.parametrize("op", ["scale 1", "scale 1.0 * 1", "add 0 * v", "add v - v", "rotate in (v, u) by 0",
                                "rotate in (v, u) by 0deg"])
def test_no_effect_interventions(op, tiny_facts):
    r = check("steer 1\n" + V64 + iv_block("resid_post[1]", op), facts=tiny_facts("tiny-llama"))
    assert [c for c in codes(r) if c[0] != "unused-name"] == [("no-effect", 4)]


def test_preserve_norm_that_does_nothing():
    r = check("steer 1\n" + iv_block("resid_pre[0]", "suppress", "preserve norm"))
    assert codes(r) == [("no-effect", 5)]
    r = check("steer 1\n" + V4 + iv_block("resid_pre[0]", "rotate in (v, u) to 1", "preserve norm"))
    assert codes(r) == [("no-effect", 7)]


def test_unused_names_are_warnings():
    r = check("steer 1\nparam g = 1\n" + V4 + PROBE)
    assert codes(r) == [("unused-name", 2), ("unused-name", 3), ("unused-name", 4), ("unused-name", 5)]
    assert r.ok


def test_a_clean_program_against_a_model_has_a_plan(tiny_facts):
    text = "steer 1\n" + V64 + iv_block("resid_post[1:3]", "add 2 * v", "tokens generated")
    r = check(text, facts=tiny_facts("tiny-gpt2"))
    clean(r)
    assert r.plan is not None and [s.site.text for s in r.plan.sites] == ["resid_post[1]", "resid_post[2]"]


def test_a_row_a_bank_lacks_says_which_rows_it_has(project):
    from safetensors.numpy import save_file

    save_file({f"mean_diff.{i}": np.ones(4, dtype=np.float32) for i in range(30)}, str(project / "joy.safetensors"))
    save_file({f"d.{i}": np.ones(4, dtype=np.float32) for i in (1, 2, 3, 7)}, str(project / "gaps.safetensors"))
    r = check('steer 1\nvector v = load("joy.safetensors", key="mean_diff.40")\n', project)
    d = one(r, "missing-key")
    assert d.message == "no row 40 in the bank `mean_diff` of `joy.safetensors`: its rows are 0 to 29 (30 rows)"
    assert "mean_diff.4`" not in (d.help or "") and 'key="mean_diff", per_layer=true' in d.help
    d = one(check('steer 1\nvector v = load("gaps.safetensors", key="d.5")\n', project), "missing-key")
    assert d.message.endswith("its rows are 1 to 3, 7 (4 rows)")
    # a misspelt bank name is still a spelling suggestion
    d = one(check('steer 1\nvector v = load("joy.safetensors", key="mean_dif.4")\n', project), "missing-key")
    assert d.help == "did you mean `mean_diff.4`?"
