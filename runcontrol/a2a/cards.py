"""A workflow's agent card: what its newest release opts into (``domain.agent``), with the
API's bearer JWT as its one security scheme and the bindings this service mounts."""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import TransportProtocol

from ..domain.agent import AgentExposure

PROTOCOL_VERSION = "1.0"
BEARER = "bearer"  # the scheme's name in the card
PREFIX = "/a2a/{workflowId}"  # an agent's routes
JSONRPC_PATH = "/jsonrpc"
REST_PATH = "/rest"
RUN_TASK_EXTENSION = "https://runcontrol.dev/a2a/run-task/v1"
MEDIA_TYPES = ["text/plain", "application/json"]


@dataclass(frozen=True, slots=True)
class Agent:
    """A workflow exposed as an agent in the caller's tenant: the release it is (the
    workflow's newest) and what that release says of it."""

    workflow_id: str
    release_id: str
    exposure: AgentExposure


def agent_card(agent: Agent, url: str, *, extended: bool = False) -> AgentCard:
    """The card of the agent at ``url`` (``.../a2a/{workflowId}``); ``extended``
    (GetExtendedAgentCard, for an authenticated caller) adds the release it is and its input
    mapping."""
    exposure = agent.exposure
    card = AgentCard(
        name=exposure.name,
        description=exposure.description,
        version=agent.release_id,
        provider=AgentProvider(organization="runcontrol", url=url),
        supported_interfaces=[
            AgentInterface(
                url=f"{url}{JSONRPC_PATH}",
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION,
            ),
            AgentInterface(
                url=f"{url}{REST_PATH}",
                protocol_binding=TransportProtocol.HTTP_JSON.value,
                protocol_version=PROTOCOL_VERSION,
            ),
        ],
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=True, extended_agent_card=True
        ),
        security_schemes={
            BEARER: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="JWT",
                    description="The API's OAuth2 bearer JWT (claims tid, pid, sub, roles, "
                    "scope); the tenant is the JWT's.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList(list=[])})],
        default_input_modes=MEDIA_TYPES,
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(
                id=s.skill_id,
                name=s.name,
                description=s.description,
                tags=list(s.tags),
                examples=list(s.examples),
            )
            for s in exposure.skills
        ],
    )
    if extended:
        extension = AgentExtension(
            uri=RUN_TASK_EXTENSION,
            description="The task is a run: its input is the message's parts through this "
            "mapping; a task waiting for input asks for a signal or an approval decision.",
            required=False,
        )
        extension.params.update(
            {
                "workflowId": agent.workflow_id,
                "releaseId": agent.release_id,
                "modelProfileId": exposure.model_profile_id,
                "input": exposure.input.to_dict(),
            }
        )
        card.capabilities.extensions.append(extension)
    return card
