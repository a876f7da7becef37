import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttemptOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_OUTCOME_UNSPECIFIED: _ClassVar[AttemptOutcome]
    SUCCEEDED: _ClassVar[AttemptOutcome]
    FAILED: _ClassVar[AttemptOutcome]
    TIMED_OUT: _ClassVar[AttemptOutcome]
    UNCERTAIN: _ClassVar[AttemptOutcome]
    CANCELLED: _ClassVar[AttemptOutcome]
ATTEMPT_OUTCOME_UNSPECIFIED: AttemptOutcome
SUCCEEDED: AttemptOutcome
FAILED: AttemptOutcome
TIMED_OUT: AttemptOutcome
UNCERTAIN: AttemptOutcome
CANCELLED: AttemptOutcome

class ClaimNext(_message.Message):
    __slots__ = ("agent_ids", "wait_seconds")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    wait_seconds: float
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class NamedAttempt(_message.Message):
    __slots__ = ("run_id", "attempt_id", "fencing_token", "lease_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    fencing_token: int
    lease_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., lease_id: _Optional[str] = ...) -> None: ...

class AcquireLeaseRequest(_message.Message):
    __slots__ = ("worker_instance_id", "claim_next", "attempt", "command_id")
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NEXT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    worker_instance_id: str
    claim_next: ClaimNext
    attempt: NamedAttempt
    command_id: str
    def __init__(self, worker_instance_id: _Optional[str] = ..., claim_next: _Optional[_Union[ClaimNext, _Mapping]] = ..., attempt: _Optional[_Union[NamedAttempt, _Mapping]] = ..., command_id: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("tenant_id", "run_id", "step_id", "attempt_id", "lease_id", "fencing_token", "holder", "expires_at", "agent_id", "skill_id", "attempt_number", "side_effect_class", "gate", "cancel_requested", "input_json", "approved_proposal_hash", "replay")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    APPROVED_PROPOSAL_HASH_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    run_id: str
    step_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    holder: str
    expires_at: _timestamp_pb2.Timestamp
    agent_id: str
    skill_id: str
    attempt_number: int
    side_effect_class: str
    gate: str
    cancel_requested: bool
    input_json: str
    approved_proposal_hash: str
    replay: str
    def __init__(self, tenant_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., holder: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_id: _Optional[str] = ..., skill_id: _Optional[str] = ..., attempt_number: _Optional[int] = ..., side_effect_class: _Optional[str] = ..., gate: _Optional[str] = ..., cancel_requested: _Optional[bool] = ..., input_json: _Optional[str] = ..., approved_proposal_hash: _Optional[str] = ..., replay: _Optional[str] = ...) -> None: ...

class AcquireLeaseResponse(_message.Message):
    __slots__ = ("granted", "lease", "results_json")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_JSON_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    lease: Lease
    results_json: str
    def __init__(self, granted: _Optional[bool] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., results_json: _Optional[str] = ...) -> None: ...

class ReportAttemptOutcomeRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "outcome", "failure_class", "outcome_hash", "command_id", "worker_instance_id", "result_json", "result_ref_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_REF_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    outcome: AttemptOutcome
    failure_class: str
    outcome_hash: str
    command_id: str
    worker_instance_id: str
    result_json: str
    result_ref_json: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., outcome: _Optional[_Union[AttemptOutcome, str]] = ..., failure_class: _Optional[str] = ..., outcome_hash: _Optional[str] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ..., result_json: _Optional[str] = ..., result_ref_json: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "step_id", "run_id", "tenant_id", "number", "state", "dispatched_at", "lease_id", "fencing_token", "holder", "outcome", "outcome_hash", "failure_class", "settled_at", "settled_by", "progress_seq")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_HASH_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    SETTLED_AT_FIELD_NUMBER: _ClassVar[int]
    SETTLED_BY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SEQ_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    step_id: str
    run_id: str
    tenant_id: str
    number: int
    state: str
    dispatched_at: _timestamp_pb2.Timestamp
    lease_id: str
    fencing_token: int
    holder: str
    outcome: str
    outcome_hash: str
    failure_class: str
    settled_at: _timestamp_pb2.Timestamp
    settled_by: str
    progress_seq: int
    def __init__(self, attempt_id: _Optional[str] = ..., step_id: _Optional[str] = ..., run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., number: _Optional[int] = ..., state: _Optional[str] = ..., dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., holder: _Optional[str] = ..., outcome: _Optional[str] = ..., outcome_hash: _Optional[str] = ..., failure_class: _Optional[str] = ..., settled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., settled_by: _Optional[str] = ..., progress_seq: _Optional[int] = ...) -> None: ...

