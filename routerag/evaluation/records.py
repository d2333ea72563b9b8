"""Scoring one question (a JSON-able record) and summarising a run, plus the resumable results file.

Definitions (also written into every report):

* EM / F1 / GenAcc: :mod:`routerag.metrics` against the best gold alias (SQuAD normalisation; GenAcc = a gold alias
  is a whole-token span of the prediction).
* recall@k: share of the question's gold supporting passages among the first k *distinct* documents the run
  retrieved, over all its searches in retrieval order (passages matched by content hash, title-only gold by title);
  ``recall_all`` counts every distinct document retrieved. Undefined (None) for questions without gold passages and
  for ``no-retrieval``; 0 for a retrieving strategy that did not search.
* %Tradeoff (FrugalRAG): ``100 · (EM + F1 + GenAcc) / (3 · S)`` with EM, F1, GenAcc the run's mean scores in [0, 1]
  and S its mean searches per question; 0 when S = 0.
* Refusals: a question the policy refused (``<answer> [refuse] </answer>``) scores 0 on EM, F1 and GenAcc, so those
  stay comparable with runs that cannot refuse; ``refusal_rate`` is the share refused, and ``em_answered``,
  ``f1_answered``, ``gen_acc_answered`` the means over the questions not refused (None when every one was).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from graph_index.corpus import content_hash
from ..datasets import DatasetError, QAItem
from ..metrics import answer_in_documents, exact_match, f1, gen_acc
from ..retrieval.types import RetrievedDoc
from ..vocabulary import MODES
from ..policy.types import Summary
from .strategies import NO_RETRIEVAL

log = logging.getLogger(__name__)

RECALL_KS: tuple[int, ...] = (2, 5, 10)
RECALL_KEYS: tuple[str, ...] = (*(f"recall@{k}" for k in RECALL_KS), "recall_all")

DEFINITIONS = {
    "em": "exact match after SQuAD normalisation (lower case, no punctuation or articles), best gold alias",
    "f1": "token F1 after SQuAD normalisation, best gold alias",
    "gen_acc": "s3 GenAcc: 1 when a normalised gold alias is a whole-token span of the normalised prediction",
    "answer_recall": "1 when a normalised gold answer alias is a whole-token span of a retrieved document (the "
                     "answer was put in front of the reader); undefined for no-retrieval",
    "recall@k": "share of gold supporting passages among the first k distinct documents retrieved over all the "
                "run's searches, in retrieval order; recall_all: among every distinct document retrieved; "
                "undefined without gold passages and for no-retrieval",
    "tradeoff": "FrugalRAG %Tradeoff = 100 * (EM + F1 + GenAcc) / (3 * S), EM/F1/GenAcc the run's mean scores in "
                "[0, 1], S its mean searches per question; 0 when S = 0",
    "mode_mix": "share of the run's searches made in each retrieval mode",
    "format_ok": "share of policy trajectories that answered (or refused) in format on their own (no invalid turn, "
                 "no forced answer); undefined for naive-rag and no-retrieval",
    "finish": "how each trajectory ended (the endings column): answer or refused (on its own), forced_answer (past "
              "the search budget or the invalid turns allowed, the answer was forced; with the extractive reader also "
              "a trajectory cut off without an answer, which the reader answered), no_answer (cut off by the "
              "response's token budget, or a forced turn that gave no answer, and no extractive reader), error",
    "refusal_rate": "share of questions the policy refused on its own (<answer> [refuse] </answer>: the documents do "
                    "not answer it); a refusal scores 0 on EM, F1 and GenAcc",
    "answered": "em_answered, f1_answered, gen_acc_answered: EM, F1 and GenAcc over the questions not refused; "
                "undefined when every question was refused",
    "refusal_precision": "share of the refusals that were on unanswerable questions (answers: []); undefined when "
                         "the set has no unanswerable question or nothing was refused",
    "refusal_recall": "share of the unanswerable questions refused; undefined when the set has none",
    "refused_with_answer": "share of the answerable questions refused although a retrieved document held the "
                           "answer (the policy refused against its own evidence)",
    "unanswerable": "a question with no answer (answers: []) scores 1 on EM, F1 and GenAcc when refused, else 0; "
                    "its answer recall is undefined",
    "retrieval_ms": "retrieval time per question (sum over its searches); retrieval_ms_per_search: total retrieval "
                    "time / total searches",
}


def distinct_docs(docs: Iterable[RetrievedDoc]) -> list[tuple[RetrievedDoc, str]]:
    """Documents in first-retrieved order without repeats, each with its content hash (the key gold passages are
    matched on, so ids from a remote search server need not agree with ours)."""
    seen: set[str] = set()
    out = []
    for d in docs:
        h = content_hash(d.title, d.text)
        if h not in seen:
            seen.add(h)
            out.append((d, h))
    return out


def score(item: QAItem, strategy: str, outcome: Summary, wall_ms: float, *, error: str | None = None) -> dict[str, Any]:
    """The per-question record written to ``<strategy>.jsonl``."""
    docs = distinct_docs(outcome.documents)
    keys = [(d.title, h) for d, h in docs]
    retrieves = strategy != NO_RETRIEVAL  # recall of a strategy that never retrieves is undefined, not 0
    if item.answerable:
        scored = None if outcome.refused else outcome.answer  # a refusal's sentence is no answer: it scores 0
        em, f, ga = (exact_match(scored, item.answers), f1(scored, item.answers), gen_acc(scored, item.answers))
        held = answer_in_documents([f"{d.title} {d.text}" for d, _ in docs], item.answers) if retrieves else None
    else:  # the right response to an unanswerable question is a refusal (SQuAD 2.0's no-answer scoring)
        em = f = ga = float(outcome.refused)
        held = None
    recall: dict[str, float | None] = {}
    for k in RECALL_KS:
        recall[f"recall@{k}"] = item.support_recall(keys, k) if retrieves else None
    recall["recall_all"] = item.support_recall(keys, len(keys)) if retrieves else None
    rec: dict[str, Any] = {
        "id": item.id,
        "strategy": strategy,
        "question": item.question,
        "type": question_type(item),
        "answers": item.answers,
        "answerable": item.answerable,
        "prediction": outcome.answer,
        "refused": outcome.refused,
        "em": em,
        "f1": f,
        "gen_acc": ga,
        "answer_recall": held,
        **recall,
        "gold_passages": len(item.supporting),
        "retrieved": len(docs),
        "searches": len(outcome.searches),
        "modes": [s.mode for s in outcome.searches],
        "queries": [s.query for s in outcome.searches],
        "query_sources": [t.get("query_source") for t in outcome.trace if t.get("action") == "search"],
        "queries_replaced": sum(1 for t in outcome.trace if t.get("action") == "search" and t.get("query_generated")),
        "retrieval_ms": outcome.retrieval_ms,
        "search_ms": [round(s.retrieval_ms, 3) for s in outcome.searches],
        "generation_ms": round(outcome.generation_ms, 3),
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "finish": "error" if error else outcome.finish,
        "format_ok": outcome.format_ok,
        "wall_ms": round(wall_ms, 3),
        "doc_ids": [d.id for d, _ in docs],
    }
    if error:
        rec["error"] = error
    return rec


def question_type(item: QAItem) -> str | None:
    """The question's kind where the data set says it (PopQA's relation, HotpotQA's bridge/comparison), for the
    per-type breakdown of routing."""
    kind = item.meta.get("prop") or item.meta.get("type")
    return str(kind) if kind else None


def _mean(values: Sequence[float | int | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def tradeoff(em: float, f1_: float, gen_acc_: float, searches: float) -> float:
    """FrugalRAG's %Tradeoff from a run's means: accuracy (the mean of EM, F1, GenAcc) per search, in percent."""
    if searches <= 0:
        return 0.0
    return 100.0 * (em + f1_ + gen_acc_) / (3.0 * searches)


def summarize(records: Sequence[dict[str, Any]], *, _by_type: bool = False) -> dict[str, Any]:
    """One row of the report: the means of a strategy's records (see the module docstring for definitions), and,
    when the questions are of several types, the same per type (``by_type``: how routing differs by question)."""
    n = len(records)
    col = lambda key: [r.get(key) for r in records]  # noqa: E731
    mean = lambda key: _mean(col(key)) if n else None  # noqa: E731
    em, f, ga, s = (mean(k) or 0.0 for k in ("em", "f1", "gen_acc", "searches"))
    answered = [r for r in records if not r.get("refused")]  # records written before refusals existed: answered
    modes = Counter(m for r in records for m in r.get("modes", []))
    total_searches = sum(modes.values())
    total_ms = sum(r.get("retrieval_ms", 0.0) for r in records)
    out: dict[str, Any] = {
        "questions": n,
        "em": em, "f1": f, "gen_acc": ga,
        "refusal_rate": (n - len(answered)) / n if n else None,
        **refusal_scores(records),
        **{f"{k}_answered": _mean([r.get(k) for r in answered]) for k in ("em", "f1", "gen_acc")},
        **{k: mean(k) for k in RECALL_KEYS},
        "answer_recall": mean("answer_recall"),
        "searches": s,
        "retrieval_ms": mean("retrieval_ms") or 0.0,
        "retrieval_ms_per_search": total_ms / total_searches if total_searches else None,
        "generation_ms": mean("generation_ms") or 0.0,
        "prompt_tokens": mean("prompt_tokens") or 0.0,
        "completion_tokens": mean("completion_tokens") or 0.0,
        "wall_ms": mean("wall_ms") or 0.0,
        "tradeoff": tradeoff(em, f, ga, s),
        "format_ok": _mean([float(v) for v in col("format_ok") if v is not None]),
        "mode_mix": {m: (modes[m] / total_searches if total_searches else 0.0) for m in MODES},
        "mode_counts": {m: modes[m] for m in MODES},
        "finish": dict(Counter(r.get("finish", "?") for r in records)),
        "errors": sum(1 for r in records if r.get("finish") == "error"),
    }
    types = sorted({r["type"] for r in records if r.get("type")})
    if len(types) > 1 and not _by_type:
        out["by_type"] = {t: summarize([r for r in records if r.get("type") == t], _by_type=True) for t in types}
    return out


def refusal_scores(records: Sequence[dict[str, Any]]) -> dict[str, float | int | None]:
    """Refusal precision and recall against the unanswerable questions, and the refusals against the evidence (see
    :data:`DEFINITIONS`). Records written before unanswerable questions existed count as answerable."""
    refused = [r for r in records if r.get("refused")]
    unanswerable = [r for r in records if r.get("answerable") is False]
    answerable = [r for r in records if r.get("answerable", True)]
    hits = sum(1 for r in refused if r.get("answerable") is False)
    return {
        "unanswerable": len(unanswerable),
        "refusal_precision": hits / len(refused) if refused and unanswerable else None,
        "refusal_recall": hits / len(unanswerable) if unanswerable else None,
        "refused_with_answer": (sum(1 for r in answerable if r.get("refused") and r.get("answer_recall"))
                                / len(answerable) if answerable else None),
    }


def read_records(path: str | Path, required: Sequence[str] = ("id",)) -> list[dict[str, Any]]:
    """A finished ``<strategy>.jsonl`` read as input (to select training questions, to replay searches): every line
    must be a record with the ``required`` fields, else a :class:`DatasetError` names the file and line. (Resuming a
    run reads its own log leniently instead: :meth:`ResultsLog.load`.)"""
    path = Path(path)
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not an evaluation record ({exc})") from exc
            missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise DatasetError(f"{path}:{n}: not an evaluation record (missing {', '.join(missing)})")
            out.append(rec)
    return out


def reread_em(record: dict[str, Any], answer: str | None) -> float:
    """EM of a new answer to a record's question (None: a refusal), as :func:`score` counts it: a refusal scores 0 on
    an answerable question and 1 on an unanswerable one; for tools that read a finished run's documents again."""
    if not record.get("answerable", True):
        return float(answer is None)
    return 0.0 if answer is None else exact_match(answer, record["answers"])


