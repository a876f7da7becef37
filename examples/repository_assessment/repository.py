"""The git work of the example, with nothing but ``git`` (offline): a sample repository, the
files at a revision, a file's content, and a commit of new files on a branch made without
touching the working tree (plumbing on a private index), so a retried commit is idempotent."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

AUTHOR = {
    "GIT_AUTHOR_NAME": "repository-assessment",
    "GIT_AUTHOR_EMAIL": "assessment@example.invalid",
    "GIT_COMMITTER_NAME": "repository-assessment",
    "GIT_COMMITTER_EMAIL": "assessment@example.invalid",
}

SAMPLE = {
    "README.md": "# sample\n\nA small project the assessment looks at.\n",
    "app/__init__.py": "",
    "app/main.py": (
        "import os, sys\n\n\n"
        "def main():\n"
        "    # TODO: parse arguments properly\n"
        "    print('hello', sys.argv[1:])\n\n\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    ),
    "app/util.py": (
        "def add(a, b):\n"
        "    return a + b\n\n\n"
        "def unused(x):\n"
        "    y = 1  # TODO: remove\n"
        "    return x\n"
    ),
    "tests/test_util.py": (
        "from app.util import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    ),
}


def git(repository: str | Path, *args: str, input: bytes | None = None, **env: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repository), *args],
        input=input,
        capture_output=True,
        check=True,
        env={**os.environ, **AUTHOR, **env},
    )
    return done.stdout.decode()


def make_sample(path: str | Path) -> str:
    """A git repository at ``path`` with the sample files committed; answers the revision."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    for name, text in SAMPLE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "sample project")
    return git(root, "rev-parse", "HEAD").strip()


def files_at(repository: str, revision: str) -> list[str]:
    return sorted(git(repository, "ls-tree", "-r", "--name-only", revision).split())


def content_at(repository: str, revision: str, path: str) -> str:
    return git(repository, "show", f"{revision}:{path}")


def branch_head(repository: str, branch: str) -> str | None:
    try:
        return git(repository, "rev-parse", "--verify", "-q", f"refs/heads/{branch}").strip()
    except subprocess.CalledProcessError:
        return None


def commit_files(
    repository: str, base: str, branch: str, files: dict[str, str], message: str
) -> str:
    """Commit ``files`` on top of ``base`` as branch ``branch``; answers the commit. Done
    already (the branch holds a commit of ``base`` with exactly these files): that commit."""
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repository, "read-tree", base, **index)
        for name, text in files.items():
            blob = git(repository, "hash-object", "-w", "--stdin", input=text.encode()).strip()
            entry = f"100644,{blob},{name}"
            git(repository, "update-index", "--add", "--cacheinfo", entry, **index)
        tree = git(repository, "write-tree", **index).strip()
    head = branch_head(repository, branch)
    if head is not None and git(repository, "rev-parse", f"{head}^{{tree}}").strip() == tree:
        return head
    commit = git(repository, "commit-tree", tree, "-p", base, "-m", message).strip()
    git(repository, "update-ref", f"refs/heads/{branch}", commit)
    return commit