class ReportAttemptOutcomeResponse(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ...) -> None: ...

class RequestApprovalRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "action_class", "proposal_hash", "command_id", "worker_instance_id", "proposal_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    action_class: str
    proposal_hash: str
    command_id: str
    worker_instance_id: str
    proposal_json: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., action_class: _Optional[str] = ..., proposal_hash: _Optional[str] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ..., proposal_json: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "run_id", "step_id", "attempt_id", "tenant_id", "action_class", "proposal_hash", "policy_revision", "approver_rule", "required_approvals", "requested_by", "created_at", "expires_at", "state", "decided_by", "decided_at", "reason", "version")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_HASH_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    APPROVER_RULE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    run_id: str
    step_id: str
    attempt_id: str
    tenant_id: str
    action_class: str
    proposal_hash: str
    policy_revision: str
    approver_rule: str
    required_approvals: int
    requested_by: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    state: str
    decided_by: str
    decided_at: _timestamp_pb2.Timestamp
    reason: str
    version: int
    def __init__(self, approval_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., action_class: _Optional[str] = ..., proposal_hash: _Optional[str] = ..., policy_revision: _Optional[str] = ..., approver_rule: _Optional[str] = ..., required_approvals: _Optional[int] = ..., requested_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[str] = ..., decided_by: _Optional[str] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class RequestApprovalResponse(_message.Message):
    __slots__ = ("required", "approval")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    required: bool
    approval: Approval
    def __init__(self, required: _Optional[bool] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class SendSignalRequest(_message.Message):
    __slots__ = ("run_id", "name", "body_json", "command_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    body_json: str
    command_id: str
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., body_json: _Optional[str] = ..., command_id: _Optional[str] = ...) -> None: ...

class SendSignalResponse(_message.Message):
    __slots__ = ("run_id", "step_id", "name", "delivered", "state")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    name: str
    delivered: bool
    state: str
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., name: _Optional[str] = ..., delivered: _Optional[bool] = ..., state: _Optional[str] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id", "after_seq", "include_output", "after_output_position")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    AFTER_OUTPUT_POSITION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    include_output: bool
    after_output_position: int
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., include_output: _Optional[bool] = ..., after_output_position: _Optional[int] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("seq", "event_id", "type", "topic", "run_id", "tenant_id", "project_id", "step_id", "attempt_id", "correlation_id", "causation_id", "producer", "schema_version", "occurred_at", "payload_json", "output")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    event_id: str
    type: str
    topic: str
    run_id: str
    tenant_id: str
    project_id: str
    step_id: str
    attempt_id: str
    correlation_id: str
    causation_id: str
    producer: str
    schema_version: int
    occurred_at: _timestamp_pb2.Timestamp
    payload_json: str
    output: RunOutput
    def __init__(self, seq: _Optional[int] = ..., event_id: _Optional[str] = ..., type: _Optional[str] = ..., topic: _Optional[str] = ..., run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., step_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., causation_id: _Optional[str] = ..., producer: _Optional[str] = ..., schema_version: _Optional[int] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., payload_json: _Optional[str] = ..., output: _Optional[_Union[RunOutput, _Mapping]] = ...) -> None: ...

class RunOutput(_message.Message):
    __slots__ = ("position", "attempt_id", "step_id", "seq", "text", "data_json", "written_at")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_AT_FIELD_NUMBER: _ClassVar[int]
    position: int
    attempt_id: str
    step_id: str
    seq: int
    text: str
    data_json: str
    written_at: _timestamp_pb2.Timestamp
    def __init__(self, position: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ..., data_json: _Optional[str] = ..., written_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ProgressMessage(_message.Message):
    __slots__ = ("seq", "text", "payload_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    payload_json: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "messages", "command_id", "worker_instance_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    messages: _containers.RepeatedCompositeFieldContainer[ProgressMessage]
    command_id: str
    worker_instance_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[ProgressMessage, _Mapping]]] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("acked_seq", "stored", "duplicates", "attempt_id", "gap_at")
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GAP_AT_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    stored: int
    duplicates: int
    attempt_id: str
    gap_at: int
    def __init__(self, acked_seq: _Optional[int] = ..., stored: _Optional[int] = ..., duplicates: _Optional[int] = ..., attempt_id: _Optional[str] = ..., gap_at: _Optional[int] = ...) -> None: ...

class ClaimToolCallRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "call_id", "request_hash", "command_id", "worker_instance_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    call_id: str
    request_hash: str
    command_id: str
    worker_instance_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., call_id: _Optional[str] = ..., request_hash: _Optional[str] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ...) -> None: ...

class CompleteToolCallRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "call_id", "result_hash", "command_id", "worker_instance_id", "result_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    call_id: str
    result_hash: str
    command_id: str
    worker_instance_id: str
    result_json: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., call_id: _Optional[str] = ..., result_hash: _Optional[str] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class ConsumeRateLimitRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "name", "units", "command_id", "worker_instance_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    name: str
    units: float
    command_id: str
    worker_instance_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., name: _Optional[str] = ..., units: _Optional[float] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ...) -> None: ...

class HandBackAttemptRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "reason", "command_id", "worker_instance_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    reason: str
    command_id: str
    worker_instance_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., reason: _Optional[str] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("seq", "text", "data_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    data_json: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class AppendOutputRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "chunks", "command_id", "worker_instance_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    chunks: _containers.RepeatedCompositeFieldContainer[OutputChunk]
    command_id: str
    worker_instance_id: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[OutputChunk, _Mapping]]] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ...) -> None: ...

class AppendOutputResponse(_message.Message):
    __slots__ = ("attempt_id", "acked_seq", "stored", "duplicates")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    acked_seq: int
    stored: int
    duplicates: int
    def __init__(self, attempt_id: _Optional[str] = ..., acked_seq: _Optional[int] = ..., stored: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class HandBackAttemptResponse(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ...) -> None: ...

class RecordCallRequest(_message.Message):
    __slots__ = ("run_id", "attempt_id", "lease_id", "fencing_token", "name", "occurrence", "value_json", "error_json", "read_only", "command_id", "worker_instance_id", "request_hash")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_JSON_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    lease_id: str
    fencing_token: int
    name: str
    occurrence: int
    value_json: str
    error_json: str
    read_only: bool
    command_id: str
    worker_instance_id: str
    request_hash: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., name: _Optional[str] = ..., occurrence: _Optional[int] = ..., value_json: _Optional[str] = ..., error_json: _Optional[str] = ..., read_only: _Optional[bool] = ..., command_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ..., request_hash: _Optional[str] = ...) -> None: ...

