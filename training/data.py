"""``routerag prepare-data``: question sets → verl's RL parquet and the local trainer's JSONL.

Inputs: any format :func:`routerag.datasets.load_questions` reads (HippoRAG / RouteRAG JSON, JSONL), and verl RL
parquet such as RouteRAG's HotpotQA training set (``prompt`` = chat messages ending in ``Question: …``,
``reward_model.ground_truth.target`` = answers, ``extra_info.supporting_facts`` = [[title, sentence], …]).

Outputs: a parquet in verl's format whose prompt is *our* policy template (so a verl run trains exactly the policy
the server runs), and a JSONL of ``{id, question, answers, supporting}`` for the local engine and ``routerag eval``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graph_index.atomic import atomic_path
from routerag.datasets import DatasetError, GoldPassage, QAItem, load_questions
from routerag.prompts import DEFAULT_INSTRUCTION, user_message

_QUESTION = re.compile(r"Question:\s*(.+?)\s*$", re.DOTALL)


def load_training_items(path: str | Path, *, limit: int | None = None) -> list[QAItem]:
    """QA items from a parquet (verl RL format) or any question file ``load_questions`` reads."""
    path = Path(path)
    if path.suffix.lower() != ".parquet":
        return load_questions(path, limit=limit)
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    items = []
    for n, row in enumerate(rows[:limit] if limit else rows):
        items.append(parquet_row_to_item(row, f"{path.stem}-{n}"))
    if not items:
        raise DatasetError(f"{path}: no rows")
    return items


def parquet_row_to_item(row: dict[str, Any], default_id: str) -> QAItem:
    prompt = row.get("prompt") or []
    text = prompt[-1]["content"] if prompt and isinstance(prompt[-1], dict) else str(prompt)
    extra = row.get("extra_info") or {}
    question = extra.get("question")
    if not question:
        m = _QUESTION.search(text)
        if not m:
            raise DatasetError(f"{default_id}: cannot find 'Question:' in the prompt")
        question = m.group(1)
    gt = (row.get("reward_model") or {}).get("ground_truth") or {}
    answers = gt.get("target") if isinstance(gt, dict) else gt
    if isinstance(answers, str):
        answers = [answers]
    support = extra.get("supporting_facts")
    titles: list[str] = []
    if isinstance(support, str) and support.strip():
        try:
            support = json.loads(support)
        except json.JSONDecodeError:
            support = []
    if isinstance(support, list):
        titles = list(dict.fromkeys(str(s[0]) if isinstance(s, list) else str(s) for s in support if s))
    return QAItem(id=str(extra.get("original_id") or extra.get("index") or default_id), question=question.strip(),
                  answers=[str(a) for a in answers or []], supporting=[GoldPassage(t) for t in titles],
                  meta={"data_source": row.get("data_source", "")})


def to_verl_rows(items: Sequence[QAItem], *, data_source: str, split: str,
                 template: str = DEFAULT_INSTRUCTION) -> list[dict[str, Any]]:
    return [{
        "data_source": data_source,
        "prompt": [{"role": "user", "content": user_message(template, it.question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(it.answers)}},
        "extra_info": {"index": i, "id": it.id, "split": split, "question": it.question,
                       "supporting_titles": json.dumps([g.title for g in it.supporting])},
    } for i, it in enumerate(items)]


def to_local_rows(items: Sequence[QAItem]) -> list[dict[str, Any]]:
    return [{"id": it.id, "question": it.question, "answers": list(it.answers),
             "supporting": [{"title": g.title, **({"text": g.text} if g.text is not None else {})}
                            for g in it.supporting]} for it in items]


def solved_ids(records: str | Path) -> set[str]:
    """Ids of the questions answered right (EM or GenAcc > 0) in a ``routerag eval`` per-question JSONL.

    A small policy is wrong on most questions, and a GRPO group whose rollouts are all wrong has zero advantages
    (DAPO's reason for dynamic sampling); training on the questions a policy can already solve sometimes is where
    RouteRAG's stage-2 efficiency term, which only pays when EM = 1, has anything to compare."""
    from routerag.evaluation.records import read_records

    ids: set[str] = set()
    for rec in read_records(records):
        try:
            right = float(rec.get("em", 0) or 0) > 0 or float(rec.get("gen_acc", 0) or 0) > 0
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"{records}: record {rec['id']}: unreadable em or gen_acc ({exc})") from exc
        if right:
            ids.add(str(rec["id"]))
    return ids


NAIVE_RECORDS = {"passage": "naive-passage.jsonl", "graph": "naive-graph.jsonl", "hybrid": "naive-hybrid.jsonl"}
"""The per-question records of ``routerag eval --modes naive-passage,naive-graph,naive-hybrid``."""


def routing_labels(records_dir: str | Path) -> dict[str, str]:
    """For each question of an evaluation of the naive one-search strategies, the mode whose documents served the
    reader best: highest EM, then GenAcc, then answer recall (the answer among the documents). Where several modes
    tie at the top, the one that served the reader best over all the questions wins: a per-question tie is noise the
    policy cannot predict from the question. Questions where no mode found anything get no label (the warm start
    then draws a mode, which keeps some variety for reinforcement learning to explore)."""
    folder = Path(records_dir)
    from routerag.evaluation.records import read_records

    present = {m: folder / f for m, f in NAIVE_RECORDS.items() if (folder / f).is_file()}
    if len(present) < 2:
        raise DatasetError(f"{folder}: routing labels need the records of at least two of "
                           f"{', '.join(NAIVE_RECORDS.values())} (routerag eval --modes "
                           "naive-passage,naive-graph,naive-hybrid)")
    scores: dict[str, dict[str, tuple[float, float, float]]] = {}
    for mode, path in present.items():
        for rec in read_records(path, required=("id", "em", "gen_acc")):
            scores.setdefault(str(rec["id"]), {})[mode] = (float(rec["em"]), float(rec["gen_acc"]),
                                                          float(rec.get("answer_recall") or 0.0))
    overall = {m: tuple(sum(v[m][i] for v in scores.values() if m in v) for i in range(3)) for m in present}
    labels = {}
    for qid, by_mode in scores.items():
        best = max(by_mode.values())
        if best == (0.0, 0.0, 0.0):
            continue
        labels[qid] = max((m for m, v in by_mode.items() if v == best), key=lambda m: overall[m])
    return labels


def prepare(inputs: Sequence[str | Path], out_dir: str | Path, *, split: str = "train", data_source: str | None = None,
            limit: int | None = None, template: str = DEFAULT_INSTRUCTION,
            keep_ids: set[str] | None = None) -> dict[str, Any]:
    """Write ``OUT/<split>.parquet`` (verl) and ``OUT/<split>.jsonl`` (local); return counts and paths.
    ``keep_ids``: only these questions (see :func:`solved_ids`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    items: list[QAItem] = []
    for p in inputs:
        items.extend(load_training_items(p, limit=limit))
    if keep_ids is not None:
        items = [it for it in items if it.id in keep_ids]
        if not items:
            raise DatasetError("no question of the inputs is among the solved ones")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = data_source or Path(inputs[0]).stem
    parquet = out / f"{split}.parquet"
    jsonl = out / f"{split}.jsonl"
    with atomic_path(parquet) as tmp:
        pq.write_table(pa.Table.from_pylist(to_verl_rows(items, data_source=source, split=split, template=template)),
                       tmp)
    with atomic_path(jsonl) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in to_local_rows(items):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {"questions": len(items), "parquet": str(parquet), "jsonl": str(jsonl),
            "with_supporting": sum(bool(it.supporting) for it in items)}
