"""Vector files in and out: safetensors, .npy and .pt banks (``vectors``), GGUF (``gguf``) and llama.cpp
control vectors (``controlvector``)."""
