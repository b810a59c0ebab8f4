"""What the benchmarks share: the model they measure on."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
# The examples the clone ships (a copy of the conformance examples); STEERC_EXAMPLES points elsewhere.
EXAMPLES = os.environ.get("STEERC_EXAMPLES", os.path.join(HERE, "..", "tests", "fixtures", "examples"))


def load_model(prompt: str, *, byte_bpe: bool = False):
    """(model, tokenizer or None, inputs, label): SmolLM2-135M-Instruct if installed, else a random Llama.

    The fallback has SmolLM2's shape (hidden 576, 30 layers) and random
    weights; with ``byte_bpe`` it gets a 512-token in-memory tokenizer (for
    constraints, which need one), else random prompt ids and no tokenizer.
    """
    import torch

    from steerc.runtime.models import encode_prompt, smollm2_path
    from steerc.runtime.models import load_model as load_hf

    path = smollm2_path()
    if path is not None:
        model, tok = load_hf(path)
        return model, tok, encode_prompt(tok, prompt, chat=True), "SmolLM2-135M-Instruct (GGUF, float32)"
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(os.path.join(EXAMPLES, "models", "real", "smollm2-135m-instruct"))
    if not byte_bpe:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        ids = torch.randint(3, cfg.vocab_size, (1, 24))
        return model, None, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "random Llama 576x30"
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from tokenizer_util import byte_bpe as make_tokenizer

    tok = make_tokenizer(512)
    cfg.vocab_size = 512
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return model, tok, tok(prompt, return_tensors="pt"), "random Llama 576x30, byte BPE 512"
