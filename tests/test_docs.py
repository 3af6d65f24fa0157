"""Every test the repository's text names exists: docs cite tests as proof of a claim
(docs/security.md's *Tests:*), and a test that moved or was renamed leaves the claim unproven.

A test file is named by its path from the root (`tests/system/test_runc.py`), in docs and
docstrings alike; in a doc `path::name` names a test in it, and a `::name` that follows
names another one of the last file named."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PATH = re.compile(r"(?<![\w/.])tests/(?:\w+/)*test_\w+\.py")
BARE = re.compile(r"(?<![\w/.])test_\w+\.py")
NAMED = re.compile(r"(?<![\w/.])((?:\w+/)*test_\w+\.py)|(?<![\w:])::(\w+)")


def tracked() -> dict[str, str]:
    """The repository's Markdown and Python files, by path."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {path: (REPO / path).read_text() for path in listed if (REPO / path).is_file()}


def defined(source: str) -> set[str]:
    """The module-level functions and classes of a test file."""
    body = ast.parse(source).body
    return {node.name for node in body if isinstance(node, ast.FunctionDef | ast.ClassDef)}


def stale(files: dict[str, str], unread: str = "") -> list[str]:
    """Each reference to a test file or test that is not there, as `file:line: what`, in
    every file but `unread`."""
    found = []
    for path, text in files.items():
        if path == unread:
            continue
        wrong = [
            (m, f"no test file {m.group()}") for m in PATH.finditer(text) if m.group() not in files
        ]
        if path.endswith(".md"):
            wrong += [
                (m, f"{m.group()} named without its path (tests/...)") for m in BARE.finditer(text)
            ]
            last = None
            for m in NAMED.finditer(text):
                if m.group(1):
                    last = m.group(1)
                elif last not in files:
                    wrong.append((m, f"::{m.group(2)} follows no test file"))
                elif m.group(2) not in defined(files[last]):
                    wrong.append((m, f"no test {last}::{m.group(2)}"))
        found += [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {what}" for m, what in wrong]
    return found


def test_every_test_the_repository_names_exists() -> None:
    examples = Path(__file__).relative_to(REPO).as_posix()  # this file's, made up
    assert stale(tracked(), unread=examples) == []


def test_a_moved_or_renamed_test_is_found() -> None:
    files = {
        "tests/test_a.py": "def test_one() -> None: ...\n",
        "docs/a.md": "Proof: `tests/test_a.py::test_one`, `::test_two`\n"
        "and `tests/system/test_b.py`, `test_a.py`.\n",
        "docs/b.md": "`::test_one` alone\n",
        "gpuwire/a.py": '"""Tested by tests/test_c.py; `::0` names no test."""\n',
    }
    assert stale(files) == [
        "docs/a.md:2: no test file tests/system/test_b.py",
        "docs/a.md:2: test_a.py named without its path (tests/...)",
        "docs/a.md:1: no test tests/test_a.py::test_two",
        "docs/b.md:1: ::test_one follows no test file",
        "gpuwire/a.py:1: no test file tests/test_c.py",
    ]
