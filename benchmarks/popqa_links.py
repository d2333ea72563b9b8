"""Which PopQA links does the graph still miss?

    python benchmarks/popqa_links.py INDEX_DIR popqa_dev.json [--out links.json]

A PopQA question has two gold pages: the subject's page (found by dense retrieval) and the answer's generic page
("Politician", "Dumfries"). Graph retrieval can only reach the second by following a link from the first. For each
question this sorts the answer page into:

* ``not_named``: the subject page never names the answer page's title (no link to follow);
* ``named_not_linked``: the text names it, but the graph has no subject-page → title-entity edge (extraction or
  normalisation missed it);
* ``linked_not_top5``: the edge exists, but graph mode still ranks the page below 5;
* ``found``: in graph mode's top 5.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_index.graph import ENTITY_PREFIX, PASSAGE_PREFIX  # noqa: E402
from graph_index.normalize import normalize_phrase  # noqa: E402
from routerag.config import RetrievalConfig  # noqa: E402
from routerag.datasets import load_questions  # noqa: E402
from routerag.retrieval import Retriever  # noqa: E402
from routerag.runtime import configure_threads  # noqa: E402


def title_forms(title: str) -> set[str]:
    """The title and its bare name ("Henry Feilden (politician)" → "henry feilden"; "Paris, Texas" → "paris")."""
    forms = {normalize_phrase(title)}
    bare = re.sub(r"\s*\(.*?\)\s*$", "", title)
    forms.add(normalize_phrase(bare))
    forms.add(normalize_phrase(bare.split(",")[0]))
    return {f for f in forms if f}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("questions")
    ap.add_argument("--out")
    args = ap.parse_args()
    configure_threads()
    items = load_questions(args.questions)
    r = Retriever(args.index, RetrievalConfig())
    g = r.data.graph
    vertex = {n: i for i, n in enumerate(g.vs["name"])}
    by_hash = {p.hash: i for i, p in enumerate(r.passages)}
    results = r.search([it.question for it in items], mode="graph", k=5)
    cats: collections.Counter = collections.Counter()
    by_prop: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[str, list] = collections.defaultdict(list)
    for it, res in zip(items, results):
        gold = [by_hash.get(gp.hash) for gp in it.supporting]
        if len(gold) != 2 or None in gold:
            cats["unmatched"] += 1
            continue
        subj, obj = gold  # PopQA lists the subject's page first
        obj_p = r.passages[obj]
        subj_p = r.passages[subj]
        top5 = {d.id for d in res.docs}
        text = " " + normalize_phrase(subj_p.text) + " "
        named = any(f" {f} " in text for f in title_forms(obj_p.title))
        title_v = vertex.get(ENTITY_PREFIX + normalize_phrase(obj_p.title))
        linked = title_v is not None and g.are_adjacent(vertex[PASSAGE_PREFIX + subj_p.id], title_v)
        if obj_p.id in top5:
            cat = "found"
        elif linked:
            cat = "linked_not_top5"
        elif named:
            cat = "named_not_linked"
        else:
            cat = "not_named"
        cats[cat] += 1
        by_prop[it.meta.get("prop", "?")][cat] += 1
        if len(examples[cat]) < 8 and cat != "found":
            examples[cat].append({"question": it.question, "subject": subj_p.title, "answer_page": obj_p.title,
                                  "subject_text": subj_p.text[:200],
                                  "subject_entities": r.data.openie[subj].entities[:12]})
    n = sum(cats.values())
    report = {"questions": n, "categories": {k: {"n": v, "share": round(v / n, 3)} for k, v in cats.most_common()},
              "by_property": {p: dict(c) for p, c in by_prop.items()}, "examples": examples}
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    for cat, ex in examples.items():
        print(f"\n== {cat}")
        for e in ex[:4]:
            print(f"  {e['question']}  subject={e['subject']!r} answer page={e['answer_page']!r}")
            print(f"    text: {e['subject_text']}")
            print(f"    entities: {e['subject_entities']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
