"""``steerc capture SITES --model M --data TEXTS -o acts.safetensors [--read last|mean|completion] [--chat]``
``[--engine hf|vllm]``: activations for the user's own analysis (spec/derive.md, *Capture*).

    steerc capture "resid_post[0:30]" --model smollm2 --data examples/smollm2/cheerful.txt -o acts.safetensors
"""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_OK, UsageError
from steerc.cli.common import data_source, fail_with, model_path_for
from steerc.core.jsonio import dumps as json_dumps

FORMAT = "steerc.capture/1"
METADATA_KEY = "steerc.capture"


def add_arguments(cmd) -> None:
    cmd.add_argument("sites", metavar="SITES",
                     help='the sites to read, in selector syntax: "resid_post[0:30]", "mlp_out[4]", "head[5, 0:3]"')
    cmd.add_argument("--model", required=True, metavar="MODEL",
                     help="a model name (smollm2), a .gguf file, or a Hugging Face model folder")
    cmd.add_argument("--data", required=True, metavar="TEXTS",
                     help='the texts: a .jsonl of {"text"} objects (optionally with "prompt"), or a text file, '
                          "one per line")
    cmd.add_argument("--read", choices=("last", "mean", "completion"), default="last",
                     help="the last token (default), the mean of every token, or the mean of the text's tokens "
                          "after its prompt")
    cmd.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    cmd.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                     help="hf (default): transformers with steerc's hooks; vllm: inside the vllm target's engine")
    cmd.add_argument("-o", "--out", dest="output", required=True, metavar="OUT.safetensors",
                     help="where to write the arrays: one [texts, width] float32 tensor per site")
    cmd.add_argument("--batch-size", type=int, default=8, metavar="N", help="texts per forward pass (hf)")
    cmd.add_argument("--format", choices=("text", "json"), default="text", help="how to print the result")


def _texts(path: str) -> tuple[list[tuple[str | None, str]], str]:
    """(prompt or None, text) per text, and the sha256 of the file's bytes (raises DataError)."""
    from steerc.derive.data import parse_lines, sha256_of

    src = data_source(path)
    if path.endswith(".jsonl"):
        from steerc.derive.data import DataError
        from steerc.diagnostics import Diagnostic
        from steerc.diagnostics.codes import INVALID_DATA
        from steerc.eval.data import parse_items

        items = parse_items(src)
        pairs = [i for i in items.items if i.kind != "cost"]
        if pairs:
            start = sum(len(line) + 1 for line in src.text.split("\n")[:pairs[0].line - 1])
            raise DataError([Diagnostic.error(INVALID_DATA, "capture reads texts: this line is a behaviour pair",
                                              src.span(start, start + 1),
                                              help='one {"text": ...} per line (optionally with "prompt")')],
                            {src.name: src})
        return [(i.prompt, i.text) for i in items.items], sha256_of(src)
    return [(None, line) for line in parse_lines(src)], sha256_of(src)


def run(args) -> int:
    from steerc.cli.derive import load_checked, model_facts, sites_arg, vllm_reader
    from steerc.derive import activations as A
    from steerc.derive.bank import write_arrays
    from steerc.derive.data import DataError

    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    try:
        texts, data_sha = _texts(args.data)
    except DataError as exc:
        return fail_with(args, exc.diagnostics, exc.sources)
    facts = model_facts(args)
    args.at = args.sites
    sites = sites_arg(args, facts, label="SITES", one_per_layer=False)
    path = model_path_for(args)

    def items_of(tokenizer):
        out = []
        for prompt, text in texts:
            ids, start = A.encode(tokenizer, text, prompt, args.chat)
            a, b = A.positions(len(ids), start, args.read)
            if b <= a:
                raise UsageError("a text has no tokens after its prompt to read (--read completion)")
            out.append((ids, a, b))
        return out

    if args.engine == "vllm":
        with vllm_reader(path, facts, "capture") as (tokenizer, reader):
            acts = reader(items_of(tokenizer), sites)
    else:
        model, tokenizer = load_checked(path, facts, args)
        acts = A.read(model, tokenizer, facts, items_of(tokenizer), sites, batch_size=args.batch_size,
                      label=f"reading {len(texts)} texts at {len(sites)} sites")
    info = {
        "format": FORMAT,
        "engine": args.engine,
        "model": {"fingerprint": facts.fingerprint, "family": facts.family, "layers": facts.layers,
                  "hidden": facts.hidden, "weights_sha256": A.model_sha256(path),
                  "name": os.path.basename(path.rstrip("/"))},
        "sites": [s.text for s in sites],
        "reading": A.Reading(args.chat, args.read).to_json(),
        "data": {"file": os.path.basename(args.data), "sha256": data_sha, "texts": len(texts)},
    }
    write_arrays(args.output, {s.key: acts[s] for s in sites}, METADATA_KEY, info)
    if args.format == "json":
        print(json_dumps({"output": args.output, **info}, indent=2, sort_keys=True))
        return EXIT_OK
    width = sorted({int(acts[s].shape[1]) for s in sites})
    print(f"wrote {args.output}: {len(sites)} site{'s' if len(sites) > 1 else ''} x {len(texts)} texts "
          f"(width {', '.join(map(str, width))}, {args.read} token{'s' if args.read != 'last' else ''}, "
          f"engine {args.engine})", file=sys.stdout)
    return EXIT_OK
