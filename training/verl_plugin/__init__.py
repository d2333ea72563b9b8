"""The verl engine: RouteRAG's two-stage GRPO on upstream verl 0.9.1 (PyPI), as plug-ins rather than a fork.

* :mod:`.agent_loop` — a registered agent loop that runs *our* policy loop against verl's rollout server;
* :mod:`.generator` — the policy backend over verl's rollout server (token ids in, token ids and log-probs out);
* :mod:`.reward` — the reward function verl calls per rollout (our reward library);
* :mod:`.stage2` — RouteRAG's batch-level stage-2 reward over a verl ``DataProto``;
* :mod:`.trainer` — verl's synchronous V1 trainer with the stage-2 reward before the advantages;
* :mod:`.main` — the entry point: verl's ``run_ppo`` with that trainer;
* :mod:`.launch` — builds the Hydra overrides and the command for ``routerag train --engine verl``;
* :mod:`.compose` — composes a launch against verl's Hydra config and runs verl's validation (no GPU needed);
* :mod:`.cpu_server` — verl's rollout-server client answered in-process by our transformers backend (CPU checks).

Only :mod:`.launch`, :mod:`.generator` and :mod:`.reward` import without verl installed; the others need verl 0.9.1
and what it imports (the ``train`` extra, or the test install of the Makefile).
"""
