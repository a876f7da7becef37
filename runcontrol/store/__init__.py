"""PostgreSQL persistence: tables, migrations, tenant-scoped connections, the unit of work."""

from .database import APP_ROLE, SYSTEM_ROLE, Database
from .uow import DuplicateSubmission, UnitOfWork

__all__ = ["APP_ROLE", "SYSTEM_ROLE", "Database", "DuplicateSubmission", "UnitOfWork"]
