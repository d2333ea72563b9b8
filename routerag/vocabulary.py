"""The words the layers above the index share, each defined once: retrieval modes, how a trajectory ends, what a
step did, who reads the final answer. Settings, the retriever, the policy loop, the server's wire format,
evaluation and the trainers all import them from here, so adding a mode or a finish is one edit.

This module imports nothing of ours: every layer from :mod:`routerag.config` up may use it.
"""

from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["passage", "graph", "hybrid"]
"""How a search retrieves (RouteRAG): dense passages, Personalized PageRank over the knowledge graph, or both fused
by Reciprocal Rank Fusion."""
MODES: tuple[Mode, ...] = get_args(Mode)

AskMode = Literal["learned", Mode]
"""How ``/ask`` and ``routerag ask`` route: ``learned`` (the policy chooses per search) or one forced mode."""
ASK_MODES: tuple[AskMode, ...] = get_args(AskMode)

Finish = Literal["answer", "refused", "forced_answer", "no_answer", "error"]
"""How a trajectory ended: the policy answered on its own, refused on its own (it said the documents do not answer
the question, :data:`routerag.prompts.REFUSE_MARKER`), was made to answer (budget or invalid turns), gave no answer
(cut off, or an empty forced answer), or failed (evaluation records only)."""

AnsweredBy = Literal["policy", "reader"]
"""Who wrote the final answer: the policy (its draft, maybe shortened to a span) or a reader that read the retrieved
documents (extractive or a generator). The policy's own answer is always its *draft*."""

StepAction = Literal["search", "answer", "refuse", "invalid", "over_budget", "forced_answer", "truncated"]
"""What one turn of the policy did."""

SegmentKind = Literal["prompt", "policy", "information"]
"""Who wrote a piece of the context: the prompt, the policy (trained on), or the loop (masked out of the loss)."""

ReaderKind = Literal["policy", "base", "generator", "extractive"]
"""Who writes the final answer: the policy in its ``<answer>``, the policy's base model with its adapter off, a
configured answer generator, or the extractive reader (a span of the retrieved documents, or an abstention)."""

QueryMode = Literal["grounded", "free"]
"""What a policy may search for: ``grounded`` (the question, a span of it, or a title, entity or noun chunk of the
documents shown so far; anything else is replaced by the closest of those) or ``free`` (whatever it writes)."""

ReaderPrompt = Literal["instruct", "fewshot"]
"""How a reader is asked: a chat message asking for the answer in tags, or a plain few-shot completion."""
