"""Runs as A2A tasks (issue 31): a published workflow exposed as an A2A agent, served by
a2a-sdk's bindings over ``RunTaskHandler`` (docs/a2a.md)."""
