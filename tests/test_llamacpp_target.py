"""``--target llamacpp``: a plan as a llama.cpp control vector (steerc/targets/llamacpp).

What is refused, where; the file's layout against llama.cpp's cvector-generator (read back with the
``gguf`` package); deterministic bytes; and the round trip: the file loaded back into a program gives
the plan that was compiled. ``tests/llamacpp`` runs the file in llama.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf_files import WIDTH, directions, write_cvector_generator
from support import run_cli
from test_controlvector import BANK, LAYERS, check, only_error, rows_of

gguf = pytest.importorskip("gguf")



PROGRAM = """steer 1
vector cv = load("cv.gguf")
vector w = normalize(load("cv.gguf", key="direction.2"))
intervention bank {
  at  resid_post[1:]
  add 0.5 * cv
}
intervention one {
  at  resid_pre[3]
  add 2.0 * w
}
intervention again {
  at  resid_post[3]
  add -w
}
"""


def _compile(tmp_path, text: str, out: str = "out", facts_dir: str | None = None) -> tuple[int, str, str]:
    (tmp_path / "p.steer").write_text(text, encoding="utf-8")
    return run_cli(["compile", str(tmp_path / "p.steer"), "--model", facts_dir or _facts_dir(tmp_path),
                    "--target", "llamacpp", "-o", str(tmp_path / out)])


def _facts_dir(tmp_path) -> str:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512}', encoding="utf-8")
    return str(folder)


def test_compile_writes_a_control_vector_as_cvector_generator_does(tmp_path):
    dirs = directions(LAYERS, WIDTH, seed=4)
    write_cvector_generator(str(tmp_path / "cv.gguf"), dirs)
    code, out, err = _compile(tmp_path, PROGRAM)
    assert code == 0, err
    path = tmp_path / "out" / "control_vector.gguf"
    assert out.strip() == str(path)
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(fields)[:3] == ["general.architecture", "controlvector.model_hint", "controlvector.layer_count"]
    assert fields["general.architecture"] == "controlvector" and fields["controlvector.model_hint"] == "llama"
    assert fields["controlvector.layer_count"] == LAYERS - 1
    assert reader.fields["controlvector.layer_count"].types == [gguf.GGUFValueType.INT32]
    assert fields["steerc.command"] == "steerc compile p.steer --target llamacpp"
    assert [(t.name, t.tensor_type, list(t.shape)) for t in reader.tensors] == \
        [(f"direction.{i}", gguf.GGMLQuantizationType.F32, [WIDTH]) for i in (1, 2, 3)]
    w = dirs[2].astype(np.float64) / np.linalg.norm(dirs[2].astype(np.float64))
    expected = {1: 0.5 * dirs[1], 2: 0.5 * dirs[2] + 2.0 * w, 3: 0.5 * dirs[3] - w}
    for t in reader.tensors:
        np.testing.assert_allclose(t.data, expected[int(t.name.split(".")[1])], rtol=1e-6, atol=1e-6)


def test_the_same_program_gives_the_same_bytes(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS, WIDTH, seed=4))
    assert _compile(tmp_path, PROGRAM, "a")[0] == 0 and _compile(tmp_path, PROGRAM, "b/c")[0] == 0
    a = (tmp_path / "a" / "control_vector.gguf").read_bytes()
    assert a == (tmp_path / "b" / "c" / "control_vector.gguf").read_bytes()


def test_loading_the_output_back_gives_the_same_plan(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS, WIDTH, seed=5))
    assert _compile(tmp_path, PROGRAM)[0] == 0
    before = check(tmp_path, PROGRAM).plan
    after = check(tmp_path, BANK.replace("cv.gguf", "out/control_vector.gguf")).plan
    assert [s.site for s in before.sites] == [s.site for s in after.sites]
    rows = rows_of(after)
    for b in before.sites:
        np.testing.assert_array_equal(rows[b.site.layer], _sum_of(b))


def _sum_of(site_plan) -> np.ndarray:
    return sum(k.op.bias.array.astype(np.float64) for k in site_plan.kernels).astype(np.float32)


def test_layers_nothing_steers_are_zero_and_drop_out_when_loaded_back(tmp_path):
    text = "steer 1\nintervention a {\n  at resid_post[2]\n  add " + str([0.25] * WIDTH) + "\n}\n"
    assert _compile(tmp_path, text)[0] == 0
    reader = gguf.GGUFReader(str(tmp_path / "out" / "control_vector.gguf"))
    assert [float(np.abs(t.data).sum()) for t in reader.tensors] == [0.0, 16.0, 0.0]
    after = check(tmp_path, BANK.replace("cv.gguf", "out/control_vector.gguf")).plan
    assert [s.site.text for s in after.sites] == ["resid_post[2]"]


V = "[" + ", ".join(["0.5"] * WIDTH) + "]"
REFUSED = [
    # (program body lines, what the message names, the line and column of the caret)
    ("intervention a {\n  at resid_post[1]\n  scale 2.0\n}", "`scale`", (4, 3)),
    (f"intervention a {{\n  at resid_post[1]\n  ablate {V}\n}}", "`ablate`", (4, 3)),
    (f"intervention a {{\n  at attn_out[1]\n  add {V}\n}}", "the site `attn_out`", (3, 6)),
    ("intervention a {\n  at head[1, 0]\n  add [0.5, 0.5]\n}", "the site `head`", (3, 6)),
    (f"intervention a {{\n  at resid_post[1]\n  add {V}\n  tokens generated\n}}", "the token scope `generated`",
     (5, 10)),
    (f"intervention a {{\n  at resid_post[1]\n  add ramp(4) * {V}\n  tokens generated\n}}", "`schedule`", (4, 3)),
    (f"intervention a {{\n  at resid_post[1]\n  add {V}\n  preserve norm\n}}", "`preserve norm`", (2, 1)),
    (f"param s = 1.0 in [0, 2] per request\nintervention a {{\n  at resid_post[1]\n  add s * {V}\n}}",
     "a `per request` param", (2, 1)),
    (f"intervention a {{\n  at resid_post[0]\n  add {V}\n}}", "resid_post[0], layer 0's output", (3, 6)),
    (f"intervention a {{\n  at resid_pre[1]\n  add {V}\n}}", "resid_pre[1] (= resid_post[0])", (3, 6)),
    (f"intervention a {{\n  at resid_pre[*]\n  add {V}\n}}", "the embeddings, resid_pre[0]", (3, 6)),
    (f"probe p {{\n  at   resid_post[1]\n  read cosine({V})\n  pool prompt.last\n}}\n"
     f"intervention a {{\n  at resid_post[2]\n  add {V}\n  when p > 0.5\n  tokens generated\n}}",
     "a gate on a probe pooled with `prompt.last`", (5, 8)),
]


@pytest.mark.parametrize("body, what, where", REFUSED, ids=[r[1] for r in REFUSED])
def test_what_llamacpp_cannot_express_is_refused_at_its_span(tmp_path, body, what, where):
    text = "steer 1\n" + body + "\n"
    result = check(tmp_path, text, target="llamacpp")
    refused = [d for d in result.errors if d.code == "unsupported-by-target" and what in d.message]
    assert refused, result.render()
    d = refused[0]
    assert (d.span.line, d.span.column) == where, result.render()
    assert d.help and "the llamacpp target cannot express" in d.message
    code, _, err = _compile(tmp_path, text)
    assert code == 1 and "unsupported-by-target" in err and not (tmp_path / "out").exists()


def test_a_sum_too_large_for_float32_is_refused(tmp_path):
    big = "[" + ", ".join(["3e38"] * WIDTH) + "]"
    text = f"steer 1\nintervention a {{\n  at resid_post[1]\n  add {big}\n}}\nintervention b {{\n  at resid_post[1]\n" \
           f"  add {big}\n}}\n"
    result = check(tmp_path, text, target="llamacpp")
    d = only_error(result, "unsupported-by-target")
    assert "does not fit float32" in d.message and d.span.line == 2


def test_without_a_model_the_layers_written_outright_are_judged(tmp_path):
    text = f"steer 1\nintervention a {{\n  at resid_post[0:2]\n  add {V}\n}}\n"
    d = only_error(check(tmp_path, text, facts=None, target="llamacpp"), "unsupported-by-target")
    assert "resid_post[0]" in d.message
    assert check(tmp_path, text.replace("[0:2]", "[-1]"), facts=None, target="llamacpp").ok


def test_hmac_is_for_the_vllm_and_serve_targets(tmp_path):
    (tmp_path / "key").write_bytes(b"k" * 32)
    (tmp_path / "p.steer").write_text("steer 1\n", encoding="utf-8")
    code, _, err = run_cli(["compile", str(tmp_path / "p.steer"), "--model", _facts_dir(tmp_path), "--target",
                            "llamacpp", "-o", str(tmp_path / "out"), "--hmac-key-file", str(tmp_path / "key")])
    assert code == 2 and "--hmac-key-file applies to" in err
