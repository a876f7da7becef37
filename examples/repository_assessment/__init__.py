"""The spec's example workflow ``repository-assessment``, doing real work offline on a local
git repository: ``plan`` lists the files at the revision, ``analyse`` runs ruff and counts
lines and TODOs, ``apply`` (shared-write, approval-gated) proposes a patch, and once a reviewer
approved its hash commits it on a branch; ``report`` returns the summary, the run's result.

``agents.worker`` is the worker app (``runcontrol worker --app
examples.repository_assessment.agents:worker``); ``python -m examples.repository_assessment``
makes the repository, publishes the workflow, submits a run, shows the patch for approval and
prints the result (README.md beside this file)."""
