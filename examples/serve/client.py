"""Send a steered request to a vLLM server that runs the steerc plugin.

    steerc compile examples/smollm2/joy.steer --target serve -o out/joy --model .cache/engine-models/smollm2
    steerc serve .cache/engine-models/smollm2 --port 8000 -- --dtype float32 &   # vLLM's server + the plugin
    python examples/serve/client.py out/joy "Describe a rainy Monday morning." [http://127.0.0.1:8000/v1]

Each request carries its own plan (and its artifacts, verified by hash on the
server) plus a cache salt derived from the plan; requests without steering
fields are served unsteered in the same batches.
"""

from __future__ import annotations

import sys

from steerc.serve_client import request_fields


def main(folder: str, prompt: str, base_url: str = "http://127.0.0.1:8000/v1") -> int:
    from openai import OpenAI  # pip install openai

    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    for label, fields in (("unsteered", {}), ("steered", request_fields(folder))):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=60, temperature=0.0, **fields)
        print(f"--- {label} ---\n{reply.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
