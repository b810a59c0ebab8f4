"""lm-eval-harness runs steered models: the ``steerc`` model type (spec/eval.md §10; needs lm-eval 0.4).

Importing this module registers ``steerc`` in lm-eval's own model registry
(``lm_eval.api.registry``). lm-eval discovers no plugin models, so its CLI
needs the import: ``python -m steerc.eval.harness`` is lm-eval's CLI with
the type registered and takes the same arguments::

    python -m steerc.eval.harness run --model steerc \\
        --model_args program=joy.steer,model=smollm2,set=strength=4 --tasks joy_ab --include_path tasks/

From Python, ``import steerc.eval.harness`` and then
``lm_eval.simple_evaluate(model="steerc", model_args=...)``.

The model is the HF runtime's: the program is checked against the loaded
model (with its project's ``steer.toml`` and ``set``), installed with
:func:`steerc.runtime.hf.install`, and

* ``loglikelihood`` scores each continuation teacher-forced
  (:meth:`~steerc.runtime.hooks.Handle.teacher_forced`): the continuation's
  tokens are generated positions, as in ``steerc eval`` — ``tokens
  generated`` steers them and not the context;
* ``loglikelihood_rolling`` scores a text in lm-eval's rolling windows,
  each window's tokens as generated positions after its context;
* ``generate_until`` generates greedily under the plan, as ``steerc run``
  does, and cuts at the first stop sequence.

Tokenization is lm-eval's (``TemplateLM``): the same token ids its ``hf``
model scores, so with no steering the two give the same numbers.
"""

from __future__ import annotations

import os

import lm_eval.models  # noqa: F401  lm-eval's own types first: its registry imports them only while it is empty
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from steerc.eval.model_args import check_model_args, max_gen_toks, max_length_for, parse_sets  # noqa: F401

DEFAULT_MAX_GEN_TOKS = 256


class ProgramRefused(ValueError):
    """The program does not check against the model: the message is steerc's rendered diagnostics."""


@register_model("steerc")
class SteercLM(TemplateLM):
    """A transformers model steered by a ``.steer`` program, for lm-eval."""

    def __init__(self, program: str, model: str | None = None, set: str | None = None, root: str | None = None,
                 max_length: int | None = None, batch_size=1, **extra):
        # Every argument is checked before anything loads (steerc.eval.model_args): a max_length of -5 would
        # keep all but five tokens of each context, a misspelt key would be ignored.
        args = check_model_args({"program": program, "model": model, "set": set, "root": root,
                                 "max_length": max_length, "batch_size": batch_size, **extra})
        super().__init__()
        import torch

        from steerc.api import check_source
        from steerc.core.limits import context_of
        from steerc.core.source import read_program
        from steerc.project import project_of
        from steerc.project.session import check_options
        from steerc.runtime.capture import config_context
        from steerc.runtime.hf import facts_from_model, install
        from steerc.runtime.models import load_model, runnable_path

        path = os.path.abspath(str(program))
        project = project_of(path, root)
        if not project.ok:
            raise ProgramRefused("\n".join(d.message for d in project.diagnostics))
        name = model if model is not None else project.model
        if name is None:
            raise ValueError("steerc model_args: give model=NAME_OR_PATH (or `model` in steer.toml)")
        max_length_for(args["max_length"], config_context(str(name)))  # over the context: refused before the load
        self.model, self.tokenizer = load_model(runnable_path(str(name)))
        self.model.eval()
        options = check_options(project, root=root, overrides=args["set"])
        result = check_source(read_program(path), str(program), path=path, options=options,
                              facts=facts_from_model(self.model))
        if not result.ok:
            raise ProgramRefused(result.render())
        self.handle = install(self.model, result.plan, self.tokenizer)
        self.params = {"program": str(program), "model": str(name), "set": args["set"]}
        self._max_length = max_length_for(args["max_length"], context_of(self.model.config))
        self._torch = torch

    # ---- what TemplateLM asks for
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def chat_template(self, chat_template=False) -> str:
        return getattr(self.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return list(self.tokenizer.encode(string, **kw))

    # ---- scoring
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """log p(continuation | context) with the continuation as generated positions, and whether every
        continuation token is the argmax."""
        torch = self._torch
        ids = (context + continuation)[-(self._max_length + 1):]
        plen = len(ids) - len(continuation)
        if plen < 1:
            raise ValueError(f"a continuation of {len(continuation)} tokens leaves no context within "
                             f"max_length {self._max_length}")
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad(), self.handle.teacher_forced([plen]):
            logits = self.model(input_ids=x, use_cache=False).logits[0]
        logp = torch.log_softmax(logits[plen - 1:len(ids) - 1].double(), dim=-1)
        target = torch.tensor(ids[plen:], dtype=torch.long)
        total = float(logp.gather(1, target.unsqueeze(1)).sum())
        greedy = bool((logp.argmax(dim=-1) == target).all())
        return total, greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        out = []
        for cache_key, context, continuation in requests:
            result = self._score(list(context), list(continuation))
            if cache_key is not None:
                self.cache_hook.add_partial("loglikelihood", cache_key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in (r.args for r in requests):
            windows = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            total = sum(self._score(list(ctx), list(cont))[0] for ctx, cont in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        torch = self._torch
        out = []
        for context, gen_kwargs in (r.args for r in requests):
            kwargs = dict(gen_kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            eos = self.tokenizer.decode([self.eot_token_id])
            stops = until + ([eos] if eos not in until else [])
            new = max_gen_toks(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS), self._max_length)
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError("steerc model: generate_until decodes greedily; the task asks for sampling "
                                 "(do_sample / temperature > 0)")
            ids = self.tok_encode(context)[-(self._max_length - new):]
            x = torch.tensor([ids], dtype=torch.long)
            with torch.no_grad():
                y = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                        do_sample=False, pad_token_id=self.tokenizer.pad_token_id
                                        if self.tokenizer.pad_token_id is not None else self.eot_token_id,
                                        stop_strings=stops, tokenizer=self.tokenizer)
            text = self.tokenizer.decode(y[0, len(ids):].tolist(), skip_special_tokens=True)  # as lm-eval's hf model
            for stop in stops:
                if stop:
                    text = text.split(stop, 1)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out


def main(argv: list[str] | None = None) -> None:
    """lm-eval's CLI, with the ``steerc`` model type registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
