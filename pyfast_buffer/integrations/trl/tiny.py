"""A tiny policy built in code, for running TRL's trainer on a CPU in seconds: a 2-layer Qwen2 over a 62-word
vocabulary, a word-level tokenizer with a chat template, a sum-of-digits prompt set and its reward.

Nothing is downloaded: the model's weights are random (seeded), saved to a folder the trainer loads by path. Used by
the example (examples/trl_async_grpo.py), the tests and the goodput benchmark.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Tuple

SPECIAL = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>"]
WORDS = ["what", "is", "plus", "minus", "the", "sum", "answer", "of", "and", "?"]
NUMBERS = [str(n) for n in range(46)]
VOCAB = SPECIAL + WORDS + NUMBERS  # 62 tokens
CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def tiny_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over VOCAB, ``<eos>`` ending completions, ``<pad>`` padding."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_policy(folder: str, seed: int = 0) -> Tuple[str, Any]:
    """Saves a 2-layer Qwen2 (hidden size 32) and its tokenizer into ``folder``; returns ``(folder, tokenizer)``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def sum_prompts(n: int, seed: int = 0) -> List[Dict[str, Any]]:
    """``n`` rows ``{"prompt": [{"role": "user", "content": "what is a plus b ?"}], "answer": str(a + b)}``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(23), rng.randrange(23)
        rows.append({"prompt": [{"role": "user", "content": f"what is {a} plus {b} ?"}], "answer": str(a + b)})
    return rows


def sum_dataset(n: int, seed: int = 0) -> Any:
    """``sum_prompts`` as a ``datasets.Dataset`` (what TRL's trainer takes as ``train_dataset``)."""
    from datasets import Dataset

    rows = sum_prompts(n, seed)
    return Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows]})


def sum_reward(completions: List[Any], answer: List[str], **kwargs: Any) -> List[float]:
    """1 when the completion's first word is the answer, 0.5 when the answer appears later, else 0."""
    rewards = []
    for completion, truth in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        words = text.split()
        rewards.append(1.0 if words[:1] == [truth] else 0.5 if truth in words else 0.0)
    return rewards
