"""``steerc explain --tokens``: the positions it shows are the ones the HF runtime steers.

The differential test installs a program of many scopes (one intervention a
site, each adding a large vector) on the tiny Llama, generates, and records
at each site which positions the steering hook changed (the site tensor
just before and just after it); the table of :func:`tokens_doc` must name
exactly those. The CLI tests use a model folder with the tiny Llama's config
and a small byte-level BPE tokenizer (with a chat template).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import hook_of, plan_for, vec  # noqa: E402
from support import run_cli  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from tokenizer_util import byte_bpe  # noqa: E402

from steerc.explain.tokens import prompt_ids, tokens_doc  # noqa: E402
from steerc.runtime.hf import install  # noqa: E402

# One intervention a site; every scope form, unions, clipping, `after`, and gates that open and that stay shut.
SCOPES = {
    "every": ("resid_post[0]", None),
    "whole_prompt": ("mlp_out[0]", "prompt"),
    "fed_back": ("attn_out[0]", "generated"),
    "last_index": ("resid_post[1]", "prompt[-1]"),
    "first_token_on": ("mlp_out[1]", "prompt[-1:], generated"),
    "middle": ("attn_out[1]", "prompt[2:5], prompt[9:]"),
    "all_but_two": ("resid_post[2]", "prompt[:-2]"),
    "some_generated": ("mlp_out[2]", "generated[1:4], generated[6]"),
    "absolute": ("attn_out[2]", "[0, 3, 9, 14]"),
    "after_yes": ("resid_post[3]", 'after "yes"'),
    "gate_open": ("mlp_out[3]", "prompt[-2:], generated[:2]"),
    "gate_shut": ("attn_out[3]", "prompt[1], generated[2]"),
}
GATES = {"gate_open": "big > 0.0", "gate_shut": "big < 0.0"}
PROMPTS = ("yes, because it is raining.", "maybe", "hello world, how are you today? yes yes")
GENERATED = 7


def program() -> str:
    parts = ["steer 1", f"vector v = normalize({vec(64, 5)})",
             "probe big {\n  at   resid_post[0]\n  read norm\n  pool token\n}"]
    for name, (site, scope) in SCOPES.items():
        lines = [f"  at  {site}", "  add 6.0 * v"]
        if scope:
            lines.append(f"  tokens {scope}")
        if name in GATES:
            lines.append(f"  when {GATES[name]}")
        parts.append(f"intervention {name} {{\n" + "\n".join(lines) + "\n}")
    return "\n\n".join(parts) + "\n"


def runtime_steered(model, plan, ids: list[int], generated: int) -> dict[str, set[int]]:
    """{intervention: positions its site's steering hook changed} over one greedy generate call."""
    from steerc.ir.plan import Site

    seen: dict[str, set[int]] = {name: set() for name in SCOPES}
    handles = []
    with install(model, plan, byte_bpe()):
        for name, (site_text, _) in SCOPES.items():
            kind, layer = site_text[:-1].split("[")
            hook = hook_of(model, Site(kind, int(layer)))
            assert hook.kind == "post"
            module = model.get_submodule(hook.module)
            before: list = []

            def first(mod, args, output, before=before):
                before.append((output[0] if isinstance(output, tuple) else output).detach().clone())

            def last(mod, args, output, before=before, name=name):
                h = (output[0] if isinstance(output, tuple) else output)[0]
                start = 0 if len(before) == 1 else len(ids) + len(before) - 2
                changed = (h - before[-1][0]).abs().amax(dim=-1) > 0
                seen[name] |= {start + int(t) for t in torch.nonzero(changed).flatten()}

            handles += [module.register_forward_hook(first, prepend=True), module.register_forward_hook(last)]
        try:
            with torch.no_grad():
                prompt = torch.tensor([ids])
                model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                               max_new_tokens=generated + 1, min_new_tokens=generated + 1, pad_token_id=0)
        finally:
            for h in handles:
                h.remove()
    return seen


@pytest.mark.parametrize("text", PROMPTS)
def test_the_table_shows_the_positions_the_runtime_steers(text):
    model = tiny_model("llama")
    plan = plan_for(model, program())
    tok = byte_bpe()
    ids, templated = prompt_ids(tok, text, chat=True)
    assert not templated  # this tokenizer has no chat template: the raw text, as run feeds it
    doc = tokens_doc(plan, tok, text, ids, templated, GENERATED)
    length = len(ids)
    assert doc["P"] == length and [t["id"] for t in doc["tokens"]] == ids
    steered = runtime_steered(model, plan, ids, GENERATED)
    shown = {i["name"]: set(i["prompt_positions"]) | {length + j for j in i["generated"]}
             for i in doc["interventions"]}
    assert set(shown) == set(SCOPES)
    for name in SCOPES:
        if name == "gate_shut":
            assert steered[name] == set() and shown[name], "a gate that stays shut steers nothing"
        else:
            assert steered[name] == shown[name], name
    items = {i["name"]: i for i in doc["interventions"]}
    assert items["fed_back"]["last_prompt"] is False and items["first_token_on"]["last_prompt"] is True
    assert items["gate_open"]["gate"] == "big > 0" and items["every"]["gate"] is None


