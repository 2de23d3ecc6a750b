"""Text helpers shared by workloads and the simulated server.

``split_tokens`` is an approximate tokenizer (words, numbers and punctuation
marks), used where the served model's tokenizer is not at hand. ``chat_prompt``
renders messages with the ChatML template used by Qwen3 models.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])", re.UNICODE)


def split_tokens(text: str) -> list[str]:
    """Split text into approximate tokens; joining them gives the text back (modulo trailing space)."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """Approximate token count of a text (see split_tokens)."""
    return len(split_tokens(text))


def chat_prompt(messages: list[dict], thinking: bool = False) -> str:
    """Render chat messages (role, content) with the Qwen3 ChatML template, ready for generation."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    if not thinking:
        parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)
