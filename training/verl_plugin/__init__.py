"""The verl engine: RouteRAG's two-stage GRPO on upstream verl (PyPI), as plug-ins rather than a fork.

* :mod:`.agent_loop` — a registered agent loop that runs *our* policy loop against verl's rollout server;
* :mod:`.reward` — the reward function verl calls per rollout (our reward library);
* :mod:`.trainer` — the batch-level stage-2 reward (RouteRAG's time efficiency needs the whole batch);
* :mod:`.launch` — builds the Hydra overrides and the command for ``routerag train --engine verl``.

Only :mod:`.launch` and :mod:`.generator` import without verl installed.
"""
