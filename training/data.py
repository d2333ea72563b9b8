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

from routerag.datasets import DatasetError, GoldPassage, QAItem, load_questions
from routerag.policy.prompt import DEFAULT_INSTRUCTION, user_message

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
    tmp = parquet.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(to_verl_rows(items, data_source=source, split=split, template=template)), tmp)
    tmp.replace(parquet)
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in to_local_rows(items):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(jsonl)
    return {"questions": len(items), "parquet": str(parquet), "jsonl": str(jsonl),
            "with_supporting": sum(bool(it.supporting) for it in items)}
