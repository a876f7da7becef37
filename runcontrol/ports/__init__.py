"""What other bounded contexts provide, as Protocols, each with an embedded Postgres default."""

from .budget import Budget, EmbeddedBudget
from .capacity import Capacity, EmbeddedCapacity
from .policy import EmbeddedPolicyStore, PolicyStore
from .releases import EmbeddedReleaseRegistry, ReleaseRegistry

__all__ = [
    "Budget",
    "Capacity",
    "EmbeddedBudget",
    "EmbeddedCapacity",
    "EmbeddedPolicyStore",
    "EmbeddedReleaseRegistry",
    "PolicyStore",
    "ReleaseRegistry",
]
