"""Text helpers shared by workloads, the client and the simulated server.

``split_tokens`` is an approximate tokenizer (words, numbers and punctuation
marks; in scripts written without spaces, one token per kana or hangul
character and per one or two Han characters), used where the served model's
tokenizer is not at hand. ``chat_template`` reads the served model's chat
template (Jinja, from its folder) that turns a session's messages into the
prompt text sent to SGLang's native ``/generate`` and to ``/v1/completions``;
``chat_prompt`` renders Qwen3's ChatML, the fallback where the model folder
has no template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox

from .canon import digest

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


@dataclass(frozen=True)
class ChatTemplate:
    """How a session's messages become one prompt text: the model's Jinja chat template, or Qwen3's ChatML.

    ``source`` says which, as each cell's provenance records it ("tokenizer_config.json of <folder>", or
    "fallback: Qwen ChatML (<why>)"); ``text`` is the Jinja source (None for the fallback) and ``tokens`` the
    special tokens it may name (bos_token, eos_token, ...), as (name, value) pairs."""

    source: str
    text: str | None = None
    tokens: tuple = ()

    def render(self, messages: list[dict], thinking: bool = False) -> str:
        """The prompt text of ``messages``, ready for the model's reply (the generation prompt added), thinking on
        or off (``enable_thinking``, as SGLang passes it to chat templates). A leading BOS token is left out: the
        server's tokenizer adds it when it encodes the text."""
        if self.text is None:
            return chat_prompt(messages, thinking)
        special = dict(self.tokens)
        try:
            text = _compiled(self.text).render(
                messages=messages,
                add_generation_prompt=True,
                enable_thinking=thinking,
                tools=None,
                documents=None,
                **special,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template ({self.source}) refused these messages: {exc}") from None
        bos = special.get("bos_token")
        return text[len(bos) :] if bos and text.startswith(bos) else text

    @property
    def digest(self) -> str | None:
        """Digest of what decides the rendered text (None for the fallback)."""
        return None if self.text is None else digest([self.text, list(self.tokens)])


QWEN_CHATML = ChatTemplate("fallback: Qwen ChatML")


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compiled(text: str) -> jinja2.Template:
    """A chat template compiled as transformers compiles it (sandboxed; trim_blocks, lstrip_blocks, loop controls;
    raise_exception, strftime_now and a tojson that keeps non-ASCII text)."""
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise, strftime_now=lambda form: datetime.now().strftime(form))
    return environment.from_string(text)


@lru_cache(maxsize=4)
def chat_template(model_path: str | None) -> ChatTemplate:
    """The chat template of the model folder ``model_path``: its chat_template.jinja, else the ``chat_template`` of
    its tokenizer_config.json (the one named "default" where it lists several); Qwen3's ChatML where there is none
    (no local folder, or a folder without a template). Raises ValueError naming the file when the file cannot be
    read or its template is not valid Jinja."""
    folder = Path(model_path) if model_path else None
    if folder is None or not folder.is_dir():
        why = f"model.path {model_path} is not a local folder" if model_path else "no model folder"
        return ChatTemplate(f"{QWEN_CHATML.source} ({why})")
    config_file, jinja_file = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    config = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{config_file}: cannot be read as JSON ({exc}); fix or remove it") from None
    text: object  # the template's source: what tokenizer_config.json holds may be anything
    if jinja_file.is_file():
        file, text = jinja_file, jinja_file.read_text(encoding="utf-8")
    else:
        file, text = config_file, config.get("chat_template")
        if isinstance(text, list):  # several named templates
            text = next((t.get("template") for t in text if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(text, str) or not text.strip():
        return ChatTemplate(f"{QWEN_CHATML.source} ({folder} has no chat template)")
    try:
        _compiled(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(
            f"{file}: the chat template is not valid Jinja (line {exc.lineno}: {exc.message}); fix it, "
            "or remove it to use the Qwen ChatML fallback"
        ) from None
    tokens = []
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens.append((name, value))
    return ChatTemplate(f"{file.name} of {folder}", text, tuple(tokens))
