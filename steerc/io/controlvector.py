"""llama.cpp's control vectors: what their GGUF files hold, and what their layers mean.

A control vector is a GGUF file of architecture ``controlvector`` holding
one float32 vector per layer, named ``direction.<N>``, with the metadata
``controlvector.model_hint`` (the model's architecture) and
``controlvector.layer_count`` (how many directions it holds). Read from
llama.cpp (the copy vendored by llama-cpp-python 0.3.36, llama.cpp commit
``0c1e57098bba43ac29e6e3b677cdceebdd22334f``):

* ``common/common.cpp`` ``common_control_vector_load_one``: every tensor
  must be ``direction.<N>`` with ``N >= 1`` (``direction.0`` and any other
  name make it refuse the file), F32, one dimension (``ggml_n_dims``, so an
  ``[n_embd, 1]`` tensor counts), all of one length; ``direction.N`` goes
  to offset ``n_embd * (N - 1)`` of the buffer ("layer 1 at [0]");
* ``src/llama-adapter.cpp`` ``llama_adapter_cvec::apply`` copies offset
  ``n_embd * (il - 1)`` into ``tensors[il]`` for ``il = 1 .. n_layer - 1``
  (``tensors[0]`` is never made: "there's never a tensor for layer 0"), and
  ``apply_to(ctx, cur, il)`` adds ``tensors[il]`` to ``cur``;
* ``src/models/llama.cpp`` (and every family steerc knows: qwen2, qwen3,
  gemma, gemma2, gemma3, phi3, gpt2, gptneox, olmo2, granite, command-r,
  qwen2moe, qwen3moe, olmoe, openai-moe) calls ``build_cvec(cur, il)``
  on the output of decoder layer ``il`` (0-based), right before
  ``cb(cur, "l_out", il)``.

So ``direction.N`` is added to the output of decoder layer ``N``: steerc's
``resid_post[N]``, the same number. The two ``- 1`` cancel; layer 0's
output cannot be steered. repeng's ``export_gguf`` agrees: it writes
``direction.{layer}`` for its 0-based decoder layer, read from
``hidden_states[layer + 1]`` (layer ``layer``'s output) and applied by its
``ControlModel`` to that layer's output. llama.cpp's own cvector-generator
(``tools/cvector-generator``) names the vector it read from layer ``i``'s
output (``l_out-i``) ``direction.{i + 1}``, so llama.cpp applies it one
layer later than it was read; the file's meaning is where llama.cpp adds
it, and that is what steerc reads.

>>> llamacpp_arch("gpt_neox"), llamacpp_arch("mistral"), llamacpp_arch("qwen2"), llamacpp_arch("cohere")
('gptneox', 'llama', 'qwen2', 'command-r')
"""

from __future__ import annotations

import re

from steerc.core.limits import MAX_LAYERS
from steerc.diagnostics.codes import INVALID_VECTOR_FILE
from steerc.io.gguf import (
    F32,
    INT32,
    INTEGER_TYPES,
    STRING,
    GGUFError,
    OtherArchitecture,
    gguf_bytes,
    read_bytes,
    read_header,
)
from steerc.io.vectorfile import TensorInfo, VectorFile, VectorFileError

ARCH = "controlvector"
HINT_KEY = "controlvector.model_hint"
COUNT_KEY = "controlvector.layer_count"
PREFIX = "direction"
NAME = re.compile(r"direction\.([0-9]{1,6})", re.ASCII)

