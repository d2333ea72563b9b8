"""Answering from given documents (the reader: s3's answer generator, the policy's base model, naive RAG) or
directly (no retrieval).

:class:`Reader` is the one reader: the policy loop's final answer and the naive-RAG baseline both go through it, so
"the same reader" means the same model, prompt and short-answer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..retrieval.types import RetrievedDoc
from ..vocabulary import ReaderPrompt
from .parsing import close_stop
from ..prompts import DIRECT_TEMPLATE, DOCUMENTS_TEMPLATE, FEWSHOT_READER, format_documents
from .types import GenerationRequest, Generator

if TYPE_CHECKING:
    from .extractive import ExtractiveReader, ReaderAnswer

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
                                                     stop=("</answer>",), temperature=temperature,
                                                     user_message=message))
    out = gen.text if gen.token_ids is not None else close_stop(gen.text)
    return extract_answer(out)


async def answer_from_documents(generator: Generator, question: str, docs: Sequence[RetrievedDoc], *,
                                max_tokens: int = 64, temperature: float | None = 0.0) -> str:
    message = DOCUMENTS_TEMPLATE.format(documents=format_documents(docs), question=question.strip())
    return await _answer(generator, message, max_tokens, temperature)


async def answer_directly(generator: Generator, question: str, *, max_tokens: int = 64,
                          temperature: float | None = 0.0) -> str:
    return await _answer(generator, DIRECT_TEMPLATE.format(question=question.strip()), max_tokens, temperature)


async def answer_fewshot(generator: Generator, question: str, docs: Sequence[RetrievedDoc], *,
                         max_tokens: int = 24, temperature: float | None = 0.0) -> str:
    """The few-shot completion reader (:data:`~routerag.prompts.FEWSHOT_READER`): the answer is the rest of
    the ``Answer:`` line."""
    text = FEWSHOT_READER.format(documents=format_documents(docs), question=" ".join(question.split()))
    gen = await generator.generate(GenerationRequest(prompt_text=text, prompt_ids=None, max_tokens=max_tokens,
                                                     stop=("\n",), temperature=temperature, user_message=text))
    return " ".join(gen.text.split("\n")[0].split())


@dataclass(slots=True)
class Reader:
    """Writes the final answer from documents: a model, a prompt style (``instruct``: a chat message asking for the
    answer in tags; ``fewshot``: a plain completion after four worked examples) and, optionally, the short-answer
    step (:func:`routerag.policy.short_answer.shorten`)."""

    generator: Generator | None
    """None: no model reads (the policy's own answer stands; :meth:`shorten` may still cut it)."""
    prompt: ReaderPrompt = "instruct"
    short_answer: bool = False
    extractive: ExtractiveReader | None = None
    """Set: the extractive reader answers instead of ``generator`` (a span, or an abstention)."""

    @property
    def reads(self) -> bool:
        """A model writes the final answer (else the policy's own answer stands)."""
        return self.generator is not None or self.extractive is not None

    async def read_answer(self, question: str, docs: Sequence[RetrievedDoc]) -> ReaderAnswer:
        """The answer with its score and citation; ``answer`` None when the extractive reader abstains. The
        generative reader never abstains and cites nothing itself (its citations are string matches after the
        fact, :func:`~routerag.policy.citations.cite`)."""
        from .extractive import ReaderAnswer

        if self.extractive is not None:
            return await self.extractive.read(question, docs)
        return ReaderAnswer(await self.read(question, docs), 1.0)

    async def read(self, question: str, docs: Sequence[RetrievedDoc]) -> str:
        """The answer from ``docs`` (none: from the model's own knowledge, :func:`answer_directly`)."""
        if self.generator is None:
            raise ValueError("this reader has no model")
        if not docs:
            return await answer_directly(self.generator, question)
        if self.prompt == "fewshot":
            answer = await answer_fewshot(self.generator, question, docs)
        else:
            answer = await answer_from_documents(self.generator, question, docs)
        return self.shorten(question, answer, docs)

    def shorten(self, question: str, answer: str, docs: Sequence[RetrievedDoc]) -> str:
        if not (self.short_answer and answer and docs):
            return answer
        from .short_answer import shorten

        return shorten(question, answer, docs)
