"""``steerc derive``: steering vectors (``-o bank.safetensors``) or a probe threshold (``--calibrate``) from data.

    steerc derive --model smollm2 --data pairs.jsonl --at "resid_post[25%:75%]" --method all -o joy.safetensors
    steerc derive --model smollm2 --positive harmful.txt --negative harmless.txt --calibrate cast.steer --probe harmful
"""

from __future__ import annotations

import contextlib
import os
import sys

from steerc.cli import EXIT_ERRORS, EXIT_OK, UsageError, arguments
from steerc.cli.arguments import check_output, plot_path
from steerc.cli.common import argument_source, data_source, fail_with, load_unchecked, model_path_for
from steerc.cli.engines import add_engine_argument
from steerc.core.jsonio import dumps as json_dumps  # strict JSON (spec/json.md)
from steerc.core.limits import MAX_SEED
from steerc.diagnostics.codes import EMPTY_DATA


def add_arguments(cmd) -> None:
    cmd.add_argument("--model", required=True, metavar="MODEL",
                     help="a model name (smollm2), a .gguf file, or a Hugging Face model folder with weights and "
                          "tokenizer")
    data = cmd.add_argument_group("data (a JSONL file of pairs, or two text files with one example per line)")
    data.add_argument("--data", metavar="PAIRS.jsonl",
                      help='one {"positive": ..., "negative": ...} object per line (optionally "prompt": ...)')
    data.add_argument("--positive", metavar="FILE", help="examples that show the trait (one per line)")
    data.add_argument("--negative", metavar="FILE", help="examples that show its opposite (one per line)")
    data.add_argument("--chat", action="store_true",
                      help="wrap each text in the model's chat template (as the user's message; with a prompt, the "
                           "texts are the assistant's replies)")
    data.add_argument("--read", choices=("last", "mean", "completion"), default="last",
                      help="which tokens a text is read at: its last token (default, as repeng and "
                           "steering-vectors), the mean over all its tokens, or the mean over the completion "
                           "(pairs with a prompt)")
    out = cmd.add_argument_group("vectors")
    out.add_argument("--at", metavar="SITES",
                     help='sites and layers in steerc\'s selector syntax, e.g. "resid_post[25%%:75%%]", '
                          '"resid_pre[4:8]", "head[10, 3]"')
    out.add_argument("--method", action="append", metavar="METHOD",
                     help="mean_diff (default), pca_diff, pca_center, logistic, or all (repeatable)")
    out.add_argument("-o", "--output", metavar="OUT.safetensors", help="the per-layer bank to write")
    out.add_argument("--normalize", action="store_true", help="scale every row to unit norm")
    out.add_argument("--heldout", type=float, default=0.25, metavar="FRACTION",
                     help="the share of pairs held out to score each layer (default 0.25; 0 skips the scores)")
    out.add_argument("--seed", type=arguments.seed, default=0,
                     help=f"the seed of the held-out split, from 0 to {MAX_SEED} (default 0)")
    out.add_argument("--plot", metavar="OUT.png",
                     help="draw the held-out AUROC per layer and method, in the extension's format (png without "
                          "one; needs matplotlib: steerc[plot])")
    cal = cmd.add_argument_group("calibrate a probe (CAST's condition search)")
    cal.add_argument("--calibrate", metavar="PROGRAM.steer",
                     help="find the threshold of a probe of this program that best separates --positive (the "
                          "condition should hold) from --negative")
    cal.add_argument("--probe", metavar="NAME", help="the probe to calibrate")
    cal.add_argument("--write", metavar="PARAM",
                     help="also write the threshold into the program's project's steer.toml [params] as PARAM, the "
                          "param a gate of the program compares the probe with (`when PROBE > PARAM`)")
    run_ = cmd.add_argument_group("running")
    run_.add_argument("--batch-size", type=int, default=8, metavar="N", help="texts per forward pass (default 8)")
    add_engine_argument(run_)
    run_.add_argument("--no-cache", action="store_true",
                      help="read activations afresh (they are cached by model and data hash otherwise)")
    run_.add_argument("--format", choices=("text", "json"), default="text", help="how to print the result")


def _methods(args) -> list[str]:
    from steerc.derive.api import DeriveError, methods_of

    try:
        return methods_of(args.method or ["mean_diff"])
    except DeriveError as exc:
        raise UsageError(f"--{exc.diagnostics[0].message}") from None


