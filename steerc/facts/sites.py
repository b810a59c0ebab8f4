"""Where each site lives, per family and backend: layout knowledge as data.

A :class:`Hook` names a module (a template with ``{l}`` for the layer), the
hook kind (``pre`` sees the inputs, ``post`` the output) and which tensor
the site is:

* ``input`` — the module's first tensor input (``args[0]``, or the
  ``hidden_states`` keyword);
* ``input1`` — vLLM decoder layers' second input (``forward(positions,
  hidden_states, residual)``);
* ``output`` — the output, or element 0 when the module returns a tuple
  (transformers 4.x layers, attention modules returning weights);
* ``fused_pair`` — vLLM's ``(hidden_states, residual)`` layer output, whose
  sum is the residual stream;
* ``heads`` — ``input``, viewed as ``[..., heads, head_dim]`` (the input of
  the attention output projection).

Canonical residual sites: ``resid_post[l]`` is realised on the output of
layer ``l``, and ``resid_pre[l]`` for ``l >= 1`` is the same tensor (the
compiler rewrites it to ``resid_post[l-1]``); only ``resid_pre[0]`` needs
a pre-hook on layer 0. Hooking outputs keeps transformers'
``output_hidden_states`` (recorded by its own post-hooks) in step with the
steering.

The ``hf`` tables were read from transformers 5.24 (``modeling_*.py``) and
hold for 4.4x, where layers return tuples. The ``vllm`` tables were read
from vLLM 0.33.0 (``vllm/model_executor/models/*.py``; GPT-NeoX runs
through vLLM's Transformers backend since 0.32.0); those of the families
added for issue 15 (OLMo-2, Granite, Cohere and the MoE families) from the
vLLM 0.32.0 that the real-engine tests run, where OLMo-2 also runs through
the Transformers backend.

On a mixture-of-experts layer ``mlp_out`` is the sparse block's output as
it enters the residual stream: the routed experts' weighted sum plus any
shared expert (Qwen2-MoE's, gated by its sigmoid), already all-reduced
across tensor-parallel ranks by vLLM's fused-MoE runner.

>>> t = site_table("gemma2", "hf")
>>> t.hook("attn_out", 3).module
'model.layers.3.post_attention_layernorm'
>>> site_table("llama", "vllm").hook("resid_post", 0).tensor
'fused_pair'
>>> site_table("mixtral", "vllm").hook("mlp_out", 1).module
'model.layers.1.block_sparse_moe'
"""

from __future__ import annotations

import re

from steerc.core.record import evolve, frozen

VLLM_READ_FROM = "0.33.0"
VLLM_032 = "vLLM 0.32.0"
VLLM_BAND = ">=0.32,<0.34"
HF_READ_FROM = "transformers 5.24.0 (layer tuples of 4.4x handled)"


_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,15}", re.ASCII)


@frozen
class Hook:
    module: str
    kind: str  # pre | post
    tensor: str  # input | input1 | output | fused_pair | heads

    def at(self, layer: int) -> Hook:
        return evolve(self, module=self.module.format(l=layer))

    def to_json(self) -> dict:
        return {"module": self.module, "hook": self.kind, "tensor": self.tensor}


