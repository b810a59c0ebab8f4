"""A small byte-level BPE tokenizer built in memory (no download), sized to the tiny models' vocab."""

from __future__ import annotations

import functools

CORPUS = [
    '{"answer": "yes", "confidence": 0.9}', '{"ok": true}', '{"ok": false}', "yes, because it is raining.",
    "no, because the sun is out.", "maybe", "1 + 2 * (3 - 4) / 5", "The quick brown fox jumps over the lazy dog.",
    "Answer: the capital of France is Paris.", "0123456789", "[1, 2, 3]", '{"name": "steerc", "size": 12}',
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "hello world, how are you today?",
] * 20


@functools.lru_cache(maxsize=None)
def byte_bpe(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)
    return fast
