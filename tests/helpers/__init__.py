"""What the tests share and none of them is: scripted and fake backends, a fake and a real OpenAI-compatible server,
a live uvicorn with an SSE parser, a small index, and an index comparison. Kept apart from the ``test_*.py``
modules so a reader sees at a glance which files hold tests."""
