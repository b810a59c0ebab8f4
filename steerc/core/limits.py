"""Every resource limit of the compiler, in one place.

steerc reads programs, model configs, facts files, vector files and plans
written by people and by other programs, some of them hostile. Each input
is bounded before work proportional to it starts, so that no input runs
unbounded or exhausts memory, and the recursive passes (the checker, the
formatter, the IR and plan writers) stay well inside Python's stack. A
limit that is hit is a diagnostic (``limit-exceeded``, or the code of the
check that owns the value: ``layer-out-of-range``, ``invalid-value``,
``shape-mismatch``), never a traceback.

``spec/limits.md`` documents each limit; its table is generated from
:data:`LIMITS` below (``python tests/test_spec.py --write``).

>>> MAX_NESTING
64
>>> LIMITS["MAX_LAYERS"].value == MAX_LAYERS
True
"""

from __future__ import annotations

from steerc.core.record import frozen

# ------------------------------------------------------------------ programs

MAX_SOURCE_BYTES = 2 * 1024 * 1024
MAX_NESTING = 64
MAX_NUMBER_CHARS = 100
MAX_NAME_CHARS = 256
MAX_STRING_CHARS = 64 * 1024
MAX_LIST_ITEMS = 65_536
MAX_PATH_CHARS = 4096
MAX_GLOB_PATHS = 100_000
MAX_POSITION = 2**31 - 1
MAX_SCHEDULE_STEP = 2**24
MAX_EXPANDED_SITES = 65_536
MAX_VALUES = 32 * 1024 * 1024
MAX_LOREFT_RANK = 1024
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max

# -------------------------------------------------------------------- models

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_HIDDEN = 65_536
MAX_INTERMEDIATE = 1024 * 1024
MAX_VOCAB = 16 * 1024 * 1024

# ------------------------------------------------------------- other inputs

MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_IR_JSON_BYTES = 32 * MAX_SOURCE_BYTES
MAX_LSP_FRAME_BYTES = 16 * MAX_SOURCE_BYTES
MAX_JSON_DEPTH = 200
MAX_JSON_INT_DIGITS = 100
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
MAX_GGUF_HEADER_BYTES = 64 * 1024 * 1024
MAX_GGUF_STRINGS = 262_144
MAX_GGUF_TENSORS = 65_536
MAX_SAE_FEATURES = 16 * 1024 * 1024
MAX_SAE_DENSE_VALUES = 256 * 1024 * 1024

# --------------------------------------------------------------------- serve

MAX_SERVED_PLANS = 32

# ------------------------------------------------------------------- output

MAX_ECHO_COLUMNS = 120
MAX_DATA_BYTES = 64 * 1024 * 1024
MAX_EXAMPLES = 100_000
MAX_EXAMPLE_CHARS = 64 * 1024
MAX_MESSAGE_CHARS = 600
MAX_REPEATS = 50
MAX_SUGGESTION_CANDIDATES = 1000
MAX_PROMPT_CHARS = 64 * 1024
MAX_PROMPT_TOKENS = 4096
MAX_GENERATED_SHOWN = 1024
MAX_TEXT_TOKENS = 16_384
MAX_NEW_TOKENS = 4096
MAX_SEED = 2**32 - 1
MAX_TEMPERATURE = 100.0
MAX_RESAMPLES = 100_000


@frozen
class Limit:
    name: str
    value: float
    unit: str
    what: str
    why: str


def _table(*rows: tuple[str, str, str, str]) -> dict[str, Limit]:
    return {name: Limit(name, globals()[name], unit, what, why) for name, unit, what, why in rows}


