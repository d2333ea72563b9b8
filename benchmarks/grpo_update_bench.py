"""The GRPO update with its own forward passes (training/trunk.py: the frozen trunk once, the vocabulary only at loss
positions) against the model's whole forward passes, side by side in one process.

The CPU recipe's model (the embedded SmolLM2-135M, LoRA r 16 on its top 8 layers, micro-batches of 2, KL 0.001)
updates on rollout-shaped sequences built from the sample corpus: the instruction and a question, then two turns
of policy text each followed by an ``<information>`` block of three passages (masked), then an answer. The two
variants alternate, each from the same starting adapter, and the log reports seconds per update and their ratio;
their losses and KLs must agree (the passes are exact).

    python benchmarks/grpo_update_bench.py --sequences 16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from routerag.config import LoraConfig, Settings, TrainConfig
from routerag.prompts import DEFAULT_INSTRUCTION, DOCUMENT, INFORMATION_BLOCK
from training.local_trainer import LocalGRPOTrainer
from training.models import add_lora, load_policy
from training.sequences import TokenSequence

SAMPLES = Path(__file__).resolve().parents[1] / "routerag" / "samples"


def rollout_sequences(tok, n: int) -> list[TokenSequence]:
    """``n`` sequences shaped like the CPU recipe's rollouts (prompt, two searches with documents, an answer)."""
    qs = [json.loads(x)["question"] for x in (SAMPLES / "questions.jsonl").read_text().splitlines() if x.strip()]
    docs = [json.loads(x) for x in (SAMPLES / "corpus.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for i in range(n):
        q = qs[i % len(qs)]
        parts = [(tok.apply_chat_template([{"role": "user", "content": DEFAULT_INSTRUCTION.format(question=q)}],
                                          tokenize=False, add_generation_prompt=True), 0)]
        for turn in range(2):
            thought = f"<think> I need the page about the subject of: {q} (step {turn}) </think>\n"
            parts.append((thought + f"<search> [graph] {q} </search>", 1))
            chosen = [docs[(i + 3 * turn + j) % len(docs)] for j in range(3)]
            parts.append((INFORMATION_BLOCK.format(documents="\n".join(
                DOCUMENT.format(i=j + 1, title=d.get("title", ""), text=d.get("text", ""))
                for j, d in enumerate(chosen))), 0))
        parts.append(("<think> The documents say it. </think>\n<answer> an answer </answer>", 1))
        ids, mask = [], []
        for text, m in parts:
            t = tok.encode(text, add_special_tokens=False)
            ids += t
            mask += [m] * len(t)
        out.append(TokenSequence(ids, mask))
    return out


def trainer_for(model, tok, cfg: TrainConfig, trunk: bool) -> LocalGRPOTrainer:
    trainer = LocalGRPOTrainer.update_only(cfg.model_copy(update={"update_passes": "split" if trunk else "whole"}),
                                           model, tok)
    trainer._passes_checked = True  # checked once per run by the trainer (and by tests/test_trunk.py), not per update
    return trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=16, help="rollouts per update (the recipe: 4 x 6 = 24)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    cfg = Settings(train={"model": "smollm2", "micro_batch_size": 2, "kl_coef": 0.001, "lr": 1e-4,
                          "lora": {"enabled": False}}).train
    base, tok = load_policy(cfg)
    model = add_lora(base, LoraConfig(r=16, alpha=32, top_layers=8))
    start = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    seqs = rollout_sequences(tok, args.sequences)
    adv = [(-1.0) ** i for i in range(len(seqs))]
    groups = [i // 4 for i in range(len(seqs))]
    times: dict[str, list[float]] = {"whole passes": [], "update passes": []}
    stats: dict[str, dict[str, float]] = {}
    trainer_for(model, tok, cfg, False).update(seqs[:2], adv[:2], groups[:2])  # warm-up, untimed
    variants = [("whole passes", False), ("update passes", True)]
    for r in range(args.repeats):
        for name, use in variants if r % 2 == 0 else variants[::-1]:
            model.load_state_dict(start, strict=False)
            trainer = trainer_for(model, tok, cfg, use)
            t = time.perf_counter()
            stats[name] = trainer.update(seqs, adv, groups)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"sequences": len(seqs), "tokens_per_sequence": statistics.median(len(s.ids) for s in seqs),
              "policy_tokens_per_sequence": statistics.median(sum(s.mask) for s in seqs),
              "threads": torch.get_num_threads(), "seconds": times, "median_s": med,
              "ratio": med["update passes"] / med["whole passes"],
              "loss": {k: v["loss"] for k, v in stats.items()}, "kl": {k: v["kl"] for k, v in stats.items()}}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