def record_documents(record: dict[str, Any], passages: Mapping[str, Any], *,
                     strict: bool = False) -> list[RetrievedDoc]:
    """The documents a record's trajectory read (its ``doc_ids``, in the order read), rebuilt from ``passages`` (id →
    an object with ``title`` and ``text``, such as ``IndexData.passages``), for tools that re-read or re-score a
    finished run without running its searches again. An id the index lacks is skipped, or with ``strict`` a
    :class:`DatasetError` (a run re-read against another index must not be scored on fewer documents)."""
    missing = [i for i in record["doc_ids"] if i not in passages]
    if missing and strict:
        raise DatasetError(f"record {record.get('id')}: documents {missing[:3]} are not in this index "
                           "(another index's run?)")
    return [RetrievedDoc(i, passages[i].title, passages[i].text, 1.0) for i in record["doc_ids"] if i in passages]


class ResultsLog:
    """``<strategy>.jsonl``: one finished question per line, flushed as it lands, so a killed run loses at most the
    line being written; loading drops that torn line and keeps the last record of each id."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh: TextIO | None = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Records by id (the last one wins, so a retried question replaces its failed attempt)."""
        if not self.path.exists():
            return {}
        self._repair_tail()
        out: dict[str, dict[str, Any]] = {}
        with open(self.path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("%s:%d: skipping an unreadable line", self.path, n)
                    continue
                if isinstance(rec, dict) and "id" in rec:
                    out[str(rec["id"])] = rec
        return out

    def _repair_tail(self) -> None:
        """Cut a last line that has no newline: it is a record whose write was interrupted."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            log.warning("%s: discarding a torn last line (%d bytes)", self.path, len(data) - keep)
            with open(self.path, "r+b") as fh:
                fh.truncate(keep)

    def append(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()

    def reset(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def reader_for_replay(name: str) -> Any:
    """The extractive reader a replay tool names: ``shipped`` (the packaged one) or a folder with a reader card. A
    missing folder or a bad card is a one-line ``SystemExit`` naming it, not a traceback, for every tool alike."""
    from ..policy.extractive import ExtractiveReader

    try:
        return ExtractiveReader(None if name == "shipped" else name)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"--reader: {exc}") from None
