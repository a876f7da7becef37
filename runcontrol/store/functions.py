"""The SQL functions, each written once, and the migrations that apply them by name.

Every hand-written function (and trigger function) is one file, ``store/sql/<name>.sql``,
holding its current text only: the ``CREATE OR REPLACE FUNCTION``, its grants, and the comment
that says why it is as it is. The per-table writers are rendered from ``tables.py`` by
``writers.py``.
A migration never copies a function's text: it names the functions it applies (``FUNCTIONS``:
name -> the digest of the text it applied, ``digest``) and calls ``apply``, which executes
each one's text as the sources hold it today. The baseline (0029) names them all; a later
revision names those whose text changed since the chain last recorded it.

``make sql`` (``python -m runcontrol.store.functions``) writes that revision,
``versions/NNNN_functions.py``, when a function or a table changed; ``tests/store/
test_writers.py`` fails ("run make sql") until it has been run. So a change to a function is
one diff in its file plus the generated revision; a stored column is the field, the
``Column``, the ``ALTER`` (written into the generated revision's ``upgrade``, before
``apply``) and ``make sql``.

The text applied is today's at every revision that names a function, so a database migrated
from empty ends with today's text, as one upgraded revision by revision does. ``apply`` turns
off ``check_function_bodies`` while it runs (as ``pg_dump``'s restore does): a body may name a
column a later revision adds. What is not a body is checked: the run's pins trigger
(``writers.py``) names its columns, so a new pinned column goes into the baseline's SQL too
(and ``ADD COLUMN IF NOT EXISTS`` in its own revision), or the baseline could not create it.
``CREATE OR REPLACE`` keeps a function's grants and cannot change its arguments or result: a
change of either drops the old function in the revision's ``upgrade`` before ``apply``.
"""

from __future__ import annotations

import hashlib
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData

from . import writers
from .tables import metadata

FOLDER = Path(__file__).resolve().parent / "sql"
MIGRATIONS = FOLDER.parent / "migrations"
_DOLLAR_QUOTED = re.compile(r"\$(\w*)\$(.*?)\$\1\$", re.S)


def hand_written() -> dict[str, str]:
    """The hand-written functions: name -> its file's text."""
    return {path.stem: path.read_text() for path in sorted(FOLDER.glob("*.sql"))}


def current(target: MetaData = metadata) -> dict[str, str]:
    """Every function as the sources make it today: the hand-written ones, then the writers
    ``tables.py`` renders."""
    found = hand_written()
    for unit in writers.render(target):
        if unit.name in found:
            raise ValueError(f"{unit.name} is rendered from tables.py: it has no file in sql/")
        found[unit.name] = unit.sql
    return found


def digest(text: str) -> str:
    """What a revision records of a function's text: its sha256 (the first 128 bits, hex)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def body(text: str) -> str:
    """What ``pg_proc.prosrc`` holds for the function ``text`` creates: its first
    dollar-quoted string."""
    found = _DOLLAR_QUOTED.search(text)
    if found is None:
        raise ValueError("no dollar-quoted body")
    return found.group(2)


def apply(functions: Mapping[str, str]) -> None:
    """A migration's ``upgrade``: create (or replace) the functions it names, with today's
    text. A name whose source is gone since is skipped: the revision that removed it drops
    it."""
    from alembic import op

    texts = current()
    op.execute("SET LOCAL check_function_bodies = off")
    for name in functions:
        if name in texts:
            op.execute(texts[name])
    op.execute("RESET check_function_bodies")


# ---------------------------------------------------------------------- make sql


def scripts() -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def revisions() -> list[str]:
    """The migrations' revisions, oldest first."""
    return [s.revision for s in reversed(list(scripts().walk_revisions()))]


def recorded(directory: ScriptDirectory | None = None) -> dict[str, str]:
    """Each function's digest as the revision chain last recorded it (oldest first, the
    newer recording winning)."""
    found: dict[str, str] = {}
    for script in reversed(list((directory or scripts()).walk_revisions())):
        found.update(getattr(script.module, "FUNCTIONS", {}))
    return found


def changed(target: MetaData = metadata) -> dict[str, str]:
    """The functions whose text today differs from what the chain recorded: name -> digest."""
    before = recorded()
    now = {name: digest(text) for name, text in current(target).items()}
    return {name: d for name, d in now.items() if before.get(name) != d}


REVISION = '''"""{opening}
``runcontrol/store/sql/`` and ``store/writers.py`` make them today (written by ``make sql``).
Say here what changed and why.

Revision ID: {revision}
"""

from __future__ import annotations

from runcontrol.store.functions import apply

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None

# Fail closed (store/schema.py): declare ``oldest_code = "{down}"`` when the previous release's
# documents still apply as before.

FUNCTIONS = {{
{recorded}}}


def upgrade() -> None:
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("{revision} has no downgrade: restore from a backup taken before it")
'''


def revision_text(revision: str, down: str, functions: Mapping[str, str]) -> str:
    opening = f"Functions changed since {down}: {', '.join(functions)}, applied by name as"
    return REVISION.format(
        revision=revision,
        down=down,
        opening=textwrap.fill(opening, width=96),
        recorded="".join(f'    "{name}": "{d}",\n' for name, d in functions.items()),
    )


def main(argv: Sequence[str]) -> int:
    functions = changed()
    if not functions:
        print("every function is as the revision chain applies it")
        return 0
    down = scripts().get_current_head()
    assert down is not None
    revision = f"{int(down) + 1:04d}"
    path = MIGRATIONS / "versions" / f"{revision}_functions.py"
    path.write_text(revision_text(revision, down, functions))
    print(f"{path.relative_to(FOLDER.parents[2])}: applies {', '.join(functions)}")
    print("say in its docstring what changed; an ALTER goes in its upgrade, before apply")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
