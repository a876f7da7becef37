"""What other bounded contexts provide, as Protocols, each with an embedded Postgres default."""

from .budget import Budget
from .capacity import Capacity
from .policy import EmbeddedPolicyStore, PolicyStore
from .releases import EmbeddedReleaseRegistry, ReleaseRegistry

__all__ = [
    "Budget",
    "Capacity",
    "EmbeddedPolicyStore",
    "EmbeddedReleaseRegistry",
    "PolicyStore",
    "ReleaseRegistry",
]