def test_slices_clip_to_a_short_prompt_and_after_needs_its_text():
    tok = byte_bpe()
    plan = plan_for(tiny_model("llama"), program())
    ids, templated = prompt_ids(tok, "maybe", chat=False)
    doc = tokens_doc(plan, tok, "maybe", ids, templated, 3)
    items = {i["name"]: i for i in doc["interventions"]}
    assert len(ids) < 9 and set(items["middle"]["prompt_positions"]) <= {2, 3, 4}
    assert items["after_yes"]["prompt_positions"] == [] and items["after_yes"]["generated"] == []
    assert items["absolute"]["generated"] == [j for j in range(3) if len(ids) + j in (0, 3, 9, 14)]


# ------------------------------------------------------------------------ CLI

CHAT = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"


@pytest.fixture(scope="module")
def project(tmp_path_factory, examples_dir):
    """A project folder: the tiny Llama's config with a tokenizer that has a chat template, and programs."""
    root = tmp_path_factory.mktemp("tokens")
    model = root / "model"
    model.mkdir()
    shutil.copy(os.path.join(examples_dir, "models", "tiny-llama", "config.json"), model / "config.json")
    tok = byte_bpe()
    tok.save_pretrained(model)
    with open(model / "tokenizer_config.json", encoding="utf-8") as fh:
        config = json.load(fh)
    config["chat_template"] = CHAT
    with open(model / "tokenizer_config.json", "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    (root / "steer.toml").write_text("")
    (root / "scopes.steer").write_text(program())
    shutil.copytree(os.path.join(examples_dir, "vectors"), root / "vectors")
    for name in ("05_ops_and_scopes.steer", "12_per_token_gate.steer"):
        shutil.copy(os.path.join(examples_dir, name), root / name)
    return root


def explain(project, monkeypatch, *args):
    monkeypatch.chdir(project)
    return run_cli(["explain", *args])


def test_text_table_marks_each_position(project, monkeypatch):
    code, out, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "yes, maybe",
                             "--raw", "--generated", "3")
    assert code == 0, err
    assert "as raw text: P = " in out and "-- generated" in out
    assert "[3] fed_back at attn_out[0], tokens generated" in out
    assert "P-1 (position" in out and "NOT steered" in out
    assert "steered if its gate opens" in out
    rows = [line for line in out.splitlines() if line.strip().startswith(("0 ", "1 ")) and "'" in line]
    assert rows and rows[0].split()[-12:][0] == "#"  # `every` steers position 0


def test_chat_is_the_default_as_in_run(project, monkeypatch):
    code, chat, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "maybe",
                              "--format", "json")
    assert code == 0, err
    code, explicit, _ = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "maybe",
                                "--chat", "--format", "json")
    code, raw, _ = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "maybe", "--raw",
                           "--format", "json")
    chat, explicit, raw = (json.loads(x)["tokens"] for x in (chat, explicit, raw))
    assert chat == explicit and chat["template"] == "chat" and raw["template"] == "raw"
    assert chat["P"] > raw["P"] and chat["tokens"][0]["text"] == "<s>"
    assert chat["generated"] == 8  # the default


def test_json_carries_the_plan_and_the_tokens(project, monkeypatch):
    code, out, err = explain(project, monkeypatch, "05_ops_and_scopes.steer", "--model", "model", "--tokens",
                             "Answer: yes", "--raw", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "steerc.explain/1" and doc["sites"]
    items = {i["name"]: i for i in doc["tokens"]["interventions"]}
    assert [i["name"] for i in doc["tokens"]["interventions"]] == [
        "damp_early", "pin_formality", "no_sarcasm", "overwrite", "silence"]  # source order
    assert items["no_sarcasm"]["sites"] == ["mlp_out[1]", "mlp_out[3]"]
    assert items["overwrite"]["generated"] == list(range(8)) and items["overwrite"]["prompt_positions"] == []
    assert items["damp_early"]["prompt_positions"] == [0, 1]


def test_output_is_deterministic(project, monkeypatch):
    args = ("12_per_token_gate.steer", "--model", "model", "--tokens", "yes <b>", "--format", "html")
    first, second = explain(project, monkeypatch, *args), explain(project, monkeypatch, *args)
    assert first[0] == 0 and first == second


@pytest.mark.parametrize("args, message", [
    (["--tokens", ""], "--tokens needs a prompt text"),
    (["--tokens", "x" * 70_000], "more than the 65,536"),
    (["--tokens", "hi", "--generated", "-1"], "--generated takes a count from 0"),
    (["--tokens", "hi", "--generated", "5000"], "--generated takes a count from 0"),
    (["--format", "html"], "--format html shows the tokens of a prompt: add --tokens"),
    (["--raw"], "--raw shows the tokens of a prompt"),
    (["--generated", "3"], "--generated shows the tokens of a prompt"),
])
def test_usage_errors(project, monkeypatch, args, message):
    code, out, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", *args)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_a_model_without_a_tokenizer_is_a_usage_error(project, monkeypatch, examples_dir):
    config = os.path.join(examples_dir, "models", "tiny-llama")
    for model in (config, os.path.join(config, "config.json")):
        code, out, err = explain(project, monkeypatch, "scopes.steer", "--model", model, "--tokens", "hi")
        assert code == 2 and "--tokens needs the model's tokenizer" in err and "no tokenizer files" in err, err


def test_tokens_without_a_model_is_a_usage_error(project, monkeypatch):
    code, out, err = explain(project, monkeypatch, "scopes.steer", "--tokens", "hi")
    assert code == 2 and "--model" in err


def test_too_many_tokens_is_a_usage_error(project, monkeypatch):
    monkeypatch.setattr("steerc.core.limits.MAX_PROMPT_TOKENS", 5)
    code, out, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens",
                             "hello world, how are you today?")
    assert code == 2 and "more than the 5 explain shows" in err, err