@frozen
class SiteTable:
    family: str
    backend: str
    layers: str  # the ModuleList of decoder layers
    final_norm: str
    resid_pre0: Hook
    resid_post: Hook
    attn_out: Hook
    mlp_out: Hook
    head: Hook
    read_from: str
    notes: tuple[str, ...] = ()
    # Sites whose hooked tensor is each tensor-parallel rank's partial sum (the layer all-reduces
    # later): refused under tensor parallelism, where a kernel would see a part, not the tensor.
    partial_under_tp: tuple[str, ...] = ()

    def hook(self, kind: str, layer: int) -> Hook:
        """The concrete hook for a canonical site (``resid_pre`` only at layer 0)."""
        if kind == "resid_pre":
            if layer != 0:
                raise ValueError("resid_pre[l>0] is canonicalised to resid_post[l-1]")
            return self.resid_pre0
        return getattr(self, kind).at(layer)

    @classmethod
    def from_json(cls, family: str, backend: str, doc) -> SiteTable:
        """The table of a facts file's ``sites`` (the shape :meth:`to_json` writes); ValueError naming the
        field at fault."""
        if not isinstance(doc, dict):
            raise ValueError("`sites` must be an object, as `steerc facts` writes it")

        def text(key: str) -> str:
            value = doc.get(key)
            if not isinstance(value, str) or not _PATH.fullmatch(value.replace("{l}", "0")):
                raise ValueError(f"`sites.{key}` must be a module path such as \"model.layers\"")
            return value

        def hook(key: str, tensors: tuple[str, ...]) -> Hook:
            entry = doc.get(key)
            if not isinstance(entry, dict):
                raise ValueError(f"`sites.{key}` must be an object with module, hook and tensor")
            module = entry.get("module")
            if not isinstance(module, str) or not _PATH.fullmatch(module.replace("{l}", "0")):
                raise ValueError(f"`sites.{key}.module` must be a module path (with {{l}} for the layer)")
            if key != "resid_pre[0]" and "{l}" not in module:
                raise ValueError(f"`sites.{key}.module` must contain {{l}}, the layer number")
            if entry.get("hook") not in ("pre", "post"):
                raise ValueError(f"`sites.{key}.hook` must be \"pre\" or \"post\"")
            if entry.get("tensor") not in tensors:
                raise ValueError(f"`sites.{key}.tensor` must be one of {', '.join(tensors)}")
            return Hook(module, entry["hook"], entry["tensor"])

        notes = doc.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ValueError("`sites.notes` must be a list of strings")
        return cls(family, backend, text("layers"), text("final_norm"),
                   resid_pre0=hook("resid_pre[0]", ("input",)), resid_post=hook("resid_post[l]", ("output",)),
                   attn_out=hook("attn_out[l]", ("output",)), mlp_out=hook("mlp_out[l]", ("output",)),
                   head=hook("head[l, h]", ("heads",)), read_from=str(doc.get("read_from", "a facts file")),
                   notes=tuple(notes))

    def tensor_parallel_refusal(self, kind: str, tp_size: int) -> str | None:
        """Why site ``kind`` cannot be steered or probed at tensor-parallel size ``tp_size`` (None: it can).

        >>> site_table("cohere", "vllm").tensor_parallel_refusal("mlp_out", 1) is None
        True
        """
        if tp_size > 1 and kind in self.partial_under_tp:
            return (f"on vLLM's {self.family} layers {kind} is each tensor-parallel rank's partial sum (the layer "
                    "all-reduces attention and MLP together); steer resid_post, or run with tensor parallel size 1")
        return None

    def to_json(self) -> dict:
        return {
            "read_from": self.read_from,
            "layers": self.layers,
            "final_norm": self.final_norm,
            "resid_pre[0]": self.resid_pre0.to_json(),
            "resid_post[l]": self.resid_post.to_json(),
            "resid_pre[l]": "resid_post[l-1] for l >= 1",
            "attn_out[l]": self.attn_out.to_json(),
            "mlp_out[l]": self.mlp_out.to_json(),
            "head[l, h]": self.head.to_json(),
            "notes": list(self.notes),
            **({"partial_under_tensor_parallel": list(self.partial_under_tp)} if self.partial_under_tp else {}),
        }


def _table(family: str, backend: str, root: str, norm: str, attn: str, mlp: str, head: str, *, read_from: str,
           stream_in: str = "input", stream_out: str = "output", notes=(), partial=()) -> SiteTable:
    """A table whose every site is a hook on ``root.{l}`` or a module below it (the paths after ``root.{l}.``)."""
    return SiteTable(
        family, backend, root, norm,
        resid_pre0=Hook(f"{root}.0", "pre", stream_in),
        resid_post=Hook(root + ".{l}", "post", stream_out),
        attn_out=Hook(root + ".{l}." + attn, "post", "output"),
        mlp_out=Hook(root + ".{l}." + mlp, "post", "output"),
        head=Hook(root + ".{l}." + head, "pre", "heads"),
        read_from=read_from, notes=tuple(notes), partial_under_tp=tuple(partial),
    )


