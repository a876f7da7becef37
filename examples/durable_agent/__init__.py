"""``durable-agent``: a pydantic-ai agent run durably in one step
(``runcontrol.integrations.pydantic_ai``). It reads a local repository with tools (list the
files, read a file), proposes a change through a tool that needs approval, and once a reviewer
approved exactly that call, applies it in a scratch copy of the repository.

``agents.worker`` is the worker app (``runcontrol worker --app
examples.durable_agent.agents:worker``); ``python -m examples.durable_agent`` makes a sample
repository, publishes the workflow, submits a run, shows the proposed change for approval and
prints the result with the count of model requests made (README.md beside this file)."""
