"""The policy prompt (RouteRAG's scheme, our wording) and how a context is turned into model input.

The model reasons in ``<think>``, searches with ``<search>[passage] q</search>`` (dense), ``<search>[graph] q
</search>`` (knowledge graph) or both tags (fused), reads ``<information>``, and ends with ``<answer>``. A different
template can be loaded from a file; it must contain ``{question}``.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_INSTRUCTION = """Answer the question. Reason inside <think> </think>. To look something up, write \
<search>[passage] query</search> (search passages), <search>[graph] query</search> (search a knowledge graph of \
facts, for chains of facts) or <search>[graph][passage] query</search> (both). Results come back inside \
<information> </information>. Search only when needed. Give the final answer inside <answer> </answer>, for \
example <answer> Paris </answer>.
Question: {question}
"""


DOCUMENTS_TEMPLATE = """Answer the question using the documents below. Write only the answer, between <answer> and \
</answer>, for example <answer> Canberra </answer>.
{documents}
Question: {question}
"""
"""The instruct reader: a chat message (naive RAG, s3's answer generator)."""

DIRECT_TEMPLATE = """Answer the question. Write only the answer, between <answer> and </answer>, for example \
<answer> Canberra </answer>.
Question: {question}
"""
"""Answering without documents (the no-retrieval baseline)."""

FEWSHOT_READER = """Doc 1 (Title: The Hobbit) The Hobbit, or There and Back Again is a children's fantasy novel by the \
English author J. R. R. Tolkien. It was published in 1937.
Question: Who wrote The Hobbit?
Answer: J. R. R. Tolkien

Doc 1 (Title: Ada Lovelace) Augusta Ada King, Countess of Lovelace (1815–1852), was an English mathematician and \
writer, born in London.
Question: Where was Ada Lovelace born?
Answer: London

Doc 1 (Title: Miles Davis) Miles Dewey Davis III (1926–1991) was an American trumpeter, bandleader and composer.
Question: What was Miles Davis's profession?
Answer: trumpeter

Doc 1 (Title: Eiffel Tower) The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed \
in 1889.
Question: In which year was the Eiffel Tower completed?
Answer: 1889

{documents}
Question: {question}
Answer:"""
"""The few-shot reader: a plain completion (no chat template) that shows, with four questions of other kinds than
any benchmark's, that an answer is a few words copied from a document. A 135M model follows the pattern where it
ignores the instruction to be brief (it writes a sentence around the answer)."""


def load_template(path: str | Path | None) -> str:
    """The instruction template: the default, or a file that contains ``{question}``."""
    if path is None:
        return DEFAULT_INSTRUCTION
    text = Path(path).read_text(encoding="utf-8")
    if "{question}" not in text:
        raise ValueError(f"{path}: a prompt template must contain {{question}}")
    return text


def user_message(template: str, question: str) -> str:
    return template.replace("{question}", question.strip())


# ChatML, as used by Qwen2.5 and SmolLM2: the fallback when no tokenizer with a chat template is at hand (e.g. a
# remote completions endpoint).
CHATML_SYSTEM = "You are a helpful assistant."


def chatml(user: str, system: str | None = CHATML_SYSTEM) -> str:
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
