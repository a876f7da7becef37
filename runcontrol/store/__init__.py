"""PostgreSQL persistence: tables, migrations, tenant-scoped connections, the write path."""

from .commit import DuplicateSubmission, Store
from .database import APP_ROLE, SYSTEM_ROLE, Database
from .group import GroupCommit

__all__ = ["APP_ROLE", "SYSTEM_ROLE", "Database", "DuplicateSubmission", "GroupCommit", "Store"]
