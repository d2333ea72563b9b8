"""RouteRAG's stage-2 reward on verl's data: the pure function over a verl ``DataProto`` gives the local trainer's
stage-2 rewards (and GRPO advantages) for the same trajectories, and the trainer hook does the same inside verl's
synchronous V1 trainer, on rows that verl's own agent-loop writer put into a real TransferQueue (Ray on CPU)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos

from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.types import Trajectory
from training.grpo import group_advantages
from training.rewards import RewardConfig, Rollout, batch_rewards
from training.verl_plugin.agent_loop import response_tokens
from training.verl_plugin.reward import compute_score
from training.verl_plugin.stage2 import stage2_scores

from .helpers.scripted import CharTokenizer, FakeSearch, ScriptedGenerator

RESPONSE_LIMIT = 4096

# two questions × three rollouts: right or wrong, with 0–2 searches of different measured retrieval times
ROLLOUTS = [
    ("Where was Marisol Vantreigh born?", ["Kestrel Harbor"], [
        (["<search>[passage] Marisol Vantreigh</search>", "<answer>Kestrel Harbor</answer>"], 10.0),
        (["<search>[graph] Marisol Vantreigh</search>", "<search>[graph] Vantreigh birthplace</search>",
          "<answer>Kestrel Harbor</answer>"], 25.0),
        (["<answer>Marrow Point</answer>"], 0.0)]),
    ("When did The Glass Lighthouse premiere?", ["1994"], [
        (["<search>[hybrid] The Glass Lighthouse premiere</search>", "<answer>1994</answer>"], 40.0),
        (["<search>[passage] Glass Lighthouse</search>", "<answer>1996</answer>"], 5.0),
        (["<answer>1994</answer>"], 0.0)]),
]


def _run(question: str, turns: list[str], ms: float) -> Trajectory:
    loop = PolicyLoop(ScriptedGenerator(list(turns), tokenizer=CharTokenizer()), FakeSearch(ms=ms),
                      LoopConfig(budget=3, k=2, max_information_tokens=80))
    return asyncio.run(loop.run(question))


@pytest.fixture(scope="module")
def batch() -> tuple[list[Trajectory], list[list[str]], list[int]]:
    trajs, golds, groups = [], [], []
    for g, (question, answers, specs) in enumerate(ROLLOUTS):
        for turns, ms in specs:
            trajs.append(_run(question, turns, ms))
            golds.append(answers)
            groups.append(g)
    return trajs, golds, groups


def local_stage2(trajs: list[Trajectory], golds: list[list[str]]) -> list[float]:
    """The local trainer's stage-2 reward (``LocalGRPOTrainer.train_step``: rollouts → ``batch_rewards``)."""
    rollouts = [Rollout.from_trajectory(t) for t in trajs]
    return [r.total for r in batch_rewards(rollouts, golds, RewardConfig.preset("routerag-stage2"))]


