"""Naive RAG's answer to a question, the baseline of s3's Gain Beyond RAG: the question's top ``k`` documents in one
mode, read by the reader the policy's answers are read by. The local trainer and verl's agent loop both call
:func:`naive_rag_answer`, so the reward compares the same things in both."""

from __future__ import annotations

from routerag.policy.answering import Reader
from routerag.policy.types import Generator, SearchBackend
from routerag.vocabulary import Mode


async def naive_rag_answer(reader: Reader, search: SearchBackend, question: str, *, mode: Mode,
                           k: int) -> str | None:
    """Search ``question`` once (``mode``, ``k`` documents) and read the answer from what came back (None: the
    extractive reader abstained)."""
    result = await search.search(question, mode, k)
    return (await reader.read_answer(question, result.docs)).answer


def baseline_reader(loop_reader: Reader, policy: Generator) -> Reader:
    """The reader of the rollouts' answers, or, when the policy answers on its own, the policy reading the
    documents with the same prompt style."""
    return loop_reader if loop_reader.reads else Reader(policy, loop_reader.prompt,
                                                                        loop_reader.short_answer)