def _read_data(args, paired: bool):
    """A Dataset (paired) or two example lists; raises DataError."""
    from steerc.derive import data as D

    if args.data and (args.positive or args.negative):
        raise UsageError("give --data, or --positive and --negative, not both")
    if args.data:
        ds = D.parse_pairs(data_source(args.data))
        if paired:
            return ds
        return [p.positive for p in ds.pairs], [p.negative for p in ds.pairs], ds.sha256
    if not (args.positive and args.negative):
        raise UsageError("give the data: --data PAIRS.jsonl, or --positive FILE and --negative FILE")
    pos, neg = data_source(args.positive), data_source(args.negative)
    return D.paired_lines(pos, neg) if paired else D.two_sets(pos, neg)


def model_facts(args):
    """The model's layout facts, read without its weights where possible: from its config, from a named
    model's shipped config, or for a .gguf file from its dequantized copy in the cache (loading it once
    when there is none yet)."""
    from steerc.cli.common import load_facts_or_diagnostic

    if args.model.endswith(".gguf") and os.path.isfile(args.model):
        from steerc.facts import load_facts
        from steerc.runtime.models import cache_complete, gguf_cache_folder

        folder = gguf_cache_folder(args.model)
        if not cache_complete(folder):
            from steerc.runtime.hf import facts_from_model

            model, tokenizer = load_unchecked(args.model)
            args.preloaded = (model, tokenizer)
            return facts_from_model(model)
        return load_facts(folder)
    facts, diagnostic, sources = load_facts_or_diagnostic(args.model)
    if diagnostic is not None:
        raise SystemExit(fail_with(args, [diagnostic], sources))
    return facts


def sites_arg(args, facts, label: str = "--at", one_per_layer: bool = True):
    """The concrete sites of --at (diagnostics point into the selector, shown as a one-line program)."""
    from steerc.derive.api import DeriveError, sites_of

    if not args.at:
        raise UsageError('--at is required: the sites to read, e.g. --at "resid_post[25%:75%]"')
    try:
        return sites_of(args.at, facts, label=label, one_per_layer=one_per_layer)
    except DeriveError as exc:
        if exc.diagnostics[0].span is None:
            raise UsageError(exc.diagnostics[0].message) from None
        raise SystemExit(fail_with(args, exc.diagnostics, exc.sources)) from None


def load_checked(path: str, facts, args=None):
    from steerc.runtime.hf import facts_from_model

    preloaded = getattr(args, "preloaded", None)
    model, tokenizer = preloaded if preloaded is not None else load_unchecked(path)
    live = facts_from_model(model)
    if live.fingerprint != facts.fingerprint:
        raise UsageError(f"{path}: the loaded model's layout differs from its config's ({live.family}, "
                         f"{live.layers} layers, hidden {live.hidden})")
    return model, tokenizer


@contextlib.contextmanager
def booted(args, path: str, facts, plan=None, command: str = "derive"):
    """``--engine``'s session on the weights at ``path``, steering as ``plan`` does (None: nothing), shut down on
    leaving (:func:`steerc.cli.engines.session`); a transformers model loads through :func:`load_checked`,
    against ``facts``."""
    from steerc.cli.engines import session

    with session(args, path, facts, plan, command=command, load=lambda p: load_checked(p, facts, args)) as booted:
        yield booted


def run(args) -> int:
    from steerc.derive.data import DataError

    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if not 0 <= args.heldout < 1:
        raise UsageError("--heldout is a fraction from 0 (no scores) up to, not including, 1")
    if args.write and not args.calibrate:
        raise UsageError("--write PARAM goes with --calibrate (it writes the calibrated threshold)")
    try:
        if args.calibrate:
            return _calibrate(args)
        return _derive(args)
    except DataError as exc:
        return fail_with(args, exc.diagnostics, exc.sources)


# ------------------------------------------------------------------------ derive


