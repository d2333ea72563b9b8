"""Every prompt the query side sends a language model, by name, and the few functions that fill them in.

* the policy (RouteRAG's scheme, our wording): :data:`DEFAULT_INSTRUCTION` (or :data:`REFUSAL_INSTRUCTION`, which
  adds the refusal convention :data:`REFUSE_MARKER`), and what the loop writes into its context:
  :data:`INFORMATION_BLOCK` (documents as :data:`DOCUMENT`), :data:`INVALID_NOTICE`, :data:`BUDGET_NOTICE`,
  :data:`SEARCH_FAILED_NOTICE`; a refusal's answer, :data:`REFUSAL_ANSWER`;
* the readers: :data:`DOCUMENTS_TEMPLATE`, :data:`DIRECT_TEMPLATE`, :data:`FEWSHOT_READER`;
* the fact filter: :data:`FACT_FILTER_SYSTEM`, :data:`FACT_FILTER_QUESTION`;
* the warm start's trajectories: :data:`SEARCH_TAGS` and the thoughts (``*_THOUGHTS``, :data:`REFUSE_THOUGHT`);
* ChatML, the fallback chat template: :func:`chatml`.

The build's OpenIE prompts live beside their extractor (:mod:`graph_index.openie.prompts`, whose text versions its
cache), a layer below this one; :data:`TEMPLATES` lists them with the rest, so this module is the one list of
what every model is told. The policy reasons in ``<think>``, searches with ``<search>[passage] q</search>`` (dense),
``<search>[graph] q</search>`` (knowledge graph) or both tags (fused), reads ``<information>``, and ends with
``<answer>``. Another instruction can be loaded from a file (``policy.template_file``); it must contain
``{question}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from graph_index.openie import prompts as openie

from .vocabulary import Mode

# -- the policy ---------------------------------------------------------------------------------------------------

_POLICY_RULES = """Answer the question. Reason inside <think> </think>. To look something up, write \
<search>[passage] query</search> (search passages), <search>[graph] query</search> (search a knowledge graph of \
facts, for chains of facts) or <search>[graph][passage] query</search> (both). Results come back inside \
<information> </information>. Search only when needed. Give the final answer inside <answer> </answer>, for \
example <answer> Paris </answer>."""
_QUESTION_LINE = "\nQuestion: {question}\n"

DEFAULT_INSTRUCTION = _POLICY_RULES + _QUESTION_LINE
"""The policy's instruction (RouteRAG's scheme). Its text is frozen: trained policies carry it in their card, and
their evaluation numbers depend on it."""

REFUSE_MARKER = "[refuse]"
"""The refusal convention: ``<answer> [refuse] </answer>`` says the documents do not answer the question (EVO-RAG's
refuse action). An answer that begins with the marker is a refusal (:func:`routerag.policy.parsing.is_refusal`)."""
REFUSAL_ANSWER = "The retrieved documents do not answer this question."
"""The final answer of a refused trajectory, as a person reads it (``/ask``, ``routerag ask``)."""
REFUSAL_RULE = (f" If the documents you find do not answer the question, answer <answer> {REFUSE_MARKER} </answer> "
                "instead of guessing.")
REFUSAL_INSTRUCTION = _POLICY_RULES + REFUSAL_RULE + _QUESTION_LINE
""":data:`DEFAULT_INSTRUCTION` plus the refusal convention: the template of a policy warm-started with refusals
(``routerag train-sft --refusals`` records it in the policy's card)."""

DOCUMENT = "Doc {i} (Title: {title}) {text}"
"""One retrieved document, as the policy and every reader see it (numbered from 1)."""
INFORMATION_BLOCK = "\n\n<information>{documents}</information>\n\n"
"""What a search appends to the policy's context."""
SEARCH_FAILED_NOTICE = "\n\n<information>That search failed: {error}.</information>\n\n"
"""Appended instead when the retriever refuses the policy's query (its turn counts as invalid)."""
INVALID_NOTICE = ("\nMy previous action is invalid. To search, I should put the query between <search> and "
                  "</search>. To give the final answer, I should put it between <answer> and </answer>. "
                  "Let me try again.\n")
"""Appended after a turn with neither a complete search nor an answer."""
BUDGET_NOTICE = "\n\n<information>The search budget is used up. I must answer now.</information>\n\n<answer>"
"""Appended when an answer is forced: it opens the ``<answer>`` tag the policy then completes."""
BUDGET_NOTICE_TEXT = "the search budget is used up. i must answer now."
"""The notice's words, lower-cased: a small model that only echoes them has not answered."""

# -- the readers --------------------------------------------------------------------------------------------------

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

# -- the fact filter (HippoRAG 2's recognition memory) -----------------------------------------------------------

FACT_FILTER_SYSTEM = (
    "You select evidence for a question-answering system. You get a question and numbered candidate facts, each a "
    "(subject, relation, object) triple extracted from documents. Keep the facts that are about the entities of "
    "the question or lead towards its answer; drop the ones that only share words with it. Reply with JSON only: "
    '{"keep": [numbers of the kept facts, most useful first]}; {"keep": []} if none helps.'
)
FACT_FILTER_QUESTION = "Question: {query}\n\nCandidate facts:\n{facts}"
FACT_FILTER_FACT = "{n}. ({subject}; {relation}; {object})"

# -- the warm start's trajectories (training/sft.py) --------------------------------------------------------------

SEARCH_TAGS: dict[Mode, str] = {"passage": "[passage]", "graph": "[graph]", "hybrid": "[graph][passage]"}
"""How the policy writes each retrieval mode (the parser reads both tags as hybrid)."""
# Thoughts vary and carry content (the question, the page found, the answer read from it): with one fixed sentence
# per turn, a 135M model learned to repeat the sentences (even as its answer) instead of reading the documents.
FIRST_THOUGHTS = ("I need to look this up.", "I do not know this; I will search for it.",
                  "Question: {question} I should search.", "Let me search for {query}.")
NEXT_THOUGHTS = ("The documents do not say it; I need one more search.", "None of these answers it; I will search "
                 "another way.", "Now I search for {query}.")
CHECK_THOUGHTS = ("Let me check it with one more search.", "I will confirm it with another search.")
"""The thought before a search made although the documents already answer (``train-sft --extra-searches``): a
neutral reason, so the warm start teaches searching again as a habit, not as a reading of the documents (with
NEXT_THOUGHTS' "the documents do not say it" before documents that did, sft7 searched again on 11% of held-out
questions against 58% of its examples)."""
FOUND_THOUGHTS = ("The answer is in Doc {n}.", "Doc {n} answers it.")
"""The warm start's last thought names the document that holds the answer instead of quoting it: a 135M policy
trained to write ``<title> says: "<sentence>"`` looped on that template under greedy decoding (docs/training.md),
while a document number is one token it cannot get stuck in."""
COMBINED_THOUGHTS = ("Together the documents answer it.", "Both searches together answer it.")
"""The last thought of a multi-hop warm-start trajectory whose answer no single document spells out (a comparison's
"yes"), once every supporting passage was retrieved."""
GUESS_THOUGHTS = ("The documents do not say it directly.", "I did not find it stated; my best guess follows.")
REFUSE_THOUGHT = "None of the documents gives the answer."
"""The thought before a warm-start refusal (``--refusals``), one short sentence."""

# -- ChatML -------------------------------------------------------------------------------------------------------

CHATML_SYSTEM = "You are a helpful assistant."
"""ChatML (Qwen2.5, SmolLM2) is the fallback when no tokenizer with a chat template is at hand (e.g. a remote
completions endpoint)."""


def chatml(user: str, system: str | None = CHATML_SYSTEM) -> str:
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# -- filling them in ----------------------------------------------------------------------------------------------


class Titled(Protocol):
    title: str
    text: str


def format_documents(docs: Sequence[Titled]) -> str:
    """``Doc 1 (Title: …) text`` lines: the one way documents are shown to the policy and to every reader."""
    return "\n".join(DOCUMENT.format(i=i, title=d.title, text=d.text) for i, d in enumerate(docs, 1))


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


def fact_filter_question(query: str, facts: Iterable[tuple[str, str, str]]) -> str:
    listing = "\n".join(FACT_FILTER_FACT.format(n=i, subject=s, relation=p, object=o)
                        for i, (s, p, o) in enumerate(facts, 1))
    return FACT_FILTER_QUESTION.format(query=query, facts=listing)


TEMPLATES: Mapping[str, str] = {
    "policy_instruction": DEFAULT_INSTRUCTION,
    "policy_instruction_refusal": REFUSAL_INSTRUCTION,
    "document": DOCUMENT,
    "information_block": INFORMATION_BLOCK,
    "search_failed_notice": SEARCH_FAILED_NOTICE,
    "invalid_notice": INVALID_NOTICE,
    "budget_notice": BUDGET_NOTICE,
    "reader_documents": DOCUMENTS_TEMPLATE,
    "reader_direct": DIRECT_TEMPLATE,
    "reader_fewshot": FEWSHOT_READER,
    "fact_filter_system": FACT_FILTER_SYSTEM,
    "fact_filter_question": FACT_FILTER_QUESTION,
    "fact_filter_fact": FACT_FILTER_FACT,
    "chatml_system": CHATML_SYSTEM,
    "openie_ner_system": openie.NER_SYSTEM,
    "openie_triple_system": openie.TRIPLE_SYSTEM,
    "openie_passage": openie.PASSAGE_FRAME,
    "openie_triples_question": openie.TRIPLE_FRAME,
}
"""Every prompt text by name, the build's OpenIE prompts included (the warm start's thoughts are lists, above)."""
