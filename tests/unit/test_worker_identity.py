"""A lease holder is a worker identity (subject + instance), never a free string."""

from __future__ import annotations

import pytest

from runcontrol.domain import WorkerIdentity, errors


def test_the_holder_is_subject_and_instance() -> None:
    assert WorkerIdentity("t-1", "svc-worker", "pod-7.a:1").holder == "svc-worker/pod-7.a:1"


@pytest.mark.parametrize("instance", ["", "a/b", "x" * 65, "spa ce", "é"])
def test_an_instance_id_that_could_blur_the_holder_is_refused(instance: str) -> None:
    with pytest.raises(errors.ValidationFailed):
        WorkerIdentity("t-1", "svc-worker", instance)


def test_a_worker_needs_a_tenant_and_a_subject() -> None:
    with pytest.raises(errors.ValidationFailed):
        WorkerIdentity("", "svc-worker", "i-1")
    with pytest.raises(errors.ValidationFailed):
        WorkerIdentity("t-1", "", "i-1")
