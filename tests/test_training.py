"""Training: GRPO arithmetic against hand-computed numbers, the information mask, warm-start examples, data
preparation, the verl launch plan, and the local engine's smoke preset end to end (with resume)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from routerag.cli import app
from routerag.datasets import GoldPassage, QAItem
from routerag.policy import parse_turn
from routerag.policy.types import Segment, Trajectory
from training.grpo import group_advantages, grpo_loss, low_var_kl, policy_loss, token_logprobs
from training.sequences import collate, trajectory_tokens

from .helpers.scripted import CharTokenizer

# -- GRPO arithmetic -----------------------------------------------------------------------------------------------


def test_group_advantages_by_hand() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5]), ["a", "a", "b", "b", "c"])
    s = math.sqrt(0.5)  # unbiased std of [1, 0]
    assert adv.tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0, 0.5 / (1 + 1e-6)])


def test_low_var_kl_by_hand() -> None:
    kl = low_var_kl(torch.tensor([-1.0, -2.0, -1.0]), torch.tensor([-2.0, -1.0, -1.0]))
    assert kl.tolist() == pytest.approx([math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1, 0.0])


def test_clipped_policy_loss_by_hand() -> None:
    logp, old = torch.tensor([[-1.0, -1.0, -3.0]]), torch.tensor([[-1.2, -0.8, -3.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is information: excluded
    loss, stats = policy_loss(logp, old, adv, mask, clip=0.2)
    # token 1: ratio e^0.2 = 1.2214 > 1.2 with A = 1 → max(−1.2214, −1.2) = −1.2
    # token 2: ratio e^−0.2 = 0.8187 with A = −1 → max(0.8187, 0.8187 clipped? 0.8187 > 0.8 so unclipped) = 0.8187
    assert loss.item() == pytest.approx((-1.2 + math.exp(-0.2)) / 2, abs=1e-6)
    assert stats["clipfrac"] == pytest.approx(0.5)
    ref = torch.tensor([[-1.0, -1.0, -9.0]])
    total, s2 = grpo_loss(logp, old, ref, adv, mask, clip=0.2, kl_coef=0.5)
    assert s2["kl"] == pytest.approx(0.0) and total.item() == pytest.approx(loss.item())


def test_token_logprobs_are_next_token_log_probabilities() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]]))
    ids = torch.tensor([[0, 1, 1]])
    assert token_logprobs(logits, ids)[0].tolist() == pytest.approx([math.log(0.5), math.log(0.1)])


# -- masks ---------------------------------------------------------------------------------------------------------

def traj_of(*segments: tuple[str, str]) -> Trajectory:
    tok = CharTokenizer()
    t = Trajectory(question="q")
    t.segments = [Segment(kind, text, tok.encode(text)) for kind, text in segments]  # type: ignore[arg-type]
    return t


def test_mask_excludes_prompt_and_information_tokens() -> None:
    t = traj_of(("prompt", "PP"), ("policy", "ab"), ("information", "III"), ("policy", "c"))
    seq = trajectory_tokens(t)
    assert seq.mask == [0, 0, 1, 1, 0, 0, 0, 1] and seq.policy_tokens == 3
    batch = collate([seq], [2.0], [0], pad_id=0)
    # position t predicts token t+1: the policy's tokens are predicted at positions 1, 2 and 6
    assert batch.loss_mask[0].tolist() == [0, 1, 1, 0, 0, 0, 1]
    assert batch.advantages[0].tolist() == [0, 2, 2, 0, 0, 0, 2]


def test_masked_information_gets_no_gradient_signal() -> None:
    logits = torch.zeros((1, 8, 128), requires_grad=True)
    seq = trajectory_tokens(traj_of(("prompt", "PP"), ("policy", "ab"), ("information", "III"), ("policy", "c")))
    b = collate([seq], [1.0], [0], pad_id=0)
    lp = token_logprobs(logits, b.input_ids)
    loss, _ = policy_loss(lp, lp.detach(), b.advantages, b.loss_mask)
    loss.backward()
    touched = (logits.grad.abs().sum(-1) > 0)[0].tolist()
    assert touched == [False, True, True, False, False, False, True, False]


# -- warm start and data -------------------------------------------------------------------------------------------

def test_warm_start_examples_are_valid_policy_turns() -> None:
    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    item = QAItem("1", "Where was Joran Veld born?", ["Tarsk"],
                  [GoldPassage("Joran Veld", "Joran Veld is a painter. He was born in tarsk in 1901."),
                   GoldPassage("Tarsk", "A town.")])
    from training.sft import build_example, gold_documents, gold_plan

    docs = gold_documents(item, {})
    seen_two = False
    for seed in range(6):
        rng = random.Random(seed)
        ex = build_example(item, gold_plan(item, docs, rng), tok, rng)
        text = tok.decode(ex.ids)
        policy = "".join(ch for ch, m in zip(text, ex.mask) if m)
        assert "Joran Veld is a painter." in text and "Joran Veld is a painter." not in policy  # information: masked
        assert "A town." in text and "A town." not in policy
        # the last turn names the answer's document and copies the answer verbatim, as written there
        assert "Doc 1" in policy.rsplit("<think>", 1)[1]
        assert policy.endswith("<answer> tarsk </answer>")
        turns = policy.split("</search>")
        assert all(parse_turn(t + "</search>").kind == "search" for t in turns[:-1])
        assert parse_turn(turns[-1]).kind == "answer"
        seen_two |= len(turns) == 3
    assert seen_two  # some examples search twice
    assert build_example(QAItem("2", "q", ["a"], []), [], tok, random.Random(0)) is None


def test_warm_start_names_the_answers_document_and_copies_no_title() -> None:
    """The last turn names the document that holds the answer (its number in the information block) and copies the
    verbatim answer; no policy turn copies a title or quotes a sentence (a small policy looped on that template)."""
    from training.sft import build_example, gold_documents, gold_plan

    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    item = QAItem("1", "Where was Joran Veld born?", ["Tarsk"],
                  [GoldPassage("Ossel waterway", "The Ossel waterway is busy."),
                   GoldPassage("Joran Veld", "Joran Veld (born 1901 in Tarsk) was a painter of ships.")])
    docs = gold_documents(item, {})
    lasts = set()
    for seed in range(8):
        rng = random.Random(seed)
        plan = gold_plan(item, docs, rng)
        ex = build_example(item, plan, tok, rng, max_information_tokens=1000, k=2)
        policy = "".join(ch for ch, m in zip(tok.decode(ex.ids), ex.mask) if m)
        last = policy.rsplit("<think>", 1)[1]
        assert policy.endswith("<answer> Tarsk </answer>") and "Joran Veld (" not in policy and "Ossel" not in last
        n = 1 if len(plan) == 2 else 2  # two searches: Joran Veld's page is the first document of the second block
        assert f"Doc {n}" in last.split("</think>")[0]
        lasts.add(last)
    assert len(lasts) > 1  # the wording varies


def test_routing_warm_start_uses_the_labelled_mode_and_searches_again_where_it_missed() -> None:
    from routerag.prompts import CHECK_THOUGHTS, NEXT_THOUGHTS
    from routerag.retrieval.types import RetrievalResult, RetrievedDoc
    from training.sft import build_example, retrieval_plan

    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    item = QAItem("1", "Where was Joran Veld born?", ["Tarsk"])
    hit = RetrievedDoc("a", "Joran Veld", "Joran Veld was born in Tarsk.", 1.0)
    miss = RetrievedDoc("b", "Other", "Nothing here.", 0.5)
    results = {"passage": RetrievalResult(item.question, "passage", [miss]),
               "graph": RetrievalResult(item.question, "graph", [hit, miss]),
               "hybrid": RetrievalResult(item.question, "hybrid", [miss])}
    plan = retrieval_plan(item, results, random.Random(0), label="graph")
    assert [(p.mode, p.query) for p in plan] == [("graph", item.question)]
    plan = retrieval_plan(item, results, random.Random(0), label="passage")  # missed: a second search that finds it
    assert [p.mode for p in plan] == ["passage", "graph"]
    ex = build_example(item, plan, tok, random.Random(0))
    policy = "".join(ch for ch, m in zip(tok.decode(ex.ids), ex.mask) if m)
    assert "<search>[passage] Where was Joran Veld born?</search>" in policy
    assert "<search>[graph] Where was Joran Veld born?</search>" in policy and policy.endswith("<answer> Tarsk </answer>")
    nowhere = {m: RetrievalResult(item.question, m, [miss]) for m in ("passage", "graph", "hybrid")}
    assert len(retrieval_plan(item, nowhere, random.Random(0), label="hybrid")) == 1  # nothing better to try
    # an over-retrieving warm start: found at once, and searched again anyway, in the cheapest other mode
    extra = retrieval_plan(item, results, random.Random(0), label="graph", extra=True)
    assert [(p.mode, p.query, p.extra) for p in extra] == [("graph", item.question, False),
                                                           ("passage", item.question, True)]
    ex = build_example(item, extra, tok, random.Random(0))
    policy = "".join(ch for ch, m in zip(tok.decode(ex.ids), ex.mask) if m)
    assert policy.count("<search>") == 2 and policy.endswith("<answer> Tarsk </answer>")  # Doc 1 of the first block
    # a neutral reason for the extra search, never "the documents do not say it" before documents that did
    assert any(t in policy for t in CHECK_THOUGHTS) and not any(t[:20] in policy for t in NEXT_THOUGHTS)
    assert not any(p.extra for p in retrieval_plan(item, results, random.Random(0), label="passage"))  # needed
    assert len(retrieval_plan(item, results, random.Random(0), label="graph", extra=True, budget=1)) == 1


def test_a_multi_hop_warm_start_searches_the_question_again_for_the_missing_page_and_answers_once_both_are_found(
) -> None:
    from routerag.datasets import parse_item
    from routerag.prompts import DEFAULT_INSTRUCTION, REFUSE_MARKER
    from routerag.retrieval.types import RetrievalResult, RetrievedDoc
    from training.sft import build_example, refusal_template, retrieval_plan

    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    row = {"_id": "c1", "question": "Were Joran Veld and Mira Olt of the same nationality?", "answer": "yes",
           "type": "comparison", "supporting_facts": [["Joran Veld", 0], ["Mira Olt", 0]],
           "context": [["Joran Veld", ["Joran Veld was a Tarskan painter."]], ["Mira Olt", ["Mira Olt was Tarskan."]]]}
    item = parse_item(row)
    assert item.meta["multi_hop"] and not parse_item({"question": "q?", "answers": ["a"]}).meta
    joran = RetrievedDoc("a", "Joran Veld", "Joran Veld was a Tarskan painter.", 1.0)
    mira = RetrievedDoc("b", "Mira Olt", "Mira Olt was Tarskan.", 1.0)
    other = RetrievedDoc("c", "Other", "Nothing here.", 0.5)
    more = RetrievedDoc("d", "More", "Still nothing.", 0.4)
    q = item.question
    first = {m: RetrievalResult(q, m, [joran, other]) for m in ("passage", "graph", "hybrid")}
    again = {"passage": RetrievalResult(q, "passage", [joran, other, more]),  # the cheapest mode's next page misses
             "graph": RetrievalResult(q, "graph", [joran, other, mira, more]),
             "hybrid": RetrievalResult(q, "hybrid", [mira, joran, other])}
    assert [p.mode for p in retrieval_plan(item, first, random.Random(0), label="graph", k=2)] == ["graph"]
    assert len(retrieval_plan(item, first, random.Random(0), label="graph", again=again, k=2, budget=1)) == 1
    plan = retrieval_plan(item, first, random.Random(0), label="graph", again=again, k=2)
    # the same question again, in the cheapest mode whose unseen documents hold the missing page
    assert [(p.mode, p.query, [d.title for d in p.docs]) for p in plan] == [
        ("graph", q, ["Joran Veld", "Other"]), ("graph", q, ["Mira Olt", "More"])]
    ex = build_example(item, plan, tok, random.Random(0), template=refusal_template(DEFAULT_INSTRUCTION), refuse=True)
    policy = "".join(ch for ch, m in zip(tok.decode(ex.ids), ex.mask) if m)
    assert policy.count(f"<search>[graph] {q}</search>") == 2
    assert policy.endswith("<answer> yes </answer>") and REFUSE_MARKER not in policy  # "yes" is in no document
    nowhere = {m: RetrievalResult(q, m, [joran, other, more]) for m in ("passage", "graph", "hybrid")}
    alone = retrieval_plan(item, first, random.Random(0), label="graph", again=nowhere, k=2)
    assert len(alone) == 1  # a search that finds nothing new teaches nothing
    refused = build_example(item, alone, tok, random.Random(0), template=refusal_template(DEFAULT_INSTRUCTION),
                            refuse=True)
    text = "".join(ch for ch, m in zip(tok.decode(refused.ids), refused.mask) if m)
    assert text.endswith(f"<answer> {REFUSE_MARKER} </answer>")  # a comparison with one side missing


def test_routing_labels_pick_the_mode_that_served_the_reader(tmp_path: Path) -> None:
    from routerag.datasets import DatasetError
    from training.data import routing_labels

    def write(mode: str, rows: dict[str, tuple[float, float, float]]) -> None:
        with open(tmp_path / f"naive-{mode}.jsonl", "w") as fh:
            for qid, (em, ga, found) in rows.items():
                fh.write(json.dumps({"id": qid, "em": em, "gen_acc": ga, "answer_recall": found}) + "\n")

    write("passage", {"a": (0, 0, 1), "b": (1, 1, 1), "c": (0, 0, 0), "d": (0, 1, 1)})
    write("graph", {"a": (1, 1, 1), "b": (1, 1, 1), "c": (0, 0, 0), "d": (0, 0, 1)})
    write("hybrid", {"a": (0, 1, 1), "b": (1, 1, 1), "c": (0, 0, 0), "d": (0, 0, 0)})
    labels = routing_labels(tmp_path)
    # a: graph is right; b: all tie, graph served most questions overall; c: nothing found: no label; d: GenAcc
    assert labels == {"a": "graph", "b": "graph", "d": "passage"}
    (tmp_path / "naive-graph.jsonl").unlink()
    (tmp_path / "naive-hybrid.jsonl").unlink()
    with pytest.raises(DatasetError, match="at least two"):
        routing_labels(tmp_path)


def test_prepare_data_round_trip(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    qf = tmp_path / "q.jsonl"
    qf.write_text(json.dumps({"question": "Where was Joran Veld born?", "answers": ["Tarsk"],
                              "supporting": ["Joran Veld", {"title": "Tarsk", "text": "A town."}]}) + "\n")
    res = CliRunner().invoke(app, ["prepare-data", str(qf), "--out", str(tmp_path / "data"), "--split", "dev"])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(tmp_path / "data" / "dev.parquet").to_pylist()
    assert rows[0]["reward_model"]["ground_truth"]["target"] == ["Tarsk"]
    assert rows[0]["prompt"][0]["content"].endswith("Question: Where was Joran Veld born?\n")
    from training.data import load_training_items

    back = load_training_items(tmp_path / "data" / "dev.parquet")
    assert back[0].question == "Where was Joran Veld born?" and back[0].answers == ["Tarsk"]
    local = [json.loads(x) for x in (tmp_path / "data" / "dev.jsonl").read_text().splitlines()]
    assert local[0]["supporting"] == [{"title": "Joran Veld"}, {"title": "Tarsk", "text": "A town."}]


def test_prepare_data_keeps_only_questions_solved_in_eval_records(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps({"id": i, "question": f"Q{i}?", "answers": ["a"]}) + "\n" for i in "abcd"))
    rec = tmp_path / "learned.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "em": 1.0, "gen_acc": 1.0}, {"id": "b", "em": 0.0, "gen_acc": 1.0},
        {"id": "c", "em": 0.0, "gen_acc": 0.0}]))  # d was never evaluated
    res = CliRunner().invoke(app, ["prepare-data", str(qf), "--out", str(tmp_path / "data"), "--solved-in", str(rec)])
    assert res.exit_code == 0, res.output
    kept = [json.loads(x)["id"] for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert kept == ["a", "b"]
    tpl = tmp_path / "prompt.txt"
    tpl.write_text("Custom instructions.\nQ: {question}\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[policy]\ntemplate_file = "{tpl}"\n')
    res = CliRunner().invoke(app, ["prepare-data", str(qf), "--out", str(tmp_path / "data"), "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert [r["prompt"][0]["content"] for r in rows[:1]] == ["Custom instructions.\nQ: Qa?\n"]  # the served prompt
    rec.write_text('{"id": "a", "em": 1}\nnot json\n')
    res = CliRunner().invoke(app, ["prepare-data", str(qf), "--out", str(tmp_path / "data"), "--solved-in", str(rec)])
    assert res.exit_code != 0 and "learned.jsonl:2" in str(res.exception) + res.output


@pytest.mark.shared_data
def test_routerag_training_parquet_reads(shared_data: Path) -> None:
    from training.data import load_training_items

    items = load_training_items(shared_data / "hotpotqa_rl" / "dev.parquet")
    assert len(items) == 100
    assert items[0].question == "What is the name of the school located near the Brea mall owned by Simon Property Group?"
    assert items[0].answers == ["Brea Olinda High School"]
    assert [g.title for g in items[0].supporting] == ["Brea Olinda High School", "Brea Mall"]


# -- the verl launch plan ------------------------------------------------------------------------------------------

def test_verl_dry_run_reproduces_the_routerag_recipe(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["train", "--stage", "2", "--engine", "verl", "--nodes", "1", "--gpus-per-node", "8",
                                   "--questions", "data/train.parquet", "--index", str(tmp_path), "--out",
                                   str(tmp_path / "run"), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = res.output
    for expected in ("training.verl_plugin.main", "actor_rollout_ref.rollout.n=5", "data.train_batch_size=256",
                     "actor_rollout_ref.actor.optim.lr=1e-06", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                     "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                     "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "trainer.total_training_steps=40",
                     "routerag.switch_step=20", "trainer.n_gpus_per_node=8", "kl_loss_type=low_var_kl",
                     "fsdp_config.param_offload=True", "model.path=Qwen/Qwen2.5-7B-Instruct", "budget: 4", "k: 3"):
        assert expected in out, expected


def test_verl_flags_reach_verls_settings_and_an_adapter_is_refused(tmp_path: Path) -> None:
    base = ["train", "--stage", "2", "--engine", "verl", "--questions", "data/train.parquet", "--index", str(tmp_path),
            "--out", str(tmp_path / "run"), "--dry-run"]
    res = CliRunner().invoke(app, [*base, "--model", "runs/merged", "--batch-size", "16"])
    assert res.exit_code == 0, res.output
    assert "actor_rollout_ref.model.path=runs/merged" in res.output and "data.train_batch_size=16" in res.output
    res = CliRunner().invoke(app, [*base, "--init-adapter", "runs/sft/adapter"])
    assert res.exit_code != 0 and "merge-adapter" in str(res.exception) + res.output


def test_merge_adapter_folds_lora_into_a_plain_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from routerag.config import LoraConfig
    from training.models import add_lora, tiny_random_model

    model, tok = tiny_random_model(0)
    peft_model = add_lora(model, LoraConfig(r=4, alpha=8))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a fresh adapter is the identity; make it change the model
    peft_model.save_pretrained(tmp_path / "adapter")
    res = CliRunner().invoke(app, ["merge-adapter", "--model", "tiny-random", "--adapter", str(tmp_path / "adapter"),
                                   "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.tensor([tok.encode("Where was Joran Veld born?")])
    with torch.no_grad():
        want = peft_model.eval()(input_ids=ids).logits
        base = tiny_random_model(0)[0].eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert not torch.allclose(want, base, atol=1e-3)  # the adapter matters...
    assert torch.allclose(got, want, atol=1e-4)  # ...and the merged model computes what base + adapter did
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary folder left
    res = CliRunner().invoke(app, ["merge-adapter", "--model", "tiny-random", "--adapter", str(tmp_path / "adapter"),
                                   "--out", str(tmp_path / "merged")])
    assert res.exit_code != 0 and "not empty" in str(res.exception) + res.output


def test_mini_batch_conversion() -> None:
    from training.verl_plugin.launch import mini_batch_prompts

    assert mini_batch_prompts(256, 128, 5) == 32
    assert mini_batch_prompts(256, 128, 4) == 32
    assert mini_batch_prompts(10, 128, 5) == 10


# -- the local engine end to end -----------------------------------------------------------------------------------

def test_smoke_preset_trains_checkpoints_and_resumes(tmp_path: Path, monkeypatch, minilm) -> None:
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["train", "--stage", "1", "--engine", "local", "--model", "tiny-random", "--out", str(out)]
    res = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["stage"] == 1 for r in rows)
    for key in ("reward", "em", "searches", "retrieval_ms", "kl", "mode_mix", "by_first_mode", "reward_parts",
                "format_ok"):
        assert key in rows[0]
    assert (out / "checkpoint-2" / "model").is_dir() and (out / "reward_curve.png").is_file()
    from routerag.policy.card import read_card

    card = read_card(out / "checkpoint-2" / "model")  # the trained policy carries the loop it was trained with
    assert card is not None and card.loop.max_turn_tokens == 24 and card.loop.max_total_tokens == 160
    assert card.trained["step"] == 2 and card.reader == "policy"
    res = CliRunner().invoke(app, [*args, "--steps", "3"])  # resumes from checkpoint-2: runs only step 3
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_stage_two_prices_searches_by_the_cost_table_it_measured(tmp_path: Path, monkeypatch, minilm) -> None:
    """outcome-stage2 charges each search its mode's median from a table measured alone when training starts and
    recorded in the run; a resumed run keeps that table."""
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROUTERAG_TRAIN__STAGE2_REWARD", "outcome-stage2")
    out = tmp_path / "run"
    args = ["train", "--stage", "2", "--switch-step", "1", "--engine", "local", "--model", "tiny-random", "--out",
            str(out)]
    res = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert res.exit_code == 0, res.output
    table = json.loads((out / "retrieval_costs.json").read_text())
    assert set(table["ms"]) == {"passage", "graph", "hybrid"} and all(v > 0 for v in table["ms"].values())
    assert table["searches_per_mode"] >= 3
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == [1, 2] and rows[1]["reward_preset"] == "outcome-stage2"
    assert "retrieval_outcome" in rows[1]["reward_parts"] and "cost_ms" in rows[1]["reward_parts"]
    (out / "retrieval_costs.json").write_text(json.dumps({**table, "ms": {"passage": 1.0, "graph": 2.0,
                                                                          "hybrid": 3.0}}))
    res = CliRunner().invoke(app, [*args, "--steps", "3"])  # resumed: the recorded table, not a new measurement
    assert res.exit_code == 0, res.output
    assert json.loads((out / "retrieval_costs.json").read_text())["ms"]["graph"] == 2.0


def test_logits_of_the_tail_only_give_the_same_log_probabilities() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=g)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    full = token_logprobs(logits, ids)
    tail = token_logprobs(logits[:, 2:], ids)  # as if called with logits_to_keep=4
    assert torch.allclose(tail[:, 2:], full[:, 2:]) and (tail[:, :2] == 0).all()


def test_an_update_raises_rewarded_and_lowers_punished_sequences(tmp_path: Path) -> None:
    """The local engine's update on a real (tiny) model: +1 advantage makes that rollout likelier, −1 rarer."""
    from routerag.config import Settings
    from training.local_trainer import LocalGRPOTrainer
    from training.models import tiny_random_model
    from training.sequences import TokenSequence, micro_batches

    model, tok = tiny_random_model(0)
    from training.models import add_lora
    from routerag.config import LoraConfig

    model = add_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]))
    settings = Settings()
    settings.train.lr, settings.train.kl_coef, settings.train.micro_batch_size = 5e-2, 0.0, 2
    trainer = LocalGRPOTrainer.__new__(LocalGRPOTrainer)  # only the update machinery, no retriever needed
    trainer.cfg, trainer.model, trainer.tokenizer, trainer.device, trainer.reference = settings.train, model, tok, "cpu", None
    trainer.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    prompt = tok.encode("Question: what now?")

    def seq(text):
        ids = tok.encode(text)
        return TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids))

    good, bad = seq("<answer> alpha beta gamma </answer>"), seq("<search> delta epsilon zeta </search>")

    def seq_logprob(seq):
        mb = micro_batches([seq], [0.0], 1, tok.pad_token_id)[0]
        return (trainer._logprobs(model, mb, grad=False) * mb.loss_mask).sum().item()

    before = (seq_logprob(good), seq_logprob(bad))
    for _ in range(3):
        trainer.update([good, bad], [1.0, -1.0], [0, 0])
    after = (seq_logprob(good), seq_logprob(bad))
    assert after[0] > before[0] and after[1] < before[1]


