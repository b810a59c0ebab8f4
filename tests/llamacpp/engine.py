"""llama.cpp through llama-cpp-python's low-level bindings: its GGUF reader, its control-vector call, greedy
decoding and the layer outputs its graph computes.

llama-cpp-python 0.3.36 binds ``llama_set_adapter_cvec`` but not llama.cpp's file loader,
``common_control_vector_load`` (C++, in libllama-common, which the package does not load). So
:func:`load_control_vector` is that loader line for line (``common/common.cpp``,
``common_control_vector_load_one``, llama.cpp 0c1e570) over ggml's own GGUF reader
(``gguf_init_from_file``, ``ggml_get_tensor``, ``ggml_n_dims``, ``ggml_nelements``,
``ggml_get_data_f32`` from libggml-base): every byte is read and judged by llama.cpp's code, only the
loop that places directions in the buffer is retold here. :meth:`Engine.set_control_vector` then
makes the call ``common_init_from_params`` makes for ``--control-vector``: layers 1 to ``n_layer``.
"""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

ENV_FLAG = "STEERC_LLAMACPP_TESTS"


def require_llama_cpp():
    """llama_cpp, or a skip that says how to get it; a failure under CI=true or STEERC_LLAMACPP_TESTS=1."""
    try:
        import llama_cpp
    except ImportError as exc:
        if os.environ.get(ENV_FLAG) == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"the llama.cpp environment is missing llama_cpp ({exc}); ./dev test-llamacpp builds it",
                        pytrace=False)
        pytest.skip("llama-cpp-python is not installed here: ./dev test-llamacpp builds its environment and runs "
                    "these tests", allow_module_level=True)
    return llama_cpp


L = require_llama_cpp()
_GGML = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))


