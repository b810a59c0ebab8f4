"""Output constraints on the HF target: valid output, steering still applies, emitted == in-process."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("xgrammar")
pytest.importorskip("tokenizers")

from hf_util import load_emitted, plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from tokenizer_util import byte_bpe  # noqa: E402

from steerc.runtime.hf import SteerInstallError, facts_from_model, install  # noqa: E402
from steerc.targets.hf.emit import emit  # noqa: E402
from steerc.targets.hooks import lower_hf  # noqa: E402

PROMPTS = ["Answer: hello", "the fox", "1 + 2", "yes, because"]
SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 6},
                                           "flag": {"type": "boolean"}},
          "required": ["word", "flag"], "additionalProperties": False}
STEER = f"intervention x {{\n  at resid_post[1]\n  add 30.0 * {vec(64, 5)}\n}}\n"
CONSTRAINTS = {
    "json_schema": f'constrain json_schema """{json.dumps(SCHEMA)}"""\n',
    "regex": 'constrain regex "(yes|no), because [a-z ]{1,12}\\\\."\n',
    "choice": 'constrain choice ["yes", "no", "maybe"]\n',
    "grammar": 'constrain grammar """root ::= digit digit op digit\ndigit ::= [0-9]\nop ::= "+" | "-" | "*" """\n',
}


def _valid(kind: str, text: str) -> bool:
    if kind == "json_schema":
        import jsonschema

        # xgrammar 0.2.9 builds length-limited strings from [^"\\\r\n], which admits raw
        # control characters (not strict JSON): parse leniently, as its grammar allows.
        value = json.loads(text, strict=False)
        jsonschema.validate(value, SCHEMA)
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
        return not re.search(r"\s", outside_strings)  # compact: no whitespace between tokens
    if kind == "regex":
        return re.fullmatch(r"(yes|no), because [a-z ]{1,12}\.", text) is not None
    if kind == "choice":
        return text in ("yes", "no", "maybe")
    return re.fullmatch(r"[0-9][0-9][+\-*][0-9]", text) is not None


def _generate(model, tok, plan, package=None, **kwargs):
    tok.padding_side = "left"
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    handle = package.install(model, tok) if package else install(model, plan, tok)
    with handle:
        out = model.generate(**ids, max_new_tokens=48, do_sample=False, pad_token_id=0, eos_token_id=2, **kwargs)
    return [tok.decode(r[ids["input_ids"].shape[1]:], skip_special_tokens=True) for r in out]


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_constrained_output_is_valid_and_steering_still_applies(kind):
    model, tok = tiny_model("llama"), byte_bpe()
    plain = _generate(model, tok, plan_for(model, "steer 1\n" + CONSTRAINTS[kind]))
    steered = _generate(model, tok, plan_for(model, "steer 1\n" + STEER + CONSTRAINTS[kind]))
    for text in plain + steered:
        assert _valid(kind, text), (kind, text)
    if kind != "choice":
        assert plain != steered, "the constraint leaves room: steering must still change the output"


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_a_static_cache_constrains_and_steers_as_the_dynamic_one(kind):
    model, tok = tiny_model("llama"), byte_bpe()
    plan = plan_for(model, "steer 1\n" + STEER + CONSTRAINTS[kind])
    static = _generate(model, tok, plan, cache_implementation="static")
    assert static == _generate(model, tok, plan)
    assert all(_valid(kind, text) for text in static)


def test_constraint_needs_the_tokenizer():
    model = tiny_model("llama")
    with pytest.raises(SteerInstallError, match="tokenizer"):
        install(model, plan_for(model, "steer 1\n" + CONSTRAINTS["regex"]))


@pytest.mark.parametrize("kind", ["json_schema", "grammar"])
def test_emitted_package_constrains_the_same_way(tmp_path, kind):
    model, tok = tiny_model("llama"), byte_bpe()
    plan = plan_for(model, "steer 1\n" + STEER + CONSTRAINTS[kind])
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    package = load_emitted(str(tmp_path / "pkg"), f"constrained_{kind}")
    assert "import xgrammar" not in (tmp_path / "pkg" / "__init__.py").read_text()  # only inside _support, lazily
    assert _generate(model, tok, plan) == _generate(model, tok, plan, package)


def test_vllm_and_serve_carry_the_constraint():
    from steerc.targets.constraints import constraint_from_json, request_fields, structured_outputs
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.wire import unpack

    model = tiny_model("llama")
    plan = plan_for(model, "steer 1\n" + CONSTRAINTS["json_schema"])
    header = unpack(plan_bytes(plan, facts_from_model(model)))["header"]
    fields = structured_outputs(constraint_from_json(header["constraint"]))
    assert fields == {"json": SCHEMA, "disable_any_whitespace": True}
    assert request_fields(plan.constraint)["response_format"]["json_schema"]["schema"] == SCHEMA