LIMITS: dict[str, Limit] = _table(
    ("MAX_SOURCE_BYTES", "bytes",
     "the size of a program (UTF-8), of a file read by `constrain ... from`, and of a `steer.toml`",
     ("checking takes time and memory in the text's length (a few seconds per MiB); "
      "2 MiB holds some 20,000 interventions")),
    ("MAX_NESTING", "levels",
     ("how deeply expressions and conditions nest: each binary operator, unary `-`, call, vector literal, "
      "comparison, `and`, `or` and `not` opens a level (parentheses do not); also how deeply the arrays and "
      "inline tables of a `steer.toml` nest"),
     ("the checker, `fmt` and the IR writer walk expressions recursively, and Python's TOML reader its "
      "values; 64 levels keep them well inside Python's stack (a chain `a + b + c + ...` nests one level "
      "per operator)")),
    ("MAX_NUMBER_CHARS", "characters",
     "the length of one number literal (digits, point, exponent), and of one bare value in a `steer.toml`",
     "a float64 has 17 significant digits; longer literals only cost time to convert"),
    ("MAX_NAME_CHARS", "characters", "the length of one name", "names are echoed in messages"),
    ("MAX_STRING_CHARS", "characters",
     "the length of one string literal (a path, a key, an `after` text, an inline constraint)",
     "long schemas and grammars belong in a file named by `constrain ... from`"),
    ("MAX_LIST_ITEMS", "items",
     ("the items of one list: a vector literal, call arguments, a selector, a choice list, a position list, "
      "the scopes of a `tokens` line, the directions of `ablate`"),
     "no model is wider than MAX_HIDDEN; each item costs parsing time"),
    ("MAX_PATH_CHARS", "characters", "the length of a path in `load` or `constrain ... from`",
     "PATH_MAX on Linux; resolving a path takes time in its length"),
    ("MAX_GLOB_PATHS", "entries",
     ("the folder entries one glob argument of `steerc check` or `steerc fmt` looks at (`'p/**/*.steer'`); "
      "`**` does not enter links to folders"),
     ("every entry costs a system call; a folder of links to itself made `*/*/*/...` name 2^40 paths. "
      "A folder argument is walked without a limit (it never follows links)")),
    ("MAX_POSITION", "", "the largest absolute token position or position offset in a scope",
     "positions travel as 32-bit integers to the runtimes"),
    ("MAX_SCHEDULE_STEP", "", "the largest step count in a schedule (`ramp(n)`, `window(a, b)`)",
     "schedule numbers travel as float32, which holds every whole number up to 2^24 exactly"),
    ("MAX_EXPANDED_SITES", "sites",
     ("with a model, the (site, operation) pairs a program expands to: each intervention counts the layers "
      "(times the heads) it reaches"),
     "the plan holds one kernel per pair; 65,536 compile in seconds"),
    ("MAX_VALUES", "values",
     ("the vector entries a check computes (each folded vector, each loaded tensor once), and, with a model, "
      "the tensor entries of the plan (each site's kernels count their vectors' widths, and a LoReFT its R, W and "
      "b)"),
     ("memory: a short program can fold a wide vector thousands of times, or steer every layer with it; "
      "this is 256 MiB of float64")),
    ("MAX_LOREFT_RANK", "rows",
     "the rank `r` of a `loreft R, W, b`: the rows of `R` and `W`",
     ("checking that R's rows are orthonormal costs r * r * d operations (a second at r = 1,024, d = 16,384); "
      "pyreft's LoReFTs have ranks from 1 to 32")),
    ("FLOAT32_MAX", "",
     ("the largest magnitude of a value that reaches the model: vector entries, scale factors, clamp targets, "
      "angles, gate thresholds, probe biases"),
     "steering tensors and activations are float32; a larger value would be infinite there"),
    ("MAX_LAYERS", "layers", "the layers of a model; also bounds layer indices and per-layer banks",
     "the largest models have about 130 layers"),
    ("MAX_HEADS", "heads", "attention heads (and key-value heads) per layer; also bounds head indices",
     "the largest models have 128"),
    ("MAX_HEAD_DIM", "", "the width of one attention head", "the largest models use 256"),
    ("MAX_HIDDEN", "",
     "the hidden size, the width of all heads together (`heads * head_dim`), and the length of a steering vector",
     "the largest models have hidden sizes near 20,000"),
    ("MAX_INTERMEDIATE", "", "the MLP's intermediate size", "the largest models use under 100,000"),
    ("MAX_VOCAB", "tokens", "the vocabulary size", "the largest vocabularies have about 260,000 tokens"),
    ("MAX_JSON_BYTES", "bytes", "a `config.json`, a facts JSON, or a serve plan",
     "configs and plans are a few kilobytes"),
    ("MAX_IR_JSON_BYTES", "bytes", "the IR JSON read back by `steerc.ir.serialize.loads`",
     "the IR JSON of a program is up to about 20 times its text"),
    ("MAX_LSP_FRAME_BYTES", "bytes", "one message `steerc lsp` reads (its `Content-Length`)",
     ("the largest document, 2 MiB, is at most 12 MiB as a JSON string; a longer frame ends the server with a "
      "message rather than be read into memory")),
    ("MAX_JSON_DEPTH", "levels", "how deeply arrays and objects nest in any JSON steerc reads",
     "readers of JSON walk it recursively; the IR JSON of the deepest program stays below this"),
    ("MAX_JSON_INT_DIGITS", "digits", "the digits of one integer in JSON",
     "no fact or field needs more; converting huge integers takes quadratic time"),
    ("MAX_SAFETENSORS_HEADER", "bytes", "the JSON header of a safetensors file",
     "the limit the safetensors format itself sets"),
    ("MAX_DATA_BYTES", "bytes", "a data file of `steerc derive` (JSONL pairs, or one text file of examples)",
     "the whole file is read and hashed; contrastive datasets are a few megabytes"),
    ("MAX_EXAMPLES", "examples", "the pairs (or the texts of one side) `steerc derive` reads",
     "each example is one forward pass per side; repeng and CAST use hundreds"),
    ("MAX_EXAMPLE_CHARS", "characters", "one text of a `steerc derive` example (a prompt, a completion, a line)",
     "texts are tokenized whole; longer ones belong in several examples"),
    ("MAX_GGUF_HEADER_BYTES", "bytes", ("the header of a GGUF file that `load` reads (its key-value pairs and "
                                        "tensor entries)"),
     ("a control vector's header is a few hundred bytes; a model GGUF's tokenizer takes a few MiB, and steerc "
      "stops reading a model GGUF at its `general.architecture` anyway")),
    ("MAX_GGUF_STRINGS", "strings", "the strings in a GGUF header (keys, values, array items and tensor names)",
     ("each string is walked to find the next; a control vector has a few dozen, and 262,144 take a fraction "
      "of a second")),
    ("MAX_GGUF_TENSORS", "tensors", "the tensor entries of a GGUF file",
     "a control vector holds one per layer; the largest models hold a few thousand tensors"),
    ("MAX_SAE_FEATURES", "features", "the features of an SAE folder (its `d_sae`)",
     ("the largest published SAEs have about a million features (Gemma Scope's 1m); each feature's encoder "
      "column and decoder row are read one at a time, so this bounds indices and the per-feature tensors, "
      "not memory")),
    ("MAX_SAE_DENSE_VALUES", "values",
     ("the entries of one SAE tensor read whole: the encoder `W_enc` a topk SAE, or a whole-SAE encode, needs "
      "(`d_in x d_sae`), or the decoder a topk SAE with `rescale_acts_by_decoder_norm` reads for its norms"),
     ("1 GiB of float32; a feature's own row or column is read alone (a few KiB), so only these whole reads "
      "grow with the SAE")),
    ("MAX_SERVED_PLANS", "plans",
     ("the plans a serve process keeps admitted and built between requests (the HTTP front end, the offline "
      "front end and each worker: by the plan's text and the model's facts, and a plan bound to a request's "
      "params by their values too); the least recently used goes first"),
     ("each holds up to three copies of its vectors (the artifacts, the plan, the built tensors: some 200 KiB "
      "for four vectors of 4,096 floats), within the request caps; a server steers with a handful of plans at "
      "a time, and a plan that falls out is admitted and built again on its next request")),
    ("MAX_PROMPT_CHARS", "characters", "the prompt text of `steerc explain --tokens`, and each `--prompt` of `steerc run`",
     "the text is tokenized whole before its tokens are counted"),
    ("MAX_PROMPT_TOKENS", "tokens", "the prompt tokens `steerc explain --tokens` shows",
     "the table and the page have one row or box a token; 4,096 tokens are some 200 KiB of text"),
    ("MAX_GENERATED_SHOWN", "positions", "the generated positions `steerc explain --tokens --generated K` shows",
     "one forward-pass step of the runtime's position code each, and one row or box each"),
    ("MAX_TEXT_TOKENS", "tokens",
     ("the tokens of one text `steerc capture` and `steerc derive` read (its prompt and chat template included), "
      "of one `steerc run` prompt with its `--max-new-tokens`, and lm-eval's `max_length` for the `steerc` model; "
      "the model's own context (`max_position_embeddings`, or its family's equivalent) bounds them too"),
     ("one forward pass holds every position's activations at once, and a model run past its context reads "
      "positions it never learned; a longer document belongs in several texts")),
    ("MAX_NEW_TOKENS", "tokens", "`steerc run --max-new-tokens`, and lm-eval's `max_gen_toks` for the `steerc` model",
     "each new token is one forward step; 4,096 of them take minutes on a CPU"),
    ("MAX_SEED", "", "`steerc run --seed`, and the `--seed` of `eval`, `tune` and `derive`",
     ("a seed every generator takes (numpy's takes 32 bits); sampling with one seed repeats its text on the "
      "same machine")),
    ("MAX_RESAMPLES", "resamples", "`steerc eval --resamples` and `tune --resamples` (each bootstrap interval's)",
     ("the bootstrap's time grows with resamples x items; an interval's percentiles are stable long before "
      "(1e8 ran for hours, 1e12 asked for 14.6 TiB)")),
    ("MAX_TEMPERATURE", "", "`steerc run --temperature`",
     "past a few units the distribution is all but uniform: the text is noise"),
    ("MAX_ECHO_COLUMNS", "columns", "how much of a source line a diagnostic shows around its caret",
     "a diagnostic on a very long line shows a window of it, marked with `...`"),
    ("MAX_MESSAGE_CHARS", "characters", "the length of a diagnostic's message, help line or note",
     "messages quote names, keys and paths, which can be long"),
    ("MAX_REPEATS", "diagnostics",
     ("diagnostics shown per code (the last one shown says how many more were left out); also the "
      "`did you mean` searches among a program's names or a file's keys in one check"),
     "a generated program can repeat one mistake thousands of times; each search costs time in the names"),
    ("MAX_SUGGESTION_CANDIDATES", "names", "the candidates a `did you mean` suggestion is chosen among",
     ("each comparison costs time; among more, only names of about the same length and the same first "
      "letter are compared")),
)


