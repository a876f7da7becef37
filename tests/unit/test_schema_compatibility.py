"""The rule of a rolling upgrade (``runcontrol/store/schema.py``): which code runs on which
schema, decided from the revisions a release ships and what the database records."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from runcontrol.store.database import MIGRATIONS
from runcontrol.store.schema import SchemaMismatch, SchemaVersion, check, oldest_code

SHIPPED = ("0013", "0014", "0015", "0016", "0019")


def test_code_runs_on_its_own_schema_and_on_a_newer_one_that_keeps_it():
    check(SHIPPED, SchemaVersion("0019", "0016"))
    check(SHIPPED, SchemaVersion("0020", "0019"))
    check(SHIPPED, SchemaVersion("0021", "0016"))  # the marker is a revision this code ships


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (SchemaVersion(None, None), "at revision unknown .* migrate it first"),
        (SchemaVersion("0016", None), "at revision 0016, and this release needs 0019: migrate"),
        (SchemaVersion("0020", "0020"), "at revision 0020, which needs code at 0020 or newer"),
        (SchemaVersion("0020", None), "at revision 0020, which needs newer code"),
    ],
)
def test_every_other_schema_is_refused_in_one_line_that_names_the_fix(found, says):
    with pytest.raises(SchemaMismatch, match=says) as refused:
        check(SHIPPED, found)
    assert "\n" not in str(refused.value)
    assert "runcontrol migrate" in str(refused.value) or "new release" in str(refused.value)


def _chain(folder: Path, declared: dict[str, str | None]) -> ScriptDirectory:
    """A migration folder of empty revisions, each declaring ``oldest_code`` or not."""
    versions = folder / "versions"
    versions.mkdir(parents=True)
    (folder / "env.py").write_text("")
    (folder / "script.py.mako").write_text("")
    down = None
    for rev, oldest in declared.items():
        lines = [f"revision = {rev!r}", f"down_revision = {down!r}"]
        if oldest is not None:
            lines.append(f"oldest_code = {oldest!r}")
        (versions / f"{rev}_m.py").write_text("\n".join(lines) + "\n")
        down = rev
    cfg = Config()
    cfg.set_main_option("script_location", str(folder))
    return ScriptDirectory.from_config(cfg)


def test_the_marker_is_the_newest_declaration_along_the_chain_and_never_moves_back(tmp_path):
    scripts = _chain(tmp_path, {"a": None, "b": "a", "c": None, "d": "b", "e": "d"})
    # b keeps a's code; c keeps none; d declares b, but c already needs c's code; e keeps d's.
    assert [oldest_code(scripts, r) for r in "abcde"] == ["a", "a", "c", "c", "d"]


def test_a_declaration_must_name_a_revision(tmp_path):
    scripts = _chain(tmp_path, {"a": None, "b": "0016"})
    with pytest.raises(ValueError, match="oldest_code '0016' is not a revision"):
        oldest_code(scripts, "b")


def test_the_shipped_chain_declares_what_its_docstrings_say():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    scripts = ScriptDirectory.from_config(cfg)
    # The baseline (0029, the squashed 0001..0029) declares nothing: it keeps no older code.
    assert oldest_code(scripts, "0029") == "0029"
