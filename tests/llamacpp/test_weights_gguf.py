"""``--target weights`` through llama.cpp (issue 36): the folded checkpoint, converted to a float32 GGUF with
llama.cpp's own ``convert_hf_to_gguf.py``, generates the HF target's greedy tokens for the same program.

The converter is llama.cpp's, never steerc's: it is looked for beside the installed llama_cpp package (a
source build's ``vendor/llama.cpp``) or at ``$STEERC_LLAMACPP_CONVERTER``. llama-cpp-python's wheel ships
no converter, so where none is found the test is skipped, saying so (even under ``./dev test-llamacpp``:
the check is only as strong as the converter that llama.cpp's build provides).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from engine import Engine, require_llama_cpp

L = require_llama_cpp()
CONVERTER = "convert_hf_to_gguf.py"
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]  # test_target_weights.PROMPT, which hf_target runs


def converter() -> str | None:
    """llama.cpp's converter script, where this build ships it."""
    given = os.environ.get("STEERC_LLAMACPP_CONVERTER")
    if given:
        return given if os.path.isfile(given) else None
    package = os.path.dirname(L.__file__)
    for root in (package, os.path.join(package, "vendor", "llama.cpp"),
                 os.path.join(os.path.dirname(package), "vendor", "llama.cpp")):
        path = os.path.join(root, CONVERTER)
        if os.path.isfile(path):
            return path
    return None


def test_folded_checkpoint_converted_to_gguf_generates_the_hf_targets_tokens(tmp_path):
    script = converter()
    if script is None:
        pytest.skip(f"this llama.cpp build ships no {CONVERTER} (llama-cpp-python's wheel has none); set "
                    "STEERC_LLAMACPP_CONVERTER to a llama.cpp checkout's script to run this check")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from test_target_weights import AFFINE, compile_weights, hf_target, model_folder

    model_folder(tmp_path)
    code, _, err = compile_weights(tmp_path, AFFINE)
    assert code == 0, err
    gguf = tmp_path / "folded.gguf"
    subprocess.run([sys.executable, script, str(tmp_path / "out"), "--outtype", "f32", "--outfile", str(gguf)],
                   check=True, capture_output=True, timeout=600)
    _, want = hf_target(str(tmp_path / "model"), AFFINE, str(tmp_path))
    engine = Engine(str(gguf))
    try:
        got = engine.greedy(PROMPT, 8)
    finally:
        engine.close()
    assert got == want, (got, want)