class RecordCallResponse(_message.Message):
    __slots__ = ("name", "occurrence", "value_hash", "bytes", "recorded_at", "recorded", "value_json", "error_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_HASH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    occurrence: int
    value_hash: str
    bytes: int
    recorded_at: _timestamp_pb2.Timestamp
    recorded: bool
    value_json: str
    error_json: str
    def __init__(self, name: _Optional[str] = ..., occurrence: _Optional[int] = ..., value_hash: _Optional[str] = ..., bytes: _Optional[int] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recorded: _Optional[bool] = ..., value_json: _Optional[str] = ..., error_json: _Optional[str] = ...) -> None: ...

class ConsumeRateLimitResponse(_message.Message):
    __slots__ = ("name", "bucket", "units", "at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    bucket: str
    units: float
    at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., bucket: _Optional[str] = ..., units: _Optional[float] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ToolCallResponse(_message.Message):
    __slots__ = ("tool_call_id", "call_id", "status", "result_hash", "error", "result_json")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_HASH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    call_id: str
    status: str
    result_hash: str
    error: str
    result_json: str
    def __init__(self, tool_call_id: _Optional[str] = ..., call_id: _Optional[str] = ..., status: _Optional[str] = ..., result_hash: _Optional[str] = ..., error: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class SessionCredit(_message.Message):
    __slots__ = ("claim_id", "worker_instance_id", "agent_ids", "resent")
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESENT_FIELD_NUMBER: _ClassVar[int]
    claim_id: str
    worker_instance_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    resent: bool
    def __init__(self, claim_id: _Optional[str] = ..., worker_instance_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., resent: _Optional[bool] = ...) -> None: ...

class SessionCommand(_message.Message):
    __slots__ = ("acquire_lease", "report_attempt_outcome", "request_approval", "report_progress", "claim_tool_call", "complete_tool_call", "consume_rate_limit", "hand_back_attempt", "record_call", "append_output")
    ACQUIRE_LEASE_FIELD_NUMBER: _ClassVar[int]
    REPORT_ATTEMPT_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    REPORT_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    CONSUME_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    HAND_BACK_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECORD_CALL_FIELD_NUMBER: _ClassVar[int]
    APPEND_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    acquire_lease: AcquireLeaseRequest
    report_attempt_outcome: ReportAttemptOutcomeRequest
    request_approval: RequestApprovalRequest
    report_progress: ReportProgressRequest
    claim_tool_call: ClaimToolCallRequest
    complete_tool_call: CompleteToolCallRequest
    consume_rate_limit: ConsumeRateLimitRequest
    hand_back_attempt: HandBackAttemptRequest
    record_call: RecordCallRequest
    append_output: AppendOutputRequest
    def __init__(self, acquire_lease: _Optional[_Union[AcquireLeaseRequest, _Mapping]] = ..., report_attempt_outcome: _Optional[_Union[ReportAttemptOutcomeRequest, _Mapping]] = ..., request_approval: _Optional[_Union[RequestApprovalRequest, _Mapping]] = ..., report_progress: _Optional[_Union[ReportProgressRequest, _Mapping]] = ..., claim_tool_call: _Optional[_Union[ClaimToolCallRequest, _Mapping]] = ..., complete_tool_call: _Optional[_Union[CompleteToolCallRequest, _Mapping]] = ..., consume_rate_limit: _Optional[_Union[ConsumeRateLimitRequest, _Mapping]] = ..., hand_back_attempt: _Optional[_Union[HandBackAttemptRequest, _Mapping]] = ..., record_call: _Optional[_Union[RecordCallRequest, _Mapping]] = ..., append_output: _Optional[_Union[AppendOutputRequest, _Mapping]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("code", "message", "status_details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    status_details: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., status_details: _Optional[bytes] = ...) -> None: ...

class SessionAnswer(_message.Message):
    __slots__ = ("command_id", "acquire_lease", "report_attempt_outcome", "request_approval", "report_progress", "claim_tool_call", "complete_tool_call", "error", "consume_rate_limit", "hand_back_attempt", "record_call", "append_output")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_LEASE_FIELD_NUMBER: _ClassVar[int]
    REPORT_ATTEMPT_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    REPORT_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONSUME_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    HAND_BACK_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECORD_CALL_FIELD_NUMBER: _ClassVar[int]
    APPEND_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    acquire_lease: AcquireLeaseResponse
    report_attempt_outcome: ReportAttemptOutcomeResponse
    request_approval: RequestApprovalResponse
    report_progress: ReportProgressResponse
    claim_tool_call: ToolCallResponse
    complete_tool_call: ToolCallResponse
    error: SessionError
    consume_rate_limit: ConsumeRateLimitResponse
    hand_back_attempt: HandBackAttemptResponse
    record_call: RecordCallResponse
    append_output: AppendOutputResponse
    def __init__(self, command_id: _Optional[str] = ..., acquire_lease: _Optional[_Union[AcquireLeaseResponse, _Mapping]] = ..., report_attempt_outcome: _Optional[_Union[ReportAttemptOutcomeResponse, _Mapping]] = ..., request_approval: _Optional[_Union[RequestApprovalResponse, _Mapping]] = ..., report_progress: _Optional[_Union[ReportProgressResponse, _Mapping]] = ..., claim_tool_call: _Optional[_Union[ToolCallResponse, _Mapping]] = ..., complete_tool_call: _Optional[_Union[ToolCallResponse, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., consume_rate_limit: _Optional[_Union[ConsumeRateLimitResponse, _Mapping]] = ..., hand_back_attempt: _Optional[_Union[HandBackAttemptResponse, _Mapping]] = ..., record_call: _Optional[_Union[RecordCallResponse, _Mapping]] = ..., append_output: _Optional[_Union[AppendOutputResponse, _Mapping]] = ...) -> None: ...

class SessionGrant(_message.Message):
    __slots__ = ("claim_id", "lease", "results_json", "deadline_at", "calls")
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_JSON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    claim_id: str
    lease: Lease
    results_json: str
    deadline_at: _timestamp_pb2.Timestamp
    calls: _containers.RepeatedCompositeFieldContainer[JournaledCall]
    def __init__(self, claim_id: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., results_json: _Optional[str] = ..., deadline_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., calls: _Optional[_Iterable[_Union[JournaledCall, _Mapping]]] = ...) -> None: ...

class JournaledCall(_message.Message):
    __slots__ = ("run_id", "step_id", "name", "occurrence", "tenant_id", "attempt_id", "fencing_token", "value_hash", "bytes", "recorded_at", "value_json", "error_json", "request_hash")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_HASH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    name: str
    occurrence: int
    tenant_id: str
    attempt_id: str
    fencing_token: int
    value_hash: str
    bytes: int
    recorded_at: _timestamp_pb2.Timestamp
    value_json: str
    error_json: str
    request_hash: str
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., name: _Optional[str] = ..., occurrence: _Optional[int] = ..., tenant_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., value_hash: _Optional[str] = ..., bytes: _Optional[int] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., value_json: _Optional[str] = ..., error_json: _Optional[str] = ..., request_hash: _Optional[str] = ...) -> None: ...

class ExchangeRequest(_message.Message):
    __slots__ = ("host", "session_id", "credits", "commands", "acks", "wait_seconds", "seq")
    HOST_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    host: int
    session_id: str
    credits: _containers.RepeatedCompositeFieldContainer[SessionCredit]
    commands: _containers.RepeatedCompositeFieldContainer[SessionCommand]
    acks: _containers.RepeatedScalarFieldContainer[str]
    wait_seconds: float
    seq: int
    def __init__(self, host: _Optional[int] = ..., session_id: _Optional[str] = ..., credits: _Optional[_Iterable[_Union[SessionCredit, _Mapping]]] = ..., commands: _Optional[_Iterable[_Union[SessionCommand, _Mapping]]] = ..., acks: _Optional[_Iterable[str]] = ..., wait_seconds: _Optional[float] = ..., seq: _Optional[int] = ...) -> None: ...

class ExchangeReply(_message.Message):
    __slots__ = ("answers", "grants", "cancels", "backlog", "hosts", "draining", "host_targets")
    class BacklogEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HOST_TARGETS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[SessionAnswer]
    grants: _containers.RepeatedCompositeFieldContainer[SessionGrant]
    cancels: _containers.RepeatedScalarFieldContainer[str]
    backlog: _containers.ScalarMap[str, int]
    hosts: int
    draining: bool
    host_targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, answers: _Optional[_Iterable[_Union[SessionAnswer, _Mapping]]] = ..., grants: _Optional[_Iterable[_Union[SessionGrant, _Mapping]]] = ..., cancels: _Optional[_Iterable[str]] = ..., backlog: _Optional[_Mapping[str, int]] = ..., hosts: _Optional[int] = ..., draining: _Optional[bool] = ..., host_targets: _Optional[_Iterable[str]] = ...) -> None: ...
