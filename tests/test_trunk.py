"""The GRPO update's forward passes (training/trunk.py): the frozen layers below a top-layers LoRA adapter run once for
the policy and its reference, and only loss positions are projected onto the vocabulary. They must change no number:
log-probabilities, gradients and a whole trainer update are compared with whole forward passes on a real (tiny)
Llama."""

from __future__ import annotations

import copy

import torch

from routerag.config import LoraConfig, Settings
from training.grpo import by_first_mode, informative_groups
from training.local_trainer import LocalGRPOTrainer
from training.models import add_lora, reference_policy, tiny_random_model
from training.sequences import TokenSequence, micro_batches
from training.trunk import UpdateForward, lowest_adapted_layer


def four_layer_policy(top_layers: int = 2):
    model, tok = tiny_random_model(0)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = 4
    torch.manual_seed(1)
    model = type(model)(cfg)
    model = add_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, top_layers=top_layers))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)  # an adapter that changes the outputs
    return model.eval(), tok


def batch(tok, texts: list[str]):
    seqs = []
    for text in texts:
        prompt, ids = tok.encode("Question: where was Joran Veld born?"), tok.encode(text)
        seqs.append(TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids)))
    return seqs, micro_batches(seqs, [1.0] * len(seqs), len(seqs), tok.pad_token_id)[0]


def bare_trainer(model, tok, kl_coef: float, trunk: bool) -> LocalGRPOTrainer:
    settings = Settings()
    settings.train.lr, settings.train.kl_coef, settings.train.micro_batch_size = 5e-2, kl_coef, 2
    settings.train.update_passes = "split" if trunk else "whole"
    return LocalGRPOTrainer.update_only(settings.train, model, tok)


def test_the_split_is_the_lowest_adapted_layer_and_there_is_none_without_frozen_layers_below() -> None:
    model, _ = four_layer_policy(top_layers=2)
    assert lowest_adapted_layer(model) == 2 and UpdateForward.of(model).split == 2
    everywhere, _ = four_layer_policy(top_layers=0)
    assert lowest_adapted_layer(everywhere) == 0 and UpdateForward.of(everywhere).split == 0
    plain, _ = tiny_random_model(0)
    assert lowest_adapted_layer(plain) is None and UpdateForward.of(plain).split == 0
    assert UpdateForward.of(everywhere).hidden(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3)) is None


def test_logprobs_and_gradients_from_the_trunk_equal_whole_passes_for_policy_and_reference() -> None:
    model, tok = four_layer_policy()
    _, mb = batch(tok, ["<answer> Tarsk </answer>", "<search>[graph] Joran Veld birthplace </search> more"])
    trainer = bare_trainer(model, tok, 0.0, trunk=True)
    hidden = trainer.passes.hidden(mb.input_ids, mb.attention_mask)
    assert len(model.get_base_model().model.layers) == 4  # the decoder is whole again after each pass
    whole = trainer._logprobs(model, mb, grad=True, whole=True) * mb.loss_mask
    split = trainer._logprobs(model, mb, grad=True, hidden=hidden)
    assert torch.allclose(whole, split, atol=1e-5) and whole.abs().sum() > 0
    assert (split[mb.loss_mask == 0] == 0).all()  # only the loss positions are projected
    lora = [p for p in model.parameters() if p.requires_grad]
    g_whole = torch.autograd.grad((whole * mb.loss_mask).sum(), lora)
    g_split = torch.autograd.grad((split * mb.loss_mask).sum(), lora)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_whole, g_split))
    assert any(a.abs().sum() > 0 for a in g_whole)
    with reference_policy(model) as ref:  # adapter off: a different policy, from the same trunk
        ref_whole = trainer._logprobs(ref, mb, grad=False, whole=True) * mb.loss_mask
        assert torch.allclose(ref_whole, trainer._logprobs(ref, mb, grad=False, hidden=hidden), atol=1e-5)
    assert not torch.allclose(ref_whole, whole.detach(), atol=1e-3)


