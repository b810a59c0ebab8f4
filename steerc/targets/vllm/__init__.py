"""The vLLM target: ``plan.msgpack`` (see :mod:`steerc.targets.vllm.wire`)."""