def _derive(args) -> int:
    from steerc.derive import activations as A
    from steerc.derive import bank, fit, heldout_scores
    from steerc.derive.api import DeriveError, check_request, provenance, read_pairs
    from steerc.derive.report import best_layer, plot, table

    if args.probe:
        raise UsageError("--probe goes with --calibrate")
    if args.output is None:
        raise UsageError("-o OUT.safetensors is required (the bank to write)")
    inputs = (args.data, args.positive, args.negative)
    check_output(args, ("-o", "--output"), args.output, inputs=inputs)
    if args.plot is not None:  # checked before the run, not after it
        args.plot = plot_path(args, args.plot, inputs=(*inputs, args.output))
    methods = _methods(args)
    dataset = _read_data(args, paired=True)
    try:
        check_request(dataset, methods, args.read)
    except DeriveError as exc:
        if exc.diagnostics[0].code == EMPTY_DATA:
            return fail_with(args, exc.diagnostics, exc.sources)
        from steerc.diagnostics import Diagnostic

        d = exc.diagnostics[0]
        source, span = argument_source(args, "--read")
        return fail_with(args, [Diagnostic.error(d.code, "--" + d.message, span, help=d.help)], {source.name: source})
    facts = model_facts(args)
    sites = sites_arg(args, facts)
    path = model_path_for(args)
    reading = A.Reading(args.chat, args.read)
    model_hash = A.model_sha256(path)
    key = A.cache_key(model_hash, dataset, reading, engine=args.engine)
    acts = {} if args.no_cache else A.cached(key, sites)
    missing = [s for s in sites if s not in acts]
    if missing:
        try:
            with booted(args, path, facts) as session:
                fresh = read_pairs(session.model, session.tokenizer, facts, dataset, missing, reading,
                                   batch_size=args.batch_size, reader=session.reader(facts), context=session.context)
        except DeriveError as exc:
            raise UsageError(exc.diagnostics[0].message.replace("(read completion)", "(--read completion)")) \
                from None
        A.store(key, fresh)
        acts.update(fresh)
    acts = {s: acts[s] for s in sites}
    rows, biases = fit(acts, methods, normalize=args.normalize)
    scores, held = heldout_scores(acts, methods, args.heldout, args.seed) if args.heldout else ({}, 0)
    info = provenance(facts, sites, methods, reading, args.normalize, dataset, args.heldout, args.seed, held,
                      scores, biases, os.path.basename(path.rstrip("/")), model_hash, engine=args.engine)
    try:
        bank.write(args.output, rows, info)
    except OSError as exc:  # what the check before the run cannot see (a full disk)
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    layers = [s.layer for s in sites]
    if args.plot and scores:
        try:
            plot(args.plot, scores, layers, sites[0].kind,
                 f"{os.path.basename(args.output)}: held-out AUROC, {len(dataset.pairs)} pairs")
        except OSError as exc:
            raise UsageError(f"cannot write the plot {args.plot}: {exc.strerror or exc}") from None
    if args.format == "json":
        print(json_dumps({"output": args.output, **info}, indent=2, sort_keys=True))
        return EXIT_OK
    shape = f"{len(sites)} layer{'s' if len(sites) > 1 else ''} x {facts.width(sites[0].kind)}"
    print(f"wrote {args.output}: {', '.join(methods)} at {_sites_text(sites)} ({shape}), "
          f"from {len(dataset.pairs)} pairs ({args.read} token{'s' if args.read != 'last' else ''}"
          f"{', chat template' if args.chat else ''})")
    if scores:
        print(table(scores, layers, held, len(dataset.pairs)), end="")
    if args.plot and scores:
        print(f"plot: {args.plot}")
    first = methods[0]
    best = best_layer(scores[first], layers) if scores else layers[len(layers) // 2]
    print(f'use it: vector v = load("{os.path.basename(args.output)}", key="{first}.{best}")'
          f'   or per layer: load("{os.path.basename(args.output)}", key="{first}", per_layer=true)')
    if "logistic" in methods:
        b = biases["logistic"][str(best)]
        sign = "-" if b < 0 else "+"
        print(f'probe:  read dot(load("{os.path.basename(args.output)}", key="logistic.{best}")) {sign} {abs(b):.6g}'
              "   (> 0: positive)")
    return EXIT_OK


def _sites_text(sites) -> str:
    kind = sites[0].kind
    layers = [s.layer for s in sites]
    if kind == "head":
        return ", ".join(s.text for s in sites) if len(sites) < 4 else f"head[{layers[0]}..{layers[-1]}, ...]"
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 1:
        return f"{kind}[{layers[0]}:{layers[-1] + 1}]"
    return f"{kind}[{', '.join(map(str, layers))}]"


# --------------------------------------------------------------------- calibrate


def _calibrate(args) -> int:
    from steerc.api import check_source
    from steerc.cli.common import checked_project, options_from, read_text
    from steerc.derive.methods import best_threshold
    from steerc.runtime.engines import DEFAULT

    for flag in ("output", "at", "plot", "method"):
        if getattr(args, flag) is not None:  # even an empty -o ''
            raise UsageError(f"--{flag} does not go with --calibrate (which prints a threshold)")
    if not args.probe:
        raise UsageError("--calibrate needs --probe NAME: the probe of the program to calibrate")
    pos, neg, _ = _read_data(args, paired=False)
    facts = model_facts(args)
    path_ = os.path.abspath(args.calibrate)
    options = options_from(args, checked_project(args, args.calibrate))  # its steer.toml's [params], as `run`'s
    result = check_source(read_text(args.calibrate), args.calibrate, path=path_, options=options, facts=facts)
    if not result.ok:
        print(result.render(), file=sys.stderr)
        return EXIT_ERRORS
    names = [p.name for p in result.plan.probes]
    if args.probe not in names:
        raise UsageError(f"--probe {args.probe}: {args.calibrate} has no probe of that name "
                         f"({', '.join(names) or 'it declares none'})")
    probe = result.plan.probe(args.probe)
    gates = None
    if args.write:
        gates = _threshold_gates(args, result)
        if isinstance(gates, int):
            return gates
    values = _engine_probe_values(args, model_path_for(args), facts, result.plan, pos + neg)
    vp, vn = values[:len(pos)], values[len(pos):]
    op, threshold, f1, accuracy = best_threshold(vp, vn)
    wrote = None
    if args.write:
        wrote = _write_threshold(args, result, gates, op, threshold, facts)
        if isinstance(wrote, int):
            return wrote
    report = {"probe": args.probe, "readout": probe.kind, **({"engine": args.engine} if args.engine != DEFAULT else {}),
              "site": probe.site.text, "pool": probe.pool,
              "chat": bool(args.chat), "op": op, "threshold": threshold, "f1": f1, "accuracy": accuracy,
              "positive": {"n": len(vp), "min": float(vp.min()), "mean": float(vp.mean()), "max": float(vp.max())},
              "negative": {"n": len(vn), "min": float(vn.min()), "mean": float(vn.mean()), "max": float(vn.max())}}
    if args.write:
        report["wrote"] = {"param": args.write, "file": wrote}
    if args.format == "json":
        print(json_dumps(report, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"probe {args.probe}: {probe.kind} at {probe.site.text}, pool {probe.pool}; "
          f"{len(vp)} texts where it should hold, {len(vn)} where not")
    print("  read in the model's chat template, as `steerc run` reads a prompt" if args.chat else
          "  read as raw text, as `steerc run --raw` reads a prompt (add --chat for the chat template `run` uses "
          "by default)")
    print(f"  when {args.probe} {op} {threshold:.6g}    # F1 {f1:.3f}, accuracy {accuracy:.3f}")
    for label, v in (("should hold", vp), ("should not", vn)):
        print(f"  {label:11s}: min {v.min():#.4g}  mean {v.mean():#.4g}  max {v.max():#.4g}")
    if args.write:
        print(f"wrote {args.write} = {threshold:.6g} to {wrote} [params], which `when {args.probe} {op} "
              f"{args.write}` reads")
    return EXIT_OK


def _threshold_gates(args, result):
    """The comparisons of ``--probe`` with ``--write``'s param in the program's gates, as (the direction the
    gate opens in, ``<`` or ``>``, the comparison's span); or an exit code after saying why the threshold
    cannot be written: not a param the program declares, no gate comparing the probe with it, or a
    steer.toml that cannot be written (all found before the model loads)."""
    from steerc.cli.tune import params_edit
    from steerc.ir import nodes as ir

    name, probe = args.write, args.probe
    declared = [p.name for p in result.program.of_type(ir.ParamDecl)]
    if name not in declared:
        return _write_refused(args, f"--write {name}: {args.calibrate} declares no param {name}",
                              help=f"declare `param {name} = 0.5` and gate on it: `when {probe} > {name}`")
    gates = []
    for decl in result.program.of_type(ir.InterventionDecl):
        if decl.gate is not None:
            gates.extend(_comparisons(decl.gate, probe, name, False))
    if not gates:
        return _write_refused(args, f"--write {name}: no gate of {args.calibrate} compares {probe} with {name}",
                              help=f"gate on it: `when {probe} > {name}` (or <), so that the gate reads the "
                                   "threshold written")
    edited = params_edit(args, args.calibrate, {name: 0.0}, "derive --calibrate")
    return edited if isinstance(edited, int) else gates


def _write_refused(args, message: str, help: str) -> int:
    """An ``invalid-value`` error under ``--write``'s value."""
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE

    source, span = argument_source(args, "--write")
    return fail_with(args, [Diagnostic.error(INVALID_VALUE, message, span, help=help)], {source.name: source})


def _comparisons(gate, probe: str, name: str, negated: bool) -> list:
    """(direction, span) of each ``probe OP name`` or ``name OP probe`` in ``gate``: the direction in which the
    gate opens as the probe grows past the param (``>``) or falls below it (``<``), ``not`` counted."""
    from steerc.ir import nodes as ir

    if isinstance(gate, ir.GateNot):
        return _comparisons(gate.operand, probe, name, not negated)
    if isinstance(gate, (ir.GateAnd, ir.GateOr)):
        return _comparisons(gate.left, probe, name, negated) + _comparisons(gate.right, probe, name, negated)
    sides = [s.id if isinstance(s, ir.Name) else None for s in (gate.left, gate.right)]
    if sorted(sides, key=str) != sorted([probe, name]):
        return []
    up = gate.op.startswith(">") == (sides[0] == probe)
    return [(">" if up != negated else "<", gate.span)]


def _write_threshold(args, result, gates, op: str, threshold: float, facts):
    """Write the threshold into steer.toml as ``--write``'s param: the path as shown, or an exit code when a gate
    compares the other way (the threshold would open it on the wrong texts) or the param's range refuses it."""
    from steerc.api import check_source
    from steerc.cli.common import checked_project, root_of
    from steerc.cli.tune import params_write
    from steerc.diagnostics import Diagnostic
    from steerc.diagnostics.codes import INVALID_VALUE
    from steerc.project.session import check_options

    name, probe = args.write, args.probe
    wrong = [span for direction, span in gates if direction != op]
    if wrong:
        flipped = [Diagnostic.error(INVALID_VALUE, f"the calibration found `{probe} {op} {threshold:.6g}`, and this "
                                    f"gate opens the other way: with {name} = {threshold:.6g} it would hold on the "
                                    f"wrong texts, so nothing was written", span,
                                    help=f"compare `{probe} {op} {name}`, or swap --positive and --negative")
                   for span in wrong]
        return fail_with(args, flipped, result.sources)
    src, span = argument_source(args, "--write")  # the program as it will run: its steer.toml, this threshold
    options = check_options(checked_project(args, args.calibrate), root=root_of(args), overrides={name: threshold},
                            origins={name: span}, sources={src.name: src})
    again = check_source(result.source.text, args.calibrate, path=os.path.abspath(args.calibrate),
                         options=options, facts=facts)
    if not again.ok:
        print(again.render(), file=sys.stderr)
        return EXIT_ERRORS
    return params_write(args, args.calibrate, {name: threshold}, "derive --calibrate")


def _engine_probe_values(args, path: str, facts, plan, texts: list[str]):
    """``--probe``'s value on each text, read on ``--engine``'s engine with the program's plan installed, as the
    plan's gates read it (a per-token probe at the text's last token, a pooled one's held value once the prompt
    has passed): the session's ``probe_values`` (steerc.runtime.engines)."""
    from steerc.runtime.capture import encode

    with booted(args, path, facts, plan, command="derive --calibrate") as session:
        ids = [encode(session.tokenizer, t, None, args.chat)[0] for t in texts]
        return session.probe_values(ids, args.probe, batch_size=args.batch_size)


def _probe_values(model, tokenizer, plan, name: str, texts: list[str], args):
    """The probe's value on each text of a transformers model here, as ``--engine hf`` reads it (the reference
    that tests/engine/test_capture.py holds vLLM's values to)."""
    from steerc.runtime.capture import encode
    from steerc.runtime.engines import HFSession

    ids = [encode(tokenizer, t, None, args.chat)[0] for t in texts]
    return HFSession(model, tokenizer, plan).probe_values(ids, name, batch_size=args.batch_size)
