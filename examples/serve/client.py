"""Send a steered request to a vLLM server that runs the steerc plugin.

    steerc compile examples/smollm2/joy.steer --target serve -o out/joy --model .cache/engine-models/smollm2
    steerc serve .cache/engine-models/smollm2 --port 8000 -- --dtype float32 &   # vLLM's server + the plugin
    python examples/serve/client.py out/joy "Describe a rainy Monday morning." [--url http://127.0.0.1:8000/v1]

A plan with per-request params (``param strength = 4.0 in [0, 8] per request``)
takes values: ``--param strength=2`` (repeatable).

Each request carries its own plan (and its artifacts, verified by hash on the
server) plus a cache salt derived from the plan (and the values); requests
without steering fields are served unsteered in the same batches.
"""

from __future__ import annotations

import argparse
import sys

from steerc.serve_client import request_fields


def _param(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one plain and one steered chat completion")
    parser.add_argument("folder", help="the folder `steerc compile --target serve` wrote")
    parser.add_argument("prompt")
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI API base URL")
    parser.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                        help="a per-request param's value (repeatable)")
    args = parser.parse_args(argv)
    from openai import OpenAI  # pip install openai

    client = OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    steered = request_fields(args.folder, params=dict(args.param) or None)
    for label, fields in (("unsteered", {}), ("steered", steered)):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": args.prompt}], max_tokens=60, temperature=0.0,
            **fields)
        print(f"--- {label} ---\n{reply.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