def _fn(name: str, restype, *argtypes):
    f = getattr(_GGML, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


_P = ctypes.c_void_p
gguf_init_from_file = _fn("gguf_init_from_file", _P, ctypes.c_char_p, _InitParams)
gguf_free = _fn("gguf_free", None, _P)
gguf_get_n_tensors = _fn("gguf_get_n_tensors", ctypes.c_int64, _P)
gguf_get_tensor_name = _fn("gguf_get_tensor_name", ctypes.c_char_p, _P, ctypes.c_int64)
gguf_get_tensor_type = _fn("gguf_get_tensor_type", ctypes.c_int, _P, ctypes.c_int64)
ggml_free = _fn("ggml_free", None, _P)
ggml_get_tensor = _fn("ggml_get_tensor", _P, _P, ctypes.c_char_p)
ggml_n_dims = _fn("ggml_n_dims", ctypes.c_int, _P)
ggml_nelements = _fn("ggml_nelements", ctypes.c_int64, _P)
ggml_nrows = _fn("ggml_nrows", ctypes.c_int64, _P)
ggml_get_data_f32 = _fn("ggml_get_data_f32", ctypes.POINTER(ctypes.c_float), _P)
ggml_get_name = _fn("ggml_get_name", ctypes.c_char_p, _P)
ggml_backend_tensor_get = _fn("ggml_backend_tensor_get", None, _P, _P, ctypes.c_size_t, ctypes.c_size_t)


@L.llama_log_callback
def _quiet(level, text, user):  # llama.cpp and ggml log through this (refused files, model loading)
    pass


L.llama_log_set(_quiet, None)
L.llama_backend_init()

_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _stoi(text: str) -> int:
    """``std::stoi`` inside llama.cpp's ``try``: leading space, a sign, digits, the rest ignored; -1 on failure."""
    m = _STOI.match(text)
    if m is None or not -2 ** 31 <= int(m.group(1)) < 2 ** 31:
        return -1
    return int(m.group(1))


def load_control_vector(path: str) -> tuple[int, np.ndarray] | None:
    """(n_embd, data) as ``common_control_vector_load`` makes them for one file at strength 1, or None
    where it refuses the file (``n_embd == -1``). ``data`` starts at layer 1: ``direction.N`` is at
    ``n_embd * (N - 1)``."""
    ctx = ctypes.c_void_p()
    g = gguf_init_from_file(path.encode(), _InitParams(False, ctypes.pointer(ctx)))
    if not g:
        return None
    try:
        n_embd, data = -1, np.zeros(0, dtype=np.float32)
        n_tensors = gguf_get_n_tensors(g)
        for i in range(n_tensors):
            name = gguf_get_tensor_name(g, i).decode("utf-8", "replace")
            head, dot, tail = name.partition(".")
            layer_idx = _stoi(tail) if dot and head == "direction" else -1
            if layer_idx <= 0:
                return None
            tensor = ggml_get_tensor(ctx, gguf_get_tensor_name(g, i))
            if gguf_get_tensor_type(g, i) != 0 or ggml_n_dims(tensor) != 1:  # GGML_TYPE_F32, 1-D
                return None
            n = ggml_nelements(tensor)
            if n_embd == -1:
                n_embd = n
            elif n != n_embd:
                return None
            if data.size < n_embd * layer_idx:
                data = np.concatenate([data, np.zeros(n_embd * layer_idx - data.size, dtype=np.float32)])
            src = np.ctypeslib.as_array(ggml_get_data_f32(tensor), shape=(n_embd,)) if n_embd else np.zeros(0)
            data[n_embd * (layer_idx - 1):n_embd * layer_idx] += src
        return None if n_embd == -1 else (n_embd, data)
    finally:
        gguf_free(g)
        if ctx.value:
            ggml_free(ctx)


class Engine:
    """One llama.cpp context on a model file: greedy tokens, and (``capture``) the named graph tensors of
    a forward pass, read through the graph's eval callback as cvector-generator reads ``l_out``."""

    def __init__(self, path: str, capture=(), n_ctx: int = 256):
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        assert self.model, f"llama.cpp could not load {path}"
        params = L.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        # One thread: on a shared two-core machine llama.cpp's spinning threads wait on each other.
        params.n_threads = params.n_threads_batch = 1
        self.capture, self.seen = set(capture), {}
        if self.capture:
            self._callback = L.ggml_backend_sched_eval_callback(self._eval)
            params.cb_eval = self._callback
        self.ctx = L.llama_init_from_model(self.model, params)
        self.n_embd = L.llama_model_n_embd(self.model)
        self.n_layer = L.llama_model_n_layer(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self._cvec = None

    def close(self) -> None:
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def _eval(self, tensor, ask, user):
        name = ggml_get_name(tensor).decode()
        if ask:
            return name in self.capture
        if name in self.capture:
            n, rows = ggml_nelements(tensor), ggml_nrows(tensor)
            out = np.empty(n, dtype=np.float32)
            ggml_backend_tensor_get(tensor, out.ctypes.data, 0, n * 4)
            self.seen[name] = out.reshape(rows, n // rows)
        return True

    def set_control_vector(self, loaded: tuple[int, np.ndarray] | None) -> None:
        """``--control-vector``'s call (layers 1 to n_layer), or none (``data = NULL`` clears it)."""
        if loaded is None:
            rc = L.llama_set_adapter_cvec(self.ctx, None, 0, self.n_embd, -1, -1)
        else:
            n_embd, data = loaded
            self._cvec = np.ascontiguousarray(data, dtype=np.float32)  # llama.cpp copies it; keep it anyway
            rc = L.llama_set_adapter_cvec(self.ctx, self._cvec.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                          self._cvec.size, n_embd, 1, self.n_layer)
        assert rc == 0, f"llama_set_adapter_cvec returned {rc}"

    def _decode(self, tokens, start: int, every: bool) -> None:
        batch = L.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = every or i == len(tokens) - 1
            batch.n_tokens = len(tokens)
            assert L.llama_decode(self.ctx, batch) == 0
        finally:
            L.llama_batch_free(batch)

    def _clear(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def forward(self, tokens) -> dict[str, np.ndarray]:
        """The captured tensors of one pass over ``tokens`` (every position an output), [tokens, n_embd]."""
        self._clear()
        self.seen = {}
        self._decode(tokens, 0, True)
        return dict(self.seen)

    def greedy(self, tokens, n: int) -> list[int]:
        self._clear()
        self._decode(tokens, 0, False)
        out = []
        for step in range(n):
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
            out.append(int(np.argmax(logits)))
            self._decode([out[-1]], len(tokens) + step, False)
        return out
