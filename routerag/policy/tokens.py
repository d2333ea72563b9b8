"""Counting and cutting text in the policy's tokens: exact with its tokenizer, approximate without one (a remote
endpoint whose tokenizer is not at hand), so limits like "500 information tokens" mean the same everywhere."""

from __future__ import annotations

import re
from typing import Any

_PIECE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WORD_TOKENS = 1.3  # sub-word tokens per word piece, typical of BPE vocabularies on English text


class TokenCounter:
    def __init__(self, tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeError("token ids need the policy's tokenizer")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.encode(text))
        return int(len(_PIECE.findall(text)) * _WORD_TOKENS + 0.5)

    def truncate(self, text: str, limit: int) -> str:
        """At most ``limit`` tokens of ``text`` (a prefix)."""
        if limit <= 0:
            return ""
        if self.tokenizer is not None:
            ids = self.encode(text)
            return text if len(ids) <= limit else self.tokenizer.decode(ids[:limit])
        pieces = list(_PIECE.finditer(text))
        keep = int(limit / _WORD_TOKENS)
        return text if len(pieces) <= keep else text[: pieces[keep].start()].rstrip()