def hf_table(family: str, root: str, attn: str, mlp: str, head: str, norm: str, notes=(), *,
             read_from: str = HF_READ_FROM) -> SiteTable:
    """An hf table of the usual shape: layer ``root.{l}``, and ``attn``, ``mlp`` and the heads' ``head``
    (paths below it); also what a guessed facts file starts from (:func:`steerc.runtime.hf.guess_sites`)."""
    return _table(family, "hf", root, norm, attn, mlp, head, read_from=read_from, notes=notes)


_SANDWICH = "Gemma-2/3 sandwich norms: attn_out/mlp_out are the normed outputs actually added to the stream"
_POST_NORMS = ("OLMo-2 post-norms (no input norms): attn_out/mlp_out are the normed outputs actually added to "
               "the stream")
_SCALED = ("Granite: attn_out/mlp_out are the block outputs before residual_multiplier; the stream receives "
           "residual_multiplier * attn_out (and * mlp_out); resid_pre[0] is the embedding times embedding_multiplier")
_PARALLEL = "Cohere parallel residual: x + attn(ln(x)) + mlp(ln(x)), one input norm"
_MOE = "mixture of experts: mlp_out is the sparse block's output (routed experts' weighted sum)"
_SHARED = ("mixture of experts: mlp_out is the sparse block's output, shared expert included (its sigmoid gate "
           "applied)")
_MOE_TABLES = {"mixtral": _MOE, "qwen2_moe": _SHARED, "qwen3_moe": _MOE, "olmoe": _MOE}
_SINKS = ("gpt-oss: head[l, h] is o_proj's input columns of head h; attention sinks only change the softmax "
          "(a per-head logit in its denominator), and every other layer attends in a sliding window")

_HF_TABLES = {
    **{
        fam: hf_table(fam, "model.layers", "self_attn", "mlp", "self_attn.o_proj", "model.norm")
        for fam in ("llama", "mistral", "qwen2", "qwen3", "gemma")
    },
    **{
        fam: hf_table(fam, "model.layers", "post_attention_layernorm", "post_feedforward_layernorm",
                 "self_attn.o_proj", "model.norm", [_SANDWICH])
        for fam in ("gemma2", "gemma3_text")
    },
    "phi3": hf_table("phi3", "model.layers", "resid_attn_dropout", "resid_mlp_dropout", "self_attn.o_proj",
                     "model.norm",
                     ["merged qkv_proj and gate_up_proj; the residual dropouts carry each block's contribution"]),
    "gpt2": hf_table("gpt2", "transformer.h", "attn", "mlp", "attn.c_proj", "transformer.ln_f",
                ["attn includes c_proj and its bias; c_proj is a Conv1D whose input is the concatenated heads"]),
    "gpt_neox": hf_table("gpt_neox", "gpt_neox.layers", "post_attention_dropout", "post_mlp_dropout", "attention.dense",
                    "gpt_neox.final_layer_norm",
                    ["parallel residual (use_parallel_residual): x + attn(ln1(x)) + mlp(ln2(x))"]),
    "olmo2": hf_table("olmo2", "model.layers", "post_attention_layernorm", "post_feedforward_layernorm",
                 "self_attn.o_proj", "model.norm", [_POST_NORMS]),
    "granite": hf_table("granite", "model.layers", "self_attn", "mlp", "self_attn.o_proj", "model.norm", [_SCALED]),
    "cohere": hf_table("cohere", "model.layers", "self_attn", "mlp", "self_attn.o_proj", "model.norm", [_PARALLEL]),
    **{fam: hf_table(fam, "model.layers", "self_attn", "mlp", "self_attn.o_proj", "model.norm", [note])
       for fam, note in _MOE_TABLES.items()},
    "gpt_oss": hf_table("gpt_oss", "model.layers", "self_attn", "mlp", "self_attn.o_proj", "model.norm",
                   [_MOE + "; GptOssMLP returns (hidden, router_scores), element 0 is the site", _SINKS]),
}


_FUSED = "layers return (hidden_states, residual); the residual stream is their sum"
_REDUCED = ("the MoE block (Mixtral's is block_sparse_moe, transformers' mlp) adds any shared expert and "
            "all-reduces inside, in its FusedMoE runner")
