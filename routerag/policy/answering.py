"""Answering without the search loop: from given documents (naive RAG, s3's frozen generator) or directly."""

from __future__ import annotations

from collections.abc import Sequence

from ..retrieval import RetrievedDoc
from .parsing import close_stop
from .types import GenerationRequest, Generator

DOCUMENTS_TEMPLATE = """Answer the question using the documents below. Write only the answer, between <answer> and \
</answer>, for example <answer> Canberra </answer>.
{documents}
Question: {question}
"""

DIRECT_TEMPLATE = """Answer the question. Write only the answer, between <answer> and </answer>, for example \
<answer> Canberra </answer>.
Question: {question}
"""


def format_documents(docs: Sequence[RetrievedDoc]) -> str:
    return "\n".join(f"Doc {i} (Title: {d.title}) {d.text}" for i, d in enumerate(docs, 1))


def extract_answer(text: str) -> str:
    """The text inside the first ``<answer>`` (or the whole reply when the model skipped the tags)."""
    lower = text.lower()
    start = lower.find("<answer>")
    if start < 0:
        return " ".join(text.split("</answer>")[0].split())
    end = lower.find("</answer>", start)
    body = text[start + len("<answer>") : end if end >= 0 else None]
    return " ".join(body.split())


async def _answer(generator: Generator, message: str, max_tokens: int, temperature: float | None) -> str:
    text, ids = generator.render_prompt(message)
    gen = await generator.generate(GenerationRequest(prompt_text=text, prompt_ids=ids, max_tokens=max_tokens,
                                                     stop=("</answer>",), temperature=temperature))
    out = gen.text if gen.token_ids is not None else close_stop(gen.text)
    return extract_answer(out)


async def answer_from_documents(generator: Generator, question: str, docs: Sequence[RetrievedDoc], *,
                                max_tokens: int = 64, temperature: float | None = 0.0) -> str:
    message = DOCUMENTS_TEMPLATE.format(documents=format_documents(docs), question=question.strip())
    return await _answer(generator, message, max_tokens, temperature)


async def answer_directly(generator: Generator, question: str, *, max_tokens: int = 64,
                          temperature: float | None = 0.0) -> str:
    return await _answer(generator, DIRECT_TEMPLATE.format(question=question.strip()), max_tokens, temperature)