# Where a model config says how many positions the model reads (its context), by family: the first present.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                "max_seq_len")


def context_of(config) -> int | None:
    """The context of a model, in tokens, from its config (a ``config.json`` dict or a transformers config;
    a multimodal model's ``text_config`` first); None where the config does not say.

    >>> context_of({"max_position_embeddings": 8192}), context_of({"text_config": {"n_positions": 1024}})
    (8192, 1024)
    >>> context_of({"max_position_embeddings": -1}) is None, context_of({}) is None
    (True, True)
    """
    get = config.get if isinstance(config, dict) else (lambda key, default=None: getattr(config, key, default))
    inner = get("text_config", None)
    if inner is not None and inner is not config:
        found = context_of(inner)
        if found is not None:
            return found
    for key in CONTEXT_KEYS:
        value = get(key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def text_tokens_limit(context: int | None) -> int:
    """The most tokens one text may have on a model of ``context`` tokens (None: unknown): the smaller of the
    two, never above MAX_TEXT_TOKENS.

    >>> text_tokens_limit(256), text_tokens_limit(None), text_tokens_limit(131_072)
    (256, 16384, 16384)
    """
    return MAX_TEXT_TOKENS if context is None else min(context, MAX_TEXT_TOKENS)


def human(n: float, unit: str = "") -> str:
    """A limit as people read it: ``2 MiB`` for sizes in bytes, ``65,536`` otherwise.

    >>> human(2 * 1024 * 1024, "bytes"), human(65_536), human(FLOAT32_MAX)
    ('2 MiB', '65,536', '3.4028235e+38')
    """
    if isinstance(n, float):
        return f"{n:.8g}"
    if unit == "bytes":
        for size, name in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
            if n >= size and n % size == 0:
                return f"{n // size} {name}"
    return f"{n:,}"


def render_table() -> str:
    """The table of ``spec/limits.md``."""
    out = ["| limit | value | what it bounds | why |", "|---|---:|---|---|"]
    for lim in LIMITS.values():
        value = human(lim.value, lim.unit)
        if lim.unit and lim.unit != "bytes":
            value = f"{value} {lim.unit}"
        out.append(f"| `{lim.name}` | {value} | {lim.what} | {lim.why} |")
    return "\n".join(out) + "\n"