def test_an_update_with_the_trunk_moves_the_adapter_exactly_as_whole_passes_do() -> None:
    results = []
    for use_trunk in (False, True):
        model, tok = four_layer_policy()
        seqs, _ = batch(tok, ["<answer> Tarsk </answer>", "<search>[graph] Joran Veld </search>",
                              "<answer> Ossel </answer>"])
        trainer = bare_trainer(model, tok, kl_coef=0.1, trunk=use_trunk)
        stats = [trainer.update(seqs, [1.0, -1.0, 0.5], [0, 0, 1]) for _ in range(2)]
        params = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        results.append((stats, params, trainer.passes is not None))
    (s0, p0, _), (s1, p1, kept) = results
    assert kept  # the first use's check against a whole pass passed
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["kl"] - b["kl"]) < 1e-6 for a, b in zip(s0, s1))
    assert s1[1]["kl"] > 0 and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(p0, p1))


def test_passes_that_disagree_with_the_whole_model_are_dropped_with_a_warning(caplog) -> None:
    model, tok = four_layer_policy()
    seqs, _ = batch(tok, ["<answer> Tarsk </answer>", "<search>[graph] Joran Veld </search>"])
    trainer = bare_trainer(model, tok, kl_coef=0.1, trunk=True)
    real = trainer.passes.hidden
    trainer.passes.hidden = lambda ids, mask: real(ids, mask) * 1.5  # as a family that scales its embeddings would
    stats = trainer.update(seqs, [1.0, -1.0], [0, 0])
    assert trainer.passes is None and "shared-trunk passes differ" in caplog.text and stats["updates"] == 1


def test_filtered_groups_are_left_out_of_the_update_and_uniform_steps_make_no_optimiser_step() -> None:
    """``train.filter_groups``: with KL off, dropping a uniform group changes nothing its zero advantages carried, so
    the adapter moves exactly as an update over the informative group alone; all-uniform makes no step."""
    texts = ["<answer> Tarsk </answer>", "<search>[graph] Joran Veld </search>", "<answer> Ossel </answer>",
             "<answer> Ossel </answer>"]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    groups = [0, 0, 1, 1]
    assert informative_groups(rewards, groups) == {0}
    assert informative_groups(torch.tensor([0.3, 0.3, 0.7]), [0, 0, 1]) == {1}  # a group of one always counts
    adv = [1.0, -1.0, 0.0, 0.0]
    params = []
    for kept, rows in (({0}, [0, 1, 2, 3]), (None, [0, 1])):
        model, tok = four_layer_policy()
        seqs, _ = batch(tok, [texts[i] for i in rows])
        stats = bare_trainer(model, tok, kl_coef=0.0, trunk=True).update(
            seqs, [adv[i] for i in rows], [groups[i] for i in rows], kept)
        assert stats["updates"] == 1 and stats["policy_tokens"] == sum(s.policy_tokens for s in seqs[:2])
        params.append([p.detach().clone() for p in model.parameters() if p.requires_grad])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*params))
    model, tok = four_layer_policy()
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    seqs, _ = batch(tok, texts[2:])
    stats = bare_trainer(model, tok, kl_coef=0.1, trunk=True).update(seqs, [0.0, 0.0], [1, 1], set())
    assert stats["updates"] == 0
    assert all(torch.equal(a, p) for a, p in zip(before, (p for p in model.parameters() if p.requires_grad)))


def test_by_first_mode_gives_each_modes_mean_reward_and_advantage() -> None:
    """Where the update pushes the routing: passage's rollouts here earn more than their groups' means."""
    out = by_first_mode(["passage", "graph", None, "passage"], [1.0, 0.0, 0.5, 0.5], [0.8, -0.6, 0.0, 0.2])
    assert out == {"graph": {"n": 1, "reward": 0.0, "advantage": -0.6},
                   "none": {"n": 1, "reward": 0.5, "advantage": 0.0},
                   "passage": {"n": 2, "reward": 0.75, "advantage": 0.5}}