def _objects(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def as_verl_batch(trajs: list[Trajectory], golds: list[list[str]]) -> DataProto:
    """The trajectories laid out as verl's agent-loop worker returns them: prompts left-padded, responses (our
    agent loop's ids) right-padded, one attention mask over both, the rollout summary as it travels (JSON) and the
    dataset's ground truth."""
    prompts = [t.segments[0].token_ids or [] for t in trajs]
    responses = [response_tokens(t, RESPONSE_LIMIT)[0] for t in trajs]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    ids = torch.zeros((len(trajs), p_width + r_width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, p_width - len(p): p_width + len(r)] = torch.tensor(p + r)
        attention[i, p_width - len(p): p_width + len(r)] = 1
    return DataProto.from_dict(
        tensors={"prompts": ids[:, :p_width], "responses": ids[:, p_width:], "attention_mask": attention},
        non_tensors={"rollout": _objects([json.loads(json.dumps(Rollout.from_trajectory(t).to_json()))
                                          for t in trajs]),
                     "reward_model": _objects([{"style": "rule", "ground_truth": {"target": g}} for g in golds])})


def test_stage2_on_a_verl_batch_equals_the_local_trainers_reward(batch) -> None:
    trajs, golds, groups = batch
    want = local_stage2(trajs, golds)
    assert want != [float(r.parts["em"]) for r in batch_rewards([Rollout.from_trajectory(t) for t in trajs], golds,
                                                                 RewardConfig.preset("routerag-stage1"))]
    data = as_verl_batch(trajs, golds)
    got = stage2_scores(data)
    assert got.token_scores.sum(dim=-1).tolist() == pytest.approx(want, abs=1e-6)
    lengths = [len(response_tokens(t, RESPONSE_LIMIT)[0]) for t in trajs]
    for row, n in enumerate(lengths):  # the whole reward sits on the response's last token, as verl puts it
        assert torch.nonzero(got.token_scores[row]).flatten().tolist() in ([n - 1], [])
    # and verl's GRPO turns it into the local trainer's advantages
    mask = torch.zeros_like(got.token_scores)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    theirs, _ = core_algos.compute_grpo_outcome_advantage(got.token_scores, mask, np.array(groups), epsilon=1e-6,
                                                          norm_adv_by_std_in_grpo=True)
    ours = group_advantages(torch.tensor(want), groups).unsqueeze(1) * mask
    assert torch.allclose(theirs, ours, atol=1e-5)
    assert got.metrics()["routerag/stage2_reward_mean"] == pytest.approx(sum(want) / len(want))


# -- the trainer hook inside verl's V1 trainer, on a real TransferQueue -------------------------------------------

@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[object]:
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
        tq.close()
    finally:
        ray.shutdown()


def _write_with_verls_writer(trajs: list[Trajectory], golds: list[list[str]], groups: list[int]) -> list[str]:
    """Put each trajectory into TransferQueue through verl's own agent-loop writer
    (``AgentLoopWorkerTQ._agent_loop_postprocess``) with the stage-1 score our reward function gives it, as verl's
    reward loop sets it. The worker's constructor only loads the model, tokenizer and tools, which writing does
    not use, so a bare instance of its class stands in for a text-only worker."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker_cls = AgentLoopWorkerTQ.__ray_actor_class__
    writer = worker_cls.__new__(worker_cls)
    writer.processor, writer.reward_loop_worker_handles, writer.distillation_enabled = None, None, False
    uids = {g: uuid.uuid4().hex for g in set(groups)}
    sessions: dict[int, int] = {}
    keys: list[str] = []

    async def put() -> None:
        for traj, gold, g in zip(trajs, golds, groups):
            ids, mask, logprobs = response_tokens(traj, RESPONSE_LIMIT)
            rollout = Rollout.from_trajectory(traj).to_json()
            score = compute_score("sample", traj.text, {"target": gold}, {"rollout": rollout})
            session = sessions[g] = sessions.get(g, -1) + 1
            out = AgentLoopOutput(prompt_ids=traj.segments[0].token_ids, response_ids=ids, response_mask=mask,
                                  response_logprobs=logprobs, reward_score=score["score"], num_turns=2,
                                  metrics=AgentLoopMetrics(),
                                  extra_fields={"rollout": rollout, "reward_extra_info": score})
            await writer._agent_loop_postprocess(
                out, False, uid=uids[g], session_id=session, global_steps=1, index=g, data_source="sample",
                raw_prompt=[{"role": "user", "content": traj.question}], extra_info={"index": g},
                reward_model={"style": "rule", "ground_truth": {"target": gold}})
            keys.append(f"{uids[g]}_{session}_0")  # verl's key: uid, session (rollout) and output index

    asyncio.run(put())
    return keys


def test_the_trainer_hook_rewrites_the_rewards_verl_computes_advantages_from(batch, transfer_queue, tmp_path: Path
                                                                            ) -> None:
    import transfer_queue as tq
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    from routerag.config import TrainConfig
    from training.verl_plugin.compose import compose_launch
    from training.verl_plugin.launch import prepare_launch
    from training.verl_plugin.trainer import RouteRAGTrainerSync

    trajs, golds, groups = batch
    keys = _write_with_verls_writer(trajs, golds, groups)
    tags = tq.kv_list("train")["train"]
    # verl pads the batch to its data-parallel multiple with copies of a real row (tagged is_padding)
    meta = upsample_batch_to_divisible_size(KVBatchMeta(partition_id="train", keys=keys, tags=[tags[k] for k in keys]),
                                            batch_multiple=4, eos_token_id=0)
    assert len(meta) == 8 and [t.get("is_padding", False) for t in meta.tags].count(True) == 2
    # the actor's old log-probabilities, which verl computes before the advantages
    logp = tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["rollout_log_probs"])
    tq.kv_batch_put(keys=meta.keys, partition_id="train",
                    fields=TensorDict({"old_log_probs": logp["rollout_log_probs"]}, batch_size=len(meta)))

    launch = TrainConfig(engine="verl", group_size=3, switch_step=1, verl={"train_files": ["train.parquet"]})
    trainer = RouteRAGTrainerSync.__new__(RouteRAGTrainerSync)  # the hook needs the config and the step only
    trainer.config = compose_launch(prepare_launch(launch, tmp_path / "run", index_dir=str(tmp_path))["overrides"])
    stage1 = [float(r.parts["em"]) for r in batch_rewards([Rollout.from_trajectory(t) for t in trajs], golds,
                                                          RewardConfig.preset("routerag-stage1"))]
    lengths = [len(response_tokens(t, RESPONSE_LIMIT)[0]) for t in trajs]
    for step, want in ((1, stage1), (2, local_stage2(trajs, golds))):  # switch_step 1: step 2 is stage 2
        trainer.global_steps = step
        metrics: dict = {}
        trainer._compute_advantage(meta, metrics)
        got = tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["rm_scores", "advantages"])
        scores, adv = got["rm_scores"].to_padded_tensor(0.0), got["advantages"].to_padded_tensor(0.0)
        assert scores[:6].sum(dim=-1).tolist() == pytest.approx(want, abs=1e-6)
        assert scores[6:].abs().sum() == 0 and adv[6:].abs().sum() == 0  # padding rows contribute nothing
        want_adv = group_advantages(torch.tensor(want), groups).tolist()
        for row, n in enumerate(lengths):
            mask = torch.tensor(response_tokens(trajs[row], RESPONSE_LIMIT)[1], dtype=torch.float32)
            assert adv[row, :n].tolist() == pytest.approx((want_adv[row] * mask).tolist(), abs=1e-5)
        assert ("routerag/stage2_reward_mean" in metrics) == (step == 2)
