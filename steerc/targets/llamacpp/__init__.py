"""The llamacpp target: control vectors for llama.cpp (``lower``: the plan to one direction per layer, and
what it refuses; ``emit``: the GGUF; ``target``: its seat)."""
