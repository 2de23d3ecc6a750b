"""Text helpers shared by workloads and the simulated server.

``split_tokens`` is an approximate tokenizer (words, numbers and punctuation
marks; in scripts written without spaces, one token per kana or hangul
character and per one or two Han characters), used where the served model's
tokenizer is not at hand. ``chat_prompt``
renders messages with the ChatML template used by Qwen3 models.
"""

from __future__ import annotations

import re

# Scripts written without spaces: Qwen's tokenizer gives about one token per kana or hangul character and one per
# one or two Han characters; a whole run taken as one "word" would count a sentence as a single token.
_HAN = "\u2e80-\u2fdf\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_UNSPACED = _HAN + "\u3040-\u30ff\u3100-\u31ff\ua960-\ua97f\uac00-\ud7ff\uff66-\uff9f"
_TOKEN = re.compile(rf"\s*(?:[{_HAN}]{{1,2}}|[{_UNSPACED}]|(?:(?![{_UNSPACED}])\w)+|[^\w\s])", re.UNICODE)


def split_tokens(text: str) -> list[str]:
    """Split text into approximate tokens; joining them gives the text back (modulo trailing space)."""
    return _TOKEN.findall(text)


def approximate_tokens(text: str) -> int:
    """Approximate token count of a text (see split_tokens)."""
    return len(split_tokens(text))


def chat_prompt(messages: list[dict], thinking: bool = False) -> str:
    """Render chat messages (role, content) with the Qwen3 ChatML template, ready for generation."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    if not thinking:
        parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)
