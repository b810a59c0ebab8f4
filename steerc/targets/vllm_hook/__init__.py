"""IBM vLLM-Hook's intervention spec: a dialect of serve (``--target serve --dialect vllm-hook``)."""
