"""``steerc capture SITES|PROGRAM.steer --model M --data TEXTS -o acts.safetensors``
``[--read last|mean|completion|all] [--chat] [--engine hf|vllm]``: activations for the user's own analysis
(spec/derive.md, *Capture*).

    steerc capture "resid_post[0:30]" --model smollm2 --data examples/smollm2/cheerful.txt -o acts.safetensors
    steerc capture examples/smollm2/joy.steer --model smollm2 --data examples/smollm2/cheerful.txt -o steered.safetensors

With a program, the sites are its interventions' and probes' and the texts are read as the program
steers them (installed on HF; the engine's plan on vLLM).
"""

from __future__ import annotations

import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError
from steerc.cli.arguments import check_output
from steerc.cli.common import data_source, fail_with, model_path_for
from steerc.cli.engines import add_engine_argument
from steerc.core.jsonio import dumps as json_dumps

FORMAT = "steerc.capture/1"
METADATA_KEY = "steerc.capture"


def add_arguments(cmd) -> None:
    cmd.add_argument("sites", metavar="SITES|PROGRAM.steer",
                     help='the sites to read, in selector syntax: "resid_post[0:30]", "mlp_out[4]", "head[5, 0:3]"; '
                          "or a .steer program: its sites, read as it steers them")
    cmd.add_argument("--model", required=True, metavar="MODEL",
                     help="a model name (smollm2), a .gguf file, or a Hugging Face model folder")
    cmd.add_argument("--data", required=True, metavar="TEXTS",
                     help='the texts: a .jsonl of {"text"} objects (optionally with "prompt"), or a text file, '
                          "one per line")
    cmd.add_argument("--read", choices=("last", "mean", "completion", "all"), default="last",
                     help="the last token (default), the mean of every token, the mean of the text's tokens "
                          "after its prompt, or every token ([texts, longest, width], zero past a text's end)")
    cmd.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    add_engine_argument(cmd)
    cmd.add_argument("-o", "--out", dest="output", required=True, metavar="OUT.safetensors",
                     help="where to write the arrays: one [texts, width] float32 tensor per site, and "
                          "lengths (int64 [texts], the tokens each text was read at)")
    cmd.add_argument("--batch-size", type=int, default=8, metavar="N", help="texts per forward pass (hf)")
    cmd.add_argument("--root", metavar="DIR",
                     help="with a program: the project root for its paths and its steer.toml (default: nearest "
                          "steer.toml)")
    cmd.add_argument("--set", metavar="NAME=VALUE", action="append", default=[], dest="overrides",
                     help="with a program: a param's value while it steers (repeatable; wins over steer.toml's "
                          "[params])")
    cmd.add_argument("--format", choices=("text", "json"), default="text", help="how to print the result")


def _texts(path: str):
    """(prompt or None, text) per text, the sha256 of the file's bytes, and (the span of each text's key or
    line, the file's Source) for the diagnostics found once the texts are tokenized (raises DataError)."""
    from steerc.derive.data import lines_at, sha256_of

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
        where = [i.spans["text"] for i in items.items]
        return [(i.prompt, i.text) for i in items.items], sha256_of(src), (where, src)
    lines = lines_at(src)
    return [(None, line) for line, _ in lines], sha256_of(src), ([span for _, span in lines], src)


def _program(args, facts):
    """(plan, its sites in order, its provenance) for a ``.steer`` program: the sites of its interventions
    and probes, read as it steers at the params ``run``, ``eval`` and ``compile`` use (its steer.toml's
    ``[params]``, then ``--set``)."""
    from steerc.api import check_source
    from steerc.cli.common import checked_project, options_from, read_text
    from steerc.passes.lower_plan import concrete_sites
    from steerc.runtime.capture import Site

    path = os.path.abspath(args.sites)
    options = options_from(args, checked_project(args, args.sites))
    result = check_source(read_text(args.sites), args.sites, path=path, options=options, facts=facts)
    if not result.ok:
        print(result.render(), file=sys.stderr)
        raise SystemExit(EXIT_ERRORS)
    patterns = [i.site for i in result.checked.interventions] + [p.site for p in result.checked.probes.values()]
    sites = list(dict.fromkeys(Site(p.kind, layer, head) for p in patterns for layer, head in concrete_sites(p, facts)))
    if not sites:
        raise UsageError(f"{args.sites} steers and probes no site: nothing to read")
    params = dict(sorted(result.checked.params.items()))  # the values it steered at
    return result.plan, sites, {"file": os.path.basename(path), "sha256": result.checked.source_sha256,
                                **({"params": params} if params else {})}