# steerc's families as llama.cpp names their architecture (convert_hf_to_gguf.py: Mistral converts as llama).
_LLAMACPP = {"mistral": "llama", "mixtral": "llama", "gemma3_text": "gemma3", "gpt_neox": "gptneox",
             "cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}


def llamacpp_arch(name: str) -> str:
    """llama.cpp's architecture name for a steerc family, a Hugging Face model_type or a llama.cpp name."""
    from steerc.facts.families import MODEL_TYPES  # with a model only: checking a file needs no facts

    family = MODEL_TYPES.get(name, name)
    return _LLAMACPP.get(family, family)


def hint_fits(hint: str, facts) -> bool:
    """Whether a ``model_hint`` (repeng writes the model_type, cvector-generator llama.cpp's arch) names the model.

    >>> from steerc.facts import facts_from_config
    >>> f = facts_from_config({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 8,
    ...                        "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10})
    >>> hint_fits("gptneox", f), hint_fits("gpt_neox", f), hint_fits("llama", f)
    (True, True, False)
    """
    return llamacpp_arch(hint) == llamacpp_arch(facts.family) or (bool(facts.model_type) and hint == facts.model_type)


def layer_of(name: str) -> int | None:
    """The layer of a ``direction.<N>`` tensor name (1 to 6 ASCII digits), else None.

    >>> layer_of("direction.12"), layer_of("direction.+1"), layer_of("token_embd.weight")
    (12, None, None)
    """
    m = NAME.fullmatch(name)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- reading


def open_control_vector(path: str):
    """A control-vector GGUF as a :class:`~steerc.io.vectorfile.VectorFile` of its ``direction.<N>`` rows.

    Refused (``invalid-vector-file``), as llama.cpp's loader refuses them:
    anything that is not a well-formed GGUF, a tensor that is not a
    direction, ``direction.0``, a direction that is not F32 or not one
    vector, directions of different lengths. Refused too, though llama.cpp
    would load them: another architecture (a model GGUF), two tensors for one
    layer (``direction.1`` and ``direction.01``, which llama.cpp sums), a name
    ``std::stoi`` reads loosely (``direction.1x``, ``direction.+1``), a layer
    no model has, no directions at all, metadata of the wrong type, and a
    layer count that is not the number of directions. ``meta`` keeps the
    hint and the count.
    """

    def bad(message: str, help: str | None = None):
        return VectorFileError(INVALID_VECTOR_FILE, message, help)

    try:
        header = read_header(path, expect_arch=ARCH)
    except OtherArchitecture as exc:
        raise bad(f"this GGUF is a `{exc.arch}` model, not a control vector (its general.architecture is "
                  f"`{exc.arch}`, not `{ARCH}`)", help=_WRITERS) from None
    except GGUFError as exc:
        raise bad(f"not a readable GGUF file: {exc}") from None
    meta = _metadata(header, bad)
    rows: dict[int, str] = {}
    tensors = {}
    for t in header.tensors:
        layer = _direction_layer(t.name, bad)
        if layer in rows:
            raise bad(f"`{rows[layer]}` and `{t.name}` are both for layer {layer} (llama.cpp would add them); "
                      "write one direction per layer")
        if t.type_id != F32:
            raise bad(f"`{t.name}` is {t.type_name}; llama.cpp reads only F32 directions")
        # ggml_n_dims: trailing dimensions of 1 do not count, so [n_embd, 1] is a vector.
        if len(t.shape) == 0 or any(n != 1 for n in t.shape[:-1]):
            raise bad(f"`{t.name}` has shape {list(t.shape)}; a direction is one vector")
        rows[layer] = t.name
        tensors[t.name] = (TensorInfo(t.name, t.type_name, (t.shape[-1],)), t)
    _check_rows(tensors, meta, bad)
    infos = {name: info for name, (info, _) in tensors.items()}

    def raw(name: str) -> tuple[bytes, str]:
        try:
            return read_bytes(path, tensors[name][1]), "<f4"
        except GGUFError as exc:
            raise bad(str(exc)) from None

    f = VectorFile(path, "gguf", infos, raw=raw)
    f.meta = meta
    return f


def _direction_layer(name: str, bad) -> int:
    layer = layer_of(name)
    if layer is None:
        raise bad(f"tensor `{name}` is not a direction: a control vector holds only `{PREFIX}.<layer>` tensors "
                  "(llama.cpp refuses a file with any other)")
    if layer == 0:
        raise bad(f"`{name}`: llama.cpp refuses a control vector with a direction for layer 0 (it never adds "
                  "one to layer 0's output)", help="drop the direction for layer 0")
    if layer >= MAX_LAYERS:
        raise bad(f"tensor `{name}` is for layer {layer:,}; no model steerc reads has {MAX_LAYERS:,} layers")
    return layer


_WRITERS = ("load a control vector (llama.cpp's cvector-generator, repeng's export_gguf, or "
            "`steerc compile --target llamacpp` write them); a model GGUF goes to `--model`")


def _metadata(header, bad) -> dict:

    meta = {}
    if HINT_KEY in header.metadata:
        if header.types[HINT_KEY] != STRING:
            raise bad(f"`{HINT_KEY}` must be a string (the model's architecture)")
        meta["model_hint"] = header.metadata[HINT_KEY]
    if COUNT_KEY in header.metadata:
        if header.types[COUNT_KEY] not in INTEGER_TYPES:
            raise bad(f"`{COUNT_KEY}` must be an integer (how many directions the file holds)")
        meta["layer_count"] = header.metadata[COUNT_KEY]
    return meta


def _check_rows(tensors: dict, meta: dict, bad) -> None:
    if not tensors:
        raise bad("this control vector holds no `direction.<layer>` tensors")
    widths = {info.shape[0] for info, _ in tensors.values()}
    if widths == {0}:
        raise bad("its directions are empty (length 0)")
    if len(widths) != 1:
        raise bad(f"its directions have different lengths ({', '.join(map(str, sorted(widths)))}); "
                  "llama.cpp refuses such a file")
    count = meta.get("layer_count")
    if count is not None and count != len(tensors):
        raise bad(f"`{COUNT_KEY}` is {count:,}, but the file holds {len(tensors)} directions")


# ---------------------------------------------------------------- writing


def control_vector_bytes(directions: dict, hint: str, provenance=()) -> bytes:
    """The GGUF of ``directions`` ({layer >= 1: float32 vector}), as llama.cpp's cvector-generator writes it.

    ``general.architecture`` = ``controlvector``, ``controlvector.model_hint``
    (llama.cpp's architecture name), ``controlvector.layer_count`` (int32, the
    number of directions), then ``provenance`` (string pairs), then
    ``direction.<N>`` in layer order.
    """

    metadata = [("general.architecture", STRING, ARCH), (HINT_KEY, STRING, hint),
                (COUNT_KEY, INT32, len(directions))]
    metadata += [(k, STRING, v) for k, v in provenance]
    return gguf_bytes(metadata, [(f"{PREFIX}.{layer}", directions[layer]) for layer in sorted(directions)])


__all__ = ["ARCH", "COUNT_KEY", "HINT_KEY", "PREFIX", "control_vector_bytes", "hint_fits", "layer_of",
           "llamacpp_arch", "open_control_vector"]
