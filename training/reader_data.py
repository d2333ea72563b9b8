"""Span data for the extractive reader (:mod:`routerag.policy.extractive`), from training splits only.

Splits (deterministic; the held-out halves are never read here):

* **PopQA** (``popqa_dev.json``, 500): ``random.Random(0).shuffle``, the first 300 train, the last 200 are held out
  (the split of docs/results.md and of the shipped router's card).
* **HotpotQA-100**: by type (bridge, comparison), each type's questions in file order shuffled with
  ``random.Random(0)``; the first half of each type trains (39 bridge + 11 comparison), the rest is held out.

Examples are (question, document, answer span or none):

* each training question with its gold passages (the answer located in them: the first whole-word occurrence of
  its first alias that occurs, case folded); two of HotpotQA's distractor paragraphs are negatives, and so are, for
  PopQA, another training question's subject page of the same relation (:func:`popqa_negatives`);
* with ``index``, each PopQA training question's own retrieved documents (one graph and one passage search of the
  question, the documents the reader meets when serving), labelled the same way: distant supervision, so a
  document that names the answer is a positive even when it is not a gold passage;
* yes/no examples: HotpotQA's training yes/no questions on their gold passages, and one question made from every
  other PopQA training fact ("Was X born in Y?", "Was X a Y?"), alternately "yes" with the true object and "no" with
  another training question's object of the same relation, on the subject's gold passage;
* PopQA's training questions asked in other words ("Where was X born?", "What does X do for a living?") and pairs
  of its training subjects compared the way HotpotQA does ("Are X and Y both actors?", "Were X and Y born in the
  same city?"), yes or no, on both subjects' pages;
* corpus-derived questions (``routerag make-questions`` files, from training corpora only): every question on each
  of its gold passages (a passage that does not hold the answer, such as a bridge's first hop, or any passage of an
  unanswerable question, is a negative), plus one other question's passage as a negative; each comparison question
  is also asked as yes/no ("Was X founded before Y?") on both passages;
* with each question file's own index (``questions_index``), each of its questions' retrieved distractor: the
  highest-ranked document of one graph search of the question (k 3) that is neither a gold passage nor holds an
  answer, as a negative (:func:`retrieved_distractors`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routerag.config import DEFAULT_K

SPLIT_SEED = 0
POPQA_TRAIN = 300


@dataclass(frozen=True, slots=True)
class SpanExample:
    question: str
    title: str
    text: str
    answer: str | None = None
    """The answer text as it occurs in ``title\\ntext`` (None: this document does not answer)."""
    answer_start: int = -1
    """Character offset of ``answer`` in ``title\\ntext``."""
    yes_no: bool | None = None
    """For yes/no questions: the answer (the span targets are then "no span")."""
    source: str = ""

    @property
    def context(self) -> str:
        title = " ".join(self.title.split())
        return (f"{title}\n" if title else "") + self.text


def popqa_split(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(train 300, held-out 200) rows of ``popqa_dev.json``."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    random.Random(SPLIT_SEED).shuffle(rows)
    return rows[:POPQA_TRAIN], rows[POPQA_TRAIN:]


def hotpot_split(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(train half, held-out half) rows of ``hotpotqa_100.json``, half of each question type."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    train: list[dict] = []
    held: list[dict] = []
    for kind in sorted({r.get("type", "") for r in rows}):
        group = [r for r in rows if r.get("type", "") == kind]
        random.Random(SPLIT_SEED).shuffle(group)
        half = len(group) // 2
        train += group[:half]
        held += group[half:]
    return train, held


def locate(answers: Sequence[str], context: str) -> tuple[str, int] | None:
    """The first whole-word, case-folded occurrence in ``context`` of the first alias that occurs."""
    for alias in answers:
        alias = " ".join(alias.split())
        if len(alias) < 2:
            continue
        m = re.search(rf"(?<!\w){re.escape(alias)}(?!\w)", context, flags=re.IGNORECASE)
        if m:
            return context[m.start():m.end()], m.start()
    return None


def labelled(question: str, title: str, text: str, answers: Sequence[str], source: str) -> SpanExample:
    ex = SpanExample(question, title, text, source=source)
    found = locate(answers, ex.context)
    if found is None:
        return ex
    return SpanExample(question, title, text, found[0], found[1], source=source)


def popqa_answers(row: dict) -> list[str]:
    raw = row.get("possible_answers", "[]")
    return json.loads(raw) if isinstance(raw, str) else list(raw)


def popqa_examples(rows: Iterable[dict], retrieved: dict[str, list[tuple[str, str]]] | None = None) -> list[SpanExample]:
    """Gold passages, and the retrieved documents when given (question → [(title, text)])."""
    out = []
    for row in rows:
        answers = popqa_answers(row)
        seen = set()
        docs = [(p["title"], p["text"]) for p in row["paragraphs"]] + list((retrieved or {}).get(row["question"], []))
        for title, text in docs:
            if (title, text) in seen:
                continue
            seen.add((title, text))
            out.append(labelled(row["question"], title, text, answers, "popqa"))
    return out


def popqa_negatives(rows: Sequence[dict], per_question: int = 1) -> list[SpanExample]:
    """Hard negatives: subject pages of other training questions of the same relation (another person's "born in
    X" or "is an actor"), which the reader must not answer from; pages that happen to name the answer are skipped."""
    rng = random.Random(SPLIT_SEED + 1)
    pages: dict[str, list[dict]] = {}
    for r in rows:
        pages.setdefault(r.get("prop", ""), []).append(r["paragraphs"][0])
    out = []
    for r in rows:
        answers = popqa_answers(r)
        pool = [p for p in pages[r.get("prop", "")] if p not in r["paragraphs"]]
        for page in rng.sample(pool, min(per_question, len(pool))):
            ex = labelled(r["question"], page["title"], page["text"], answers, "popqa-negative")
            if ex.answer is None:
                out.append(ex)
    return out


def hotpot_examples(rows: Iterable[dict], distractors: int = 2) -> list[SpanExample]:
    """The gold paragraphs with the answer located (the yes/no label for yes/no questions) and the first
    ``distractors`` distractor paragraphs as negatives."""
    out = []
    for row in rows:
        gold = {f[0] for f in row.get("supporting_facts", [])}
        kept = {t for t, _ in row.get("context", []) if t not in gold}
        kept = set(list(dict.fromkeys(t for t, _ in row.get("context", []) if t in kept))[:distractors])
        answer = str(row["answer"]).strip()
        for title, sentences in row.get("context", []):
            text = "".join(sentences)
            if answer.lower() in ("yes", "no"):
                if title in gold:
                    out.append(SpanExample(row["question"], title, text, yes_no=answer.lower() == "yes",
                                           source="hotpot-yesno"))
                continue
            if title in gold:
                out.append(labelled(row["question"], title, text, [answer], "hotpot"))
            elif title in kept:
                out.append(SpanExample(row["question"], title, text, source="hotpot"))
    return out


def popqa_yes_no(rows: Sequence[dict]) -> list[SpanExample]:
    """"Was X born in Y?" / "Was X a Y?" from training facts, on the subject's gold passage: "yes" (the true
    object) for every other question, "no" (another question's object of the same relation) for the rest."""
    rng = random.Random(SPLIT_SEED)
    by_prop: dict[str, list[str]] = {}
    for r in rows:
        by_prop.setdefault(r.get("prop", ""), []).append(r.get("obj", ""))
    out = []
    for n, r in enumerate(rows):
        subject_page = next((p for p in r["paragraphs"] if p["title"] == r.get("s_wiki_title", r.get("subj"))),
                            r["paragraphs"][0])
        others = [o for o in by_prop[r.get("prop", "")] if o and o.lower() != r.get("obj", "").lower()]
        if not others or not r.get("obj"):
            continue
        if n % 2:  # one question in two: yes/no examples are a small part of what is asked
            continue
        truth = n % 4 == 0
        obj = r["obj"] if truth else rng.choice(others)
        q = (f"Was {r['subj']} born in {obj}?" if "birth" in r.get("prop", "")
             else f"Was {r['subj']} a {obj.lower()}?")
        out.append(SpanExample(q, subject_page["title"], subject_page["text"], yes_no=truth, source="popqa-yesno"))
    return out


_POPQA_FORMS = {
    "place of birth": ["Where was {s} born?", "What is the birthplace of {s}?", "{s} was born in which city?",
                       "In which town was {s} born?", "Which place is {s} from, by birth?"],
    "occupation": ["What does {s} do for a living?", "What was {s}'s profession?", "What job did {s} have?",
                   "{s} worked as what?", "What kind of work is {s} known for?"],
}


def popqa_paraphrases(rows: Sequence[dict]) -> list[SpanExample]:
    """Each training question in another of its relation's forms, on its gold passages: the reader should read the
    question, not recognise PopQA's two templates."""
    rng = random.Random(SPLIT_SEED + 2)
    out = []
    for r in rows:
        forms = _POPQA_FORMS.get(r.get("prop", ""))
        if not forms or not r.get("subj"):
            continue
        q = rng.choice(forms).format(s=r["subj"])
        out += [labelled(q, p["title"], p["text"], popqa_answers(r), "popqa-paraphrase") for p in r["paragraphs"]]
    return out


def _subject_page(row: dict) -> dict:
    return next((p for p in row["paragraphs"] if p["title"] == row.get("s_wiki_title", row.get("subj"))),
                row["paragraphs"][0])


def popqa_pair_yes_no(rows: Sequence[dict]) -> list[SpanExample]:
    """HotpotQA-style comparisons of two training subjects, on both subjects' pages in one context: "Are X and Y
    both <occupation>s?" / "Were X and Y born in the same place?", half of them "yes" (same object)."""
    rng = random.Random(SPLIT_SEED + 3)
    by_obj: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by_obj.setdefault((r.get("prop", ""), r.get("obj", "").lower()), []).append(r)
    out = []
    for n, a in enumerate(rows):
        same = [b for b in by_obj[(a.get("prop", ""), a.get("obj", "").lower())] if b is not a]
        other = [b for b in rows if b.get("prop") == a.get("prop") and b.get("obj", "").lower() != a["obj"].lower()]
        truth = n % 2 == 0 and bool(same)
        pool = same if truth else other
        if not pool:
            continue
        b = rng.choice(pool)
        if a.get("prop") == "occupation":
            q = f"Are {a['subj']} and {b['subj']} both {a['obj'].lower()}s?" if truth or rng.random() < 0.5 else \
                f"Did {a['subj']} and {b['subj']} have the same occupation?"
        else:
            q = rng.choice([f"Were {a['subj']} and {b['subj']} born in the same place?",
                            f"Were {a['subj']} and {b['subj']} both born in {a['obj']}?"])
        pa, pb = _subject_page(a), _subject_page(b)
        out.append(SpanExample(q, pa["title"], f"{pa['text']}\n{pb['title']}\n{pb['text']}", yes_no=truth,
                               source="popqa-pair-yesno"))
    return out


def read_question_file(path: str | Path) -> list[dict]:
    """Rows of a ``routerag make-questions`` file (JSONL), with a located error for a bad line. A hand-written file
    may name its gold passages by title (``"supporting": ["Title", ...]``); those are looked up in the
    ``corpus.jsonl`` beside it (:func:`resolve_supporting_titles`)."""
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
    if any(isinstance(p, str) for r in rows for p in r.get("supporting", [])):
        rows = resolve_supporting_titles(rows, Path(path))
    return rows


def resolve_supporting_titles(rows: Sequence[dict], path: Path) -> list[dict]:
    """Hand-written questions name their gold passages by title; the passages come from the ``corpus.jsonl`` in
    the question file's folder (the layout of ``training/handwritten/<set>/``), so a title that is not there fails
    here, with its line, instead of training on a question without its passage."""
    from graph_index.corpus import load_corpus

    corpus = path.parent / "corpus.jsonl"
    if not corpus.is_file():
        raise FileNotFoundError(f"{path}: its questions name passages by title, but {corpus} is missing")
    passages, _ = load_corpus([corpus])  # the reading build-graph does: the same texts, located errors
    pages = {p.title: {"title": p.title, "text": p.text} for p in passages}
    out = []
    for n, r in enumerate(rows, 1):
        missing = [t for t in r.get("supporting", []) if isinstance(t, str) and t not in pages]
        if missing:
            raise ValueError(f"{path}: question {r.get('id', n)} names {missing[0]!r}, which {corpus} lacks")
        out.append({**r, "supporting": [pages[t] if isinstance(t, str) else t for t in r.get("supporting", [])]})
    return out


YES_NO_ANSWERS = frozenset({"yes", "no"})


def is_yes_no_row(row: dict) -> bool:
    """A hand-written comparison answered "yes" or "no": trained on the yes/no head, not as a span."""
    answers = {str(a).strip().lower() for a in row.get("answers", []) if a}
    return len(answers) == 1 and answers <= YES_NO_ANSWERS


def pages_text(pages: Sequence[dict]) -> str:
    """Several gold passages as one example's text after the first one's title: what a yes/no comparison needs to
    see both values at once."""
    return "\n".join([pages[0]["text"]] + [f"{p['title']}\n{p['text']}" for p in pages[1:]])


def yes_no_rows_examples(rows: Sequence[dict], source: str) -> list[SpanExample]:
    """Questions answered yes or no, on all their gold passages in one context (a comparison needs both)."""
    out = []
    for r in rows:
        pages = r.get("supporting", [])
        if not is_yes_no_row(r) or not pages:
            continue
        yes = str(r["answers"][0]).strip().lower() == "yes"
        out.append(SpanExample(r["question"], pages[0]["title"], pages_text(pages), yes_no=yes,
                               source=f"{source}-yesno"))
    return out


def corpus_question_examples(rows: Sequence[dict], source: str) -> list[SpanExample]:
    """Each question on each gold passage (labelled by where the answer is) and on one other question's passage."""
    rng = random.Random(SPLIT_SEED + 4)
    passages = [p for r in rows for p in r.get("supporting", [])]
    out = yes_no_rows_examples(rows, source)
    for r in rows:
        if is_yes_no_row(r):
            continue
        answers = [a for a in r.get("answers", []) if a]
        for p in r.get("supporting", []):
            out.append(labelled(r["question"], p["title"], p["text"], answers, f"{source}-{r.get('type', '')}"))
        if passages and rng.random() < 0.5:  # half the questions: negatives already outnumber answers
            p = rng.choice(passages)
            if p not in r.get("supporting", []):
                ex = labelled(r["question"], p["title"], p["text"], answers, f"{source}-other")
                if ex.answer is None:
                    out.append(ex)
    return out


def comparison_yes_no(rows: Sequence[dict], source: str) -> list[SpanExample]:
    """Corpus-derived comparison questions ("Which was founded earlier, X or Y?") asked as yes/no ("Was X founded
    before Y?"), on both gold passages in one context; the order alternates so half are "yes"."""
    from .questions import _passive, split_relation

    rng = random.Random(SPLIT_SEED + 5)
    out = []
    for n, r in enumerate(x for x in rows if x.get("type") == "comparison" and len(x.get("values", {})) == 2):
        (a, ya), (b, yb) = list(r["values"].items())
        if int(ya) == int(yb) or len(r.get("supporting", [])) < 2:
            continue
        if (int(ya) < int(yb)) != (n % 2 == 0):
            a, b = b, a  # n even: "yes"
        verb, _ = split_relation(r.get("relation", ""))
        q = rng.choice([f"Was {a} {verb} before {b}?", f"Was {a} {verb} earlier than {b}?"] if _passive(verb) else
                       [f"Did {a} {verb} before {b}?", f"Did {a} {verb} earlier than {b}?"])
        pages = r["supporting"][:2]
        out.append(SpanExample(q, pages[0]["title"], pages_text(pages), yes_no=n % 2 == 0, source=f"{source}-yesno"))
    return out


def retrieved_documents(index: str | Path, questions: Sequence[str], k: int = DEFAULT_K,
                        modes: Sequence[str] = ("graph", "passage")) -> dict[str, list[tuple[str, str]]]:
    """Each question's documents from one search of the question itself in each of ``modes``."""
    from routerag.retrieval import Retriever

    retriever = Retriever(index)
    out: dict[str, list[tuple[str, str]]] = {q: [] for q in questions}
    for mode in modes:
        for start in range(0, len(questions), 64):
            batch = list(questions[start:start + 64])
            for q, res in zip(batch, retriever.search(batch, mode=mode, k=k)):
                out[q] += [(d.title, d.text) for d in res.docs]
    return out


def retrieved_distractors(rows: Sequence[dict], retrieved: dict[str, list[tuple[str, str]]], source: str,
                          per_question: int = 1) -> list[SpanExample]:
    """Corpus-derived questions on the first ``per_question`` documents their own search ranks that are not gold
    passages and do not hold an answer (any retrieved document of an unanswerable question), each a negative.

    Why: the reader scores a span inside its own window, and at serving time its windows are the top documents of a
    search, not gold passages; a distractor it never saw as "no answer here" can outbid the answer's page (what the
    retrieval-order prior of docs/research/2026-12-01-later-documents-weigh-less.md corrects by hand). A retrieved
    page that names the answer without being gold is left out: for a derived question it is as likely a coincidence
    ("1998") as a second source. One per question (the highest ranked) by default: with every distractor they were
    42% of the MuSiQue recipe's examples and outnumbered the answers three to one."""
    out = []
    for r in (x for x in rows if not is_yes_no_row(x)):
        gold = {(p["title"], p["text"]) for p in r.get("supporting", [])}
        answers = [a for a in r.get("answers", []) if a]
        kept = 0
        for title, text in dict.fromkeys(retrieved.get(r["question"], [])):
            if kept == per_question:
                break
            if (title, text) in gold:
                continue
            ex = labelled(r["question"], title, text, answers, f"{source}-retrieved")
            if ex.answer is None:
                out.append(ex)
                kept += 1
    return out


def question_source(path: str | Path) -> str:
    """The name a question file's examples are counted under in the card's ``trained.data``: its stem, or its
    folder's name for a set's ``questions.jsonl`` (``training/handwritten/<set>/``), so sets stay apart."""
    path = Path(path)
    return path.parent.name if path.stem == "questions" else path.stem


def build_examples(popqa: Path | None, hotpot: Path | None, index: Path | None = None,
                   questions: Sequence[Path] = (), questions_index: Sequence[Path] = ()) -> list[SpanExample]:
    """Every training example from the training halves of the given sets and the given question files (which must
    come from training corpora: the caller keeps held-out corpora out); ``questions_index``, when given, holds each
    question file's index, in the same order, for its retrieved distractors."""
    if questions_index and len(questions_index) != len(questions):
        raise ValueError(f"{len(questions_index)} question indexes for {len(questions)} question files: give one "
                         "index per --questions file, in the same order")
    examples: list[SpanExample] = []
    if popqa is not None:
        train, _ = popqa_split(popqa)
        retrieved = retrieved_documents(index, [r["question"] for r in train]) if index is not None else None
        examples += popqa_examples(train, retrieved) + popqa_negatives(train) + popqa_yes_no(train)
        examples += popqa_paraphrases(train) + popqa_pair_yes_no(train)
    for n, path in enumerate(questions):
        rows, source = read_question_file(path), question_source(path)
        examples += corpus_question_examples(rows, source) + comparison_yes_no(rows, source)
        if questions_index:
            found = retrieved_documents(questions_index[n], [r["question"] for r in rows], modes=("graph",))
            examples += retrieved_distractors(rows, found, source)
    if hotpot is not None:
        train, _ = hotpot_split(hotpot)
        examples += hotpot_examples(train)
    return examples


def data_summary(examples: Sequence[SpanExample]) -> dict[str, Any]:
    """Counts by source and label, for the reader's card."""
    summary: dict[str, Any] = {}
    for ex in examples:
        label = "yes/no" if ex.yes_no is not None else ("span" if ex.answer else "none")
        key = f"{ex.source}:{label}"
        summary[key] = summary.get(key, 0) + 1
    return dict(sorted(summary.items()))
