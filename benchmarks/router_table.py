"""The issue-36 results table (docs/results.md): one row per strategy and question set, from `routerag eval` records
(REPORTS/<set>-grounded and REPORTS/<set>-free, the second the router with ROUTERAG_POLICY__QUERY=free; optionally
REPORTS/<set>-new, another adapter's `learned` run, e.g. a new warm start), with how many of the router's queries
were grounded (the question, a span of it, or a title, entity or noun chunk of the documents the run retrieved: an
upper bound for free queries, whose check sees every document of the run) and how many were the question itself;
then, per router row, its routing by question type (first search's mode, searches per question).

    python benchmarks/router_table.py REPORTS [SETS.json]

SETS.json (default: the sets of the first results below) is a list of [name, grounded dir, free dir, index] (dirs
relative to REPORTS; the new adapter's dir is the grounded one with "-grounded" replaced by "-new").
"""
import json, sys
from collections import Counter, defaultdict
from pathlib import Path
from graph_index.store import IndexData
from routerag.policy.grounding import is_grounded
from routerag.retrieval.types import RetrievedDoc


def grounded_share(path, index):
    with IndexData(index) as d:
        by_id = {p.id: p for p in d.passages}
        n = g = asq = 0
        for line in open(path):
            r = json.loads(line)
            docs = [RetrievedDoc(i, by_id[i].title, by_id[i].text, 0) for i in r["doc_ids"] if i in by_id]
            for q in r["queries"]:
                n += 1; asq += q.strip() == r["question"].strip(); g += is_grounded(q, r["question"], docs)
        return n, g, asq

def summaries(folder):
    """Each strategy's summary from its records (a run still going counts the questions it finished)."""
    from routerag.evaluation import summarize
    from routerag.evaluation.records import read_records

    return {p.stem: summarize(read_records(p)) for p in sorted(Path(folder).glob("*.jsonl"))} if folder.is_dir() else {}


def routing(path):
    """Per question type: n, first-search modes, mean searches, refusals."""
    by = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        by[r.get("type") or "—"].append(r)
    out = []
    for kind, recs in sorted(by.items()):
        first = Counter(r["modes"][0] if r["modes"] else "none" for r in recs)
        out.append(f"{kind} ({len(recs)}): first search " + ", ".join(f"{m} {c}" for m, c in first.most_common())
                   + f"; {sum(r['searches'] for r in recs) / len(recs):.2f} searches; "
                   + f"{sum(bool(r['refused']) for r in recs)} refused")
    return out


def pct(x): return "—" if x is None else f"{100*x:.1f}"
def num(x, d=2): return "—" if x is None else f"{x:.{d}f}"

def table(setname, grounded_dir, free_dir, new_dir, index):
    g, f, n = summaries(grounded_dir), summaries(free_dir), summaries(new_dir)
    order = [("router, grounded queries", g.get("learned"), grounded_dir / "learned.jsonl"),
             ("router, free queries", f.get("learned"), free_dir / "learned.jsonl"),
             ("new router (outcome warm start), grounded", n.get("learned"), new_dir / "learned.jsonl"),
             ("one passage search", g.get("naive-passage"), None), ("one graph search", g.get("naive-graph"), None),
             ("one hybrid search", g.get("naive-hybrid"), None), ("two searches (question, then new entity)", g.get("two-search"), None),
             ("no retrieval", g.get("no-retrieval"), None)]
    out = [f"| {setname} | n | EM | F1 | answer recall | searches | retrieval ms/q | refusal % | refusal P | refusal R | refused with answer % | queries: grounded / question / all |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    routes = []
    for name, s, path in order:
        if s is None: continue
        q = "—"
        if path is not None and path.exists():
            n_, gr, asq = grounded_share(path, index); q = f"{gr} / {asq} / {n_}"
            routes += [f"- {name}: {line}" for line in routing(path)]
        out.append(f"| {name} | {s['questions']} | {pct(s['em'])} | {pct(s['f1'])} | {pct(s['answer_recall'])} | {num(s['searches'])} | {num(s['retrieval_ms'],1)} | {pct(s['refusal_rate'])} | {num(s.get('refusal_precision'))} | {num(s.get('refusal_recall'))} | {pct(s.get('refused_with_answer'))} | {q} |")
    return "\n".join(out + ([""] + routes if routes else []))

R = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("reports")
SETS = [("sample questions", "sample-grounded/questions", "sample-free/questions", "indexes/sample"),
        ("corpus-derived (sample corpus)", "derived-grounded/derived_sample", "derived-free/derived_sample",
         "indexes/sample"),
        ("PopQA held-out (first 10)", "popqa-grounded/popqa_heldout10", "popqa-free/popqa_heldout10",
         "indexes/popqa-small"),
        ("HotpotQA held-out half (first 10)", "hotpot-grounded/hotpot_heldout10", "hotpot-free/hotpot_heldout10",
         "indexes/hotpot-small")]
if len(sys.argv) > 2:
    SETS = [tuple(s) for s in json.loads(Path(sys.argv[2]).read_text())]
for name, g, f, index in SETS:
    if (R / g).is_dir():
        print(table(name, R / g, R / f, R / g.replace("-grounded", "-new"), index))
        print()