_ROW_PARALLEL = "o_proj is a RowParallelLinear returning (out, bias); its input holds this rank's heads"


def _vllm_fused(family: str, attn: str, mlp: str, notes=(), read_from: str = f"vLLM {VLLM_READ_FROM}",
                attn_module: str = "self_attn", stream_in: str = "input1") -> SiteTable:
    return _table(family, "vllm", "model.layers", "model.norm", attn, mlp, f"{attn_module}.o_proj",
                  read_from=read_from, stream_in=stream_in, stream_out="fused_pair",
                  notes=(_FUSED, _ROW_PARALLEL, *notes))


def _vllm_plain(family: str, attn: str, mlp: str, notes=(), partial=()) -> SiteTable:
    """vLLM layers ``forward(positions, hidden_states[, residual])`` whose first output is the whole stream."""
    return _table(family, "vllm", "model.layers", "model.norm", attn, mlp, "self_attn.o_proj", read_from=VLLM_032,
                  stream_in="input1", notes=(_ROW_PARALLEL, *notes), partial=partial)


_VLLM_TABLES = {
    **{fam: _vllm_fused(fam, "self_attn", "mlp") for fam in ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")},
    **{
        fam: _vllm_fused(fam, "post_attention_layernorm", "post_feedforward_layernorm", [_SANDWICH])
        for fam in ("gemma2", "gemma3_text")
    },
    "gpt2": _table("gpt2", "vllm", "transformer.h", "transformer.ln_f", "attn", "mlp", "attn.c_proj",
                   read_from=f"vLLM {VLLM_READ_FROM}",
                   notes=["blocks take and return one tensor, the full residual stream"]),
    "gpt_neox": _table("gpt_neox", "vllm", "model.layers", "model.final_layer_norm", "attention.dense", "mlp",
                       "attention.dense",
                       read_from=f"vLLM {VLLM_READ_FROM} (Transformers backend; activations carry a leading batch "
                                 "of 1)",
                       notes=["vLLM <= 0.31 had a native GPT-NeoX under gpt_neox.*; steerc targets the "
                              "Transformers backend"]),
    "olmo2": _table("olmo2", "vllm", "model.layers", "model.norm", "post_attention_layernorm",
                    "post_feedforward_layernorm", "self_attn.o_proj",
                    read_from=f"{VLLM_032} (Transformers backend: transformers' own Olmo2DecoderLayer modules)",
                    notes=[_POST_NORMS]),
    "granite": _vllm_plain("granite", "self_attn", "mlp", [
        "layers take (positions, hidden_states) and return the residual stream", _SCALED]),
    "cohere": _vllm_plain("cohere", "self_attn", "mlp", [
        "layers return (hidden_states, residual): hidden_states is the whole stream, residual the layer's input "
        "(the next layer ignores it)", _PARALLEL,
        "o_proj and down_proj do not all-reduce (reduce_results=False): the layer all-reduces attn + mlp once, so "
        "under tensor parallelism attn_out and mlp_out are per-rank partial sums (refused there)"],
        partial=("attn_out", "mlp_out")),
    **{fam: _vllm_fused(fam, "self_attn", "block_sparse_moe" if fam == "mixtral" else "mlp", [_REDUCED, note],
                        read_from=VLLM_032)
       for fam, note in _MOE_TABLES.items()},
    "gpt_oss": _vllm_fused("gpt_oss", "attn", "mlp", [
        "gpt-oss layers are forward(hidden_states, positions, residual): resid_pre[0] is input 0; attention is "
        "`attn` (transformers: self_attn)", _REDUCED, _MOE, _SINKS], read_from=VLLM_032, attn_module="attn",
        stream_in="input"),
}

TABLES = {"hf": _HF_TABLES, "vllm": _VLLM_TABLES}


def site_table(family: str, backend: str) -> SiteTable:
    """The site table of a family on a backend; a clear error for a family without one."""
    try:
        return TABLES[backend][family]
    except KeyError:
        known = ", ".join(sorted(TABLES.get(backend, {})))
        raise ValueError(
            f"steerc has no {backend} site table for the `{family}` family, so it cannot place hooks; "
            f"families with one: {known}"
        ) from None
