"""PostgreSQL persistence: tables, migrations, tenant-scoped connections, the write path."""

from .commit import DuplicateSubmission, GroupCommit, Store
from .database import APP_ROLE, SYSTEM_ROLE, Database

__all__ = ["APP_ROLE", "SYSTEM_ROLE", "Database", "DuplicateSubmission", "GroupCommit", "Store"]