def test_hostile_token_text_is_escaped(project, monkeypatch):
    hostile = "<script>alert(1)</script> \x1b[31m\u202e\"'&"
    code, page, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", hostile,
                              "--format", "html")
    assert code == 0, err
    assert "<script" not in page.lower() and "\x1b" not in page and "\u202e" not in page
    from html.parser import HTMLParser

    class Tokens(HTMLParser):
        def __init__(self):
            super().__init__()
            self.texts, self.inside = [], 0

        def handle_starttag(self, tag, attrs):
            if ("class", "text") in attrs:
                self.inside = 1

        def handle_data(self, data):
            if self.inside:
                self.texts.append(data)
                self.inside = 0

    parser = Tokens()
    parser.feed(page)
    texts = "".join(parser.texts)  # \u202e is three byte-level tokens here, each decoding to U+FFFD
    assert texts.startswith("<s><script>alert(1)</script>\u2423\\x1b[31m") and texts.count("\ufffd") == 3
    assert "\"'&</s><s>generated[0]" in texts
    code, text, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", hostile)
    assert code == 0 and "\x1b" not in text and "\u202e" not in text and "\\x1b" in text


# --------------------------------------------------------------- the page, rendered

PAGE_FACTS = """({
  tokens: [...document.querySelectorAll('.tok')].map(t => ({pos: t.dataset.pos, names: t.dataset.interventions,
    bars: [...t.querySelectorAll('.bar')].map(b => b.dataset.intervention)})),
  bars: [...document.querySelectorAll('.tok .bar')].map(b => { const r = b.getBoundingClientRect();
    return {name: b.dataset.intervention, gated: b.classList.contains('gated'),
            color: getComputedStyle(b).backgroundColor, x: r.x, y: r.y, w: r.width, h: r.height}; }),
  swatches: Object.fromEntries([...document.querySelectorAll('tr[data-intervention]')].map(
    r => [r.dataset.intervention, getComputedStyle(r.querySelector('.swatch')).backgroundColor])),
  scripts: document.scripts.length,
})"""


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def test_the_page_renders_each_steered_token_in_its_interventions_colours(project, monkeypatch, tmp_path):
    """Headless Chromium draws the page: every token box holds one bar per intervention that steers it, in
    that intervention's legend colour, and those pixels are on the screenshot (striped when gated)."""
    import io

    from browser import render

    from steerc.explain.html import palette

    image_module = pytest.importorskip("PIL.Image")
    code, page, err = explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "yes, maybe",
                              "--generated", "4", "--format", "html")
    assert code == 0, err
    doc = json.loads(explain(project, monkeypatch, "scopes.steer", "--model", "model", "--tokens", "yes, maybe",
                             "--generated", "4", "--format", "json")[1])["tokens"]
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    facts, png = render(str(path), PAGE_FACTS, height=2000)
    assert facts["scripts"] == 0
    length = doc["P"]
    assert len(facts["tokens"]) == length + 4
    for item in doc["interventions"]:  # the boxes that hold a bar of an intervention are the positions it steers
        boxes = {int(t["pos"]) for t in facts["tokens"] if item["name"] in t["bars"]}
        assert boxes == set(item["prompt_positions"]) | {length + j for j in item["generated"]}, item["name"]
    for t in facts["tokens"]:
        assert t["bars"] == [n for n in t["names"].split(",") if n]
    colours = {item["name"]: palette(i) for i, item in enumerate(doc["interventions"])}
    image = image_module.open(io.BytesIO(png)).convert("RGB")
    assert len(facts["bars"]) > 20
    for bar in facts["bars"]:
        want = _rgb(colours[bar["name"]])
        assert bar["color"] == "rgb({}, {}, {})".format(*want) == facts["swatches"][bar["name"]]
        assert bar["w"] >= 10 and bar["h"] == 6
        y = int(bar["y"] + bar["h"] / 2)
        row = [image.getpixel((int(bar["x"]) + dx, y)) for dx in range(1, int(bar["w"]) - 1)]
        near = [p for p in row if max(abs(a - b) for a, b in zip(p, want)) <= 3]
        if bar["gated"]:  # stripes: the colour, and the colour washed with white
            assert near and len(near) < len(row), bar
        else:
            assert len(near) == len(row), bar
