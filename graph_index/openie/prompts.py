"""Prompts of the LLM extractor: HippoRAG's two-step scheme (named entities first, then triples conditioned on
them), in our own words and with our own one-shot example.

Both steps are chat-message lists: a system instruction, one worked example (user passage → assistant JSON) and
the real passage. The example shows the model the exact JSON shape we parse, and the triple example shows
pronouns ("They", "his") replaced by the names they stand for.

:data:`PROMPT_VERSION` is derived from the text of every prompt below, so editing any of them changes the
extractor's identity and therefore its cache namespace: results of older prompts are never reused by mistake.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

Message = dict[str, str]

PROMPT_REVISION = 1
"""Bump by hand for a change that does not alter the text (e.g. how replies are read); the hash covers the rest."""

NER_SYSTEM = """You find the named entities in a passage so that they can become nodes of a knowledge graph.
List every specific, named thing the passage mentions: people, organisations, places, works, events, products, \
species, and also dates, years and quantities that pin something down.
Write each entity as it appears in the passage, list it once, and add nothing the passage does not mention.
Answer with one JSON object of the form {"named_entities": ["...", "..."]} and no other text."""

TRIPLE_SYSTEM = """You turn a passage into facts for a knowledge graph. You get the passage and the named entities \
already found in it. Write every fact the passage states as a triple ["subject", "relation", "object"].
Rules:
- Every triple must have at least one of the listed named entities as its subject or object, ideally both.
- Replace pronouns and vague references ("he", "they", "the band", "the city") by the full name they refer to.
- Keep relations short verb phrases such as "born in", "founded by", "is", "located in".
- One fact per triple: split lists and conjunctions into separate triples.
- Use only what the passage says; add no outside knowledge.
Answer with one JSON object of the form {"triples": [["subject", "relation", "object"], ...]} and no other text."""

PASSAGE_FRAME = "Passage:\n```\n{passage}\n```"
TRIPLE_FRAME = PASSAGE_FRAME + "\n\nNamed entities: {entities}\n\nWrite the triples."

EXAMPLE_PASSAGE = """The Kelpies
The Kelpies are a pair of 30-metre steel horse heads standing beside the Forth and Clyde Canal in Falkirk, \
Scotland. They were designed by the sculptor Andy Scott and completed in October 2013. Scott modelled them on two \
Clydesdale horses, Duke and Baron, and said his work pays tribute to the draught horses that once towed barges \
along the canal."""

EXAMPLE_ENTITIES = ["The Kelpies", "30-metre", "Forth and Clyde Canal", "Falkirk", "Scotland", "Andy Scott",
                    "October 2013", "Clydesdale", "Duke", "Baron"]

EXAMPLE_TRIPLES = [
    ["The Kelpies", "is", "pair of steel horse heads"],
    ["The Kelpies", "height", "30-metre"],
    ["The Kelpies", "stands beside", "Forth and Clyde Canal"],
    ["The Kelpies", "located in", "Falkirk"],
    ["Falkirk", "located in", "Scotland"],
    ["The Kelpies", "designed by", "Andy Scott"],
    ["Andy Scott", "is", "sculptor"],
    ["The Kelpies", "completed in", "October 2013"],
    ["The Kelpies", "modelled on", "Duke"],
    ["The Kelpies", "modelled on", "Baron"],
    ["Duke", "is", "Clydesdale"],
    ["Baron", "is", "Clydesdale"],
    ["The Kelpies", "pays tribute to", "draught horses"],
    ["draught horses", "towed barges along", "Forth and Clyde Canal"],
]


def _entities_json(entities: Sequence[str]) -> str:
    return json.dumps({"named_entities": list(entities)}, ensure_ascii=False)


def _triples_json(triples: Sequence[Sequence[str]]) -> str:
    rows = ",\n".join("  " + json.dumps(list(t), ensure_ascii=False) for t in triples)
    return '{"triples": [\n' + rows + "\n]}"


def ner_messages(passage: str) -> list[Message]:
    """Chat messages asking for the named entities of ``passage`` (title line + text)."""
    return [
        {"role": "system", "content": NER_SYSTEM},
        {"role": "user", "content": PASSAGE_FRAME.format(passage=EXAMPLE_PASSAGE)},
        {"role": "assistant", "content": _entities_json(EXAMPLE_ENTITIES)},
        {"role": "user", "content": PASSAGE_FRAME.format(passage=passage)},
    ]


def triple_messages(passage: str, entities: Sequence[str]) -> list[Message]:
    """Chat messages asking for the triples of ``passage``, given the entities the NER step found in it."""
    return [
        {"role": "system", "content": TRIPLE_SYSTEM},
        {"role": "user", "content": TRIPLE_FRAME.format(passage=EXAMPLE_PASSAGE,
                                                        entities=_entities_json(EXAMPLE_ENTITIES))},
        {"role": "assistant", "content": _triples_json(EXAMPLE_TRIPLES)},
        {"role": "user", "content": TRIPLE_FRAME.format(passage=passage, entities=_entities_json(entities))},
    ]


def _version() -> str:
    probe = [ner_messages("{passage}"), triple_messages("{passage}", ["{entity}"])]
    digest = hashlib.sha256(json.dumps(probe, sort_keys=True).encode("utf-8")).hexdigest()
    return f"p{PROMPT_REVISION}-{digest[:10]}"


PROMPT_VERSION = _version()
"""``p<revision>-<hash of all prompt text>``; part of :attr:`LLMExtractor.identity` (the cache namespace)."""