def test_sft_warm_start_command_writes_adapter_metrics_and_curve(tmp_path: Path, monkeypatch, minilm,
                                                                 spacy_extractor) -> None:
    """``routerag train-sft`` end to end on a tiny random model: examples from gold passages found in the index by
    title, a loss that goes down over 3 epochs on 2 examples, the model, metrics and loss curve written."""
    from .helpers.server_helpers import build_small_index

    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    index = build_small_index(tmp_path / "idx", minilm, spacy_extractor)
    qs = tmp_path / "qs.jsonl"
    qs.write_text("\n".join(json.dumps(q) for q in [
        {"question": "Where was Joran Veld born?", "answers": ["Tarsk"], "supporting": ["Joran Veld"]},
        {"question": "Which waterway does Tarsk sit astride?", "answers": ["Ossel waterway"], "supporting": ["Tarsk"]},
    ]) + "\n")
    out = tmp_path / "sft"
    res = CliRunner().invoke(app, ["train-sft", "--index", str(index), "--questions", str(qs), "--model",
                                   "tiny-random", "--epochs", "3", "--lr", "1e-2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 warm-start examples" in res.output
    rows = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2] and rows[-1]["loss"] < rows[0]["loss"]
    assert (out / "sft_loss.png").stat().st_size > 0
    assert any((out / name).is_dir() for name in ("adapter", "model"))


def test_after_a_warm_start_the_kl_reference_is_the_warm_start(tmp_path: Path) -> None:
    """With ``--init-adapter`` the reference policy is a frozen copy of that adapter (KL 0 before any update), not
    the base model; training leaves the copy alone and checkpoints hold only the trained adapter."""
    from routerag.config import LoraConfig, Settings
    from training.models import REFERENCE_ADAPTER, add_lora, load_policy, reference_policy, tiny_random_model
    from training.sequences import TokenSequence, micro_batches

    model, tok = tiny_random_model(0)
    warm = add_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]))
    for name, p in warm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # a warm start that differs from the base
    warm.save_pretrained(tmp_path / "warm")
    settings = Settings()
    settings.train.model, settings.train.init_adapter = "tiny-random", str(tmp_path / "warm")
    policy, _ = load_policy(settings.train)
    assert REFERENCE_ADAPTER in policy.peft_config and policy.active_adapter == "default"
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(REFERENCE_ADAPTER not in n for n in trainable)
    ids = tok.encode("Question: where? <answer> Tarsk </answer>")
    mb = micro_batches([TokenSequence(ids, [1] * len(ids))], [0.0], 1, tok.pad_token_id)[0]

    def logits(m):
        with torch.no_grad():
            return m(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits

    now = logits(policy)
    with reference_policy(policy) as ref:
        assert torch.allclose(logits(ref), now, atol=1e-6)  # KL 0 at the start
    with policy.disable_adapter():
        assert not torch.allclose(logits(policy), now, atol=1e-3)  # the base model is a different policy
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trainable  # flags restored
    for name, p in policy.named_parameters():
        if p.requires_grad:
            p.data += 0.1  # a training step moves the policy, not the reference
    moved = logits(policy)
    with reference_policy(policy) as ref:
        assert torch.allclose(logits(ref), now, atol=1e-6) and not torch.allclose(moved, now, atol=1e-4)
    policy.save_pretrained(tmp_path / "ckpt", selected_adapters=["default"])
    assert not (tmp_path / "ckpt" / REFERENCE_ADAPTER).exists()


def test_sft_resumes_from_its_latest_checkpoint_to_the_same_weights(tmp_path: Path, monkeypatch) -> None:
    """A warm start killed after its second optimiser step and rerun ends with the weights of an unbroken run (the
    batch order is replayed from the seed, finished steps skipped, optimiser and RNG restored from the checkpoint);
    its metrics hold each step once."""
    import training.sft as sft
    from routerag.policy.card import PolicyCard
    from routerag.config import LoraConfig
    from training.models import add_lora, tiny_random_model

    gen = random.Random(1)
    examples = [sft.TokenSequence([gen.randrange(5, 500) for _ in range(12)], [0] * 6 + [1] * 6) for _ in range(8)]
    card = PolicyCard()

    def run(out: Path):
        model, tok = tiny_random_model(0)
        model = add_lora(model, LoraConfig(r=4, alpha=8))
        sft.train_sft(model, tok, examples, out, epochs=2, lr=1e-2, micro_batch_size=2, accumulate=2, card=card)
        return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}

    whole = run(tmp_path / "whole")
    real_save, saves = sft.save_checkpoint, []

    def dying_save(out, step, *a, **kw):
        real_save(out, step, *a, **kw)
        saves.append(step)
        if step == 2:
            raise KeyboardInterrupt  # killed right after the checkpoint of step 2

    monkeypatch.setattr(sft, "save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "broken")
    monkeypatch.setattr(sft, "save_checkpoint", real_save)
    resumed = run(tmp_path / "broken")
    assert saves == [1, 2]
    assert all(torch.allclose(whole[k], resumed[k], atol=1e-6) for k in whole)
    steps = [json.loads(x)["step"] for x in (tmp_path / "broken" / "sft_metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "broken").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]


def test_stage_comparison_prices_steps_by_the_cost_table(tmp_path: Path) -> None:
    """The stage-1/stage-2 plot prices each step with the table: searches × Σ share × cost (1.5 × (0.5·10 + 0.5·20))."""
    from training.plots import plot_stages, step_table_ms

    table = {"passage": 10.0, "graph": 20.0, "hybrid": 30.0}
    row = {"step": 1, "em": 0.5, "searches": 1.5, "retrieval_ms": 99.0, "mode_mix": {"passage": 0.5, "graph": 0.5}}
    assert step_table_ms(row, table) == pytest.approx(22.5)
    assert step_table_ms({**row, "searches": 0.0, "mode_mix": {}}, table) == 0.0
    for name in ("s1", "s2"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "step": 2}) + "\n")
    png = plot_stages({"stage 1": tmp_path / "s1.jsonl", "stage 2": tmp_path / "s2.jsonl"}, tmp_path / "c.png", table)
    assert png.stat().st_size > 10_000
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no metrics"):
        plot_stages({"x": tmp_path / "empty.jsonl"}, tmp_path / "d.png")