def run(args) -> int:
    from steerc.cli.derive import booted, model_facts, sites_arg
    from steerc.derive import activations as A
    from steerc.derive.bank import write_arrays
    from steerc.derive.data import DataError
    from steerc.runtime import capture as C

    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    program_file = args.sites.endswith(".steer")
    if not program_file and (args.overrides or args.root is not None):
        raise UsageError(f"{'--set' if args.overrides else '--root'} goes with a .steer program, not sites")
    check_output(args, ("-o", "--out"), args.output, inputs=(args.data, args.sites if program_file else ""))
    try:
        texts, data_sha, (spans, src) = _texts(args.data)
    except DataError as exc:
        return fail_with(args, exc.diagnostics, exc.sources)
    facts = model_facts(args)
    plan = program = None
    if program_file:
        plan, sites, program = _program(args, facts)
    else:
        args.at = args.sites
        sites = sites_arg(args, facts, label="SITES", one_per_layer=False)
    path = model_path_for(args)

    all_ = args.read == "all"

    def items_of(tokenizer, context):
        try:
            items = C.items_of(tokenizer, [t if p is None else (p, t) for p, t in texts], args.read, args.chat,
                               context=context, spans=spans, sources={src.name: src})
            C.check_size(items, sites, facts, args.read)
        except C.CaptureError as exc:
            if exc.diagnostics[0].span is not None:  # a text over the model's context: at its line
                raise SystemExit(fail_with(args, exc.diagnostics, exc.sources)) from None
            raise UsageError(exc.diagnostics[0].message) from None
        return items

    with booted(args, path, facts, plan, command="capture") as session:
        items = items_of(session.tokenizer, session.context)
        reader = session.reader(facts, per_position=all_)
        with session.steering():
            if reader is not None:  # an engine that reads the model itself
                acts = reader(items, sites)
            else:  # a transformers model here, read by steerc's hooks
                acts = A.read(session.model, session.tokenizer, facts, items, sites, batch_size=args.batch_size,
                              per_position=all_, label=f"reading {len(texts)} texts at {len(sites)} sites")
    answer = C.captured(acts, sites, items, args.read)
    info = {
        "format": FORMAT,
        "engine": args.engine,
        "model": {"fingerprint": facts.fingerprint, "family": facts.family, "layers": facts.layers,
                  "hidden": facts.hidden, "weights_sha256": A.model_sha256(path),
                  "name": os.path.basename(path.rstrip("/"))},
        "sites": [s.text for s in sites],
        **({"program": program} if program is not None else {}),
        "reading": A.Reading(args.chat, args.read).to_json(),
        "data": {"file": os.path.basename(args.data), "sha256": data_sha, "texts": len(texts)},
    }
    try:
        write_arrays(args.output, {**{s.key: answer[s.text] for s in sites}, "lengths": answer.lengths},
                     METADATA_KEY, info)
    except OSError as exc:  # what the check before the run cannot see (a full disk)
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    if args.format == "json":
        print(json_dumps({"output": args.output, **info}, indent=2, sort_keys=True))
        return EXIT_OK
    width = sorted({int(answer[s.text].shape[-1]) for s in sites})
    print(f"wrote {args.output}: {len(sites)} site{'s' if len(sites) > 1 else ''} x {len(texts)} texts "
          f"(width {', '.join(map(str, width))}, {args.read} token{'s' if args.read != 'last' else ''}"
          f"{f', up to {answer.lengths.max(initial=0)} each' if all_ else ''}, "
          f"engine {args.engine})", file=sys.stdout)
    return EXIT_OK
