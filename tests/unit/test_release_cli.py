"""``runcontrol release`` answers bad input (a missing file, not JSON, an invalid definition)
with one line and exit 2, with or without ``--url``: nothing is sent, nothing is published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runcontrol import cli


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "is not JSON"),
        ('{"workflowId": "w", "steps": [{"agentId": "x", "dependsOn": ["ghost"]}]}', "ghost"),
    ],
)
def test_the_cli_answers_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, message: str
) -> None:
    file = tmp_path / "wf.json"
    if content is not None:
        file.write_text(content)
    for where in (["--tenant", "t"], ["--url", "http://127.0.0.1:9", "--token", "x"]):
        assert cli.main(["release", str(file), *where]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
