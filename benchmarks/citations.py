"""How good are ``/ask``'s citations? Recomputes them for finished evaluation records and scores them against the
questions' gold supporting passages.

    python benchmarks/citations.py INDEX_DIR RECORDS.jsonl QUESTIONS [--out results.json]

For each record (answer and retrieved passage ids, as ``routerag eval`` writes them), the citations are what the
server would return (:func:`routerag.policy.citations.cite` over the retrieved passages, from the index). Reported:
among right answers (GenAcc 1), the share with at least one citation (coverage) and the share of their citations
that are gold supporting passages (precision); among wrong answers, the share that still get a citation (the wrong
answer is stated in some retrieved passage); citations per answer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_index.corpus import content_hash  # noqa: E402
from graph_index.store import IndexData  # noqa: E402
from routerag.datasets import load_questions  # noqa: E402
from routerag.evaluation.records import read_records, record_documents  # noqa: E402
from routerag.policy.citations import cite  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index")
    ap.add_argument("records")
    ap.add_argument("questions")
    ap.add_argument("--out")
    args = ap.parse_args()
    passages = {p.id: p for p in IndexData(args.index).passages}
    items = {it.id: it for it in load_questions(args.questions)}
    right_cited, right_precision, wrong_cited, per_answer = [], [], [], []
    for rec in read_records(args.records, required=("id", "prediction", "gen_acc", "doc_ids")):
        item = items[rec["id"]]
        docs = record_documents(rec, passages)
        cited = cite(rec["prediction"], docs)
        per_answer.append(len(cited))
        if rec["gen_acc"] == 1.0:
            right_cited.append(float(bool(cited)))
            if item.supporting:
                right_precision += [float(item.support_recall([(c.title, content_hash(c.title, passages[c.id].text))],
                                                              1) > 0) for c in cited]
        else:
            wrong_cited.append(float(bool(cited)))
    mean = lambda xs: round(100 * statistics.mean(xs), 1) if xs else None  # noqa: E731
    out = {"records": args.records, "answers": len(per_answer), "right": len(right_cited),
           "right_with_citation_pct": mean(right_cited), "citation_precision_pct": mean(right_precision),
           "wrong": len(wrong_cited), "wrong_with_citation_pct": mean(wrong_cited),
           "citations_per_answer": round(statistics.mean(per_answer), 2) if per_answer else None}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
