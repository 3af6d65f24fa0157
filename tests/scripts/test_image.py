"""`make image`'s inputs (scripts/image.py): what it hashes to tell an unchanged tree, and
that the base it makes is the one the Containerfile names. The build itself:
tests/system/test_image.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from scripts import image

REPO = Path(__file__).resolve().parents[2]


def test_the_base_made_here_is_the_one_the_containerfile_names() -> None:
    text = (REPO / "Containerfile").read_text()
    assert re.findall(r"^ARG DEBIAN=(\S+)$", text, re.M) == [image.BASE_NAME]
    assert re.findall(r"^FROM (\S+)", text, re.M)[0] == "${DEBIAN}"
    assert image.BASE.suite in image.BASE_NAME  # bookworm


def test_the_image_is_of_the_packages_version() -> None:
    text = (REPO / "Containerfile").read_text()
    assert set(re.findall(r"^ARG GPUWIRE_VERSION=(\S+)$", text, re.M)) == {image.package_version()}


def test_the_copied_sources_are_the_copy_lines_sources() -> None:
    containerfile = """FROM x AS build
COPY a.toml b.txt ./
COPY --from=build /opt /opt
COPY --chmod=0755 tool /bin/tool
COPY src \\
     src
"""
    assert image.copied_sources(containerfile) == ["a.toml", "b.txt", "tool", "src"]


def test_a_change_to_a_copied_file_changes_the_inputs_and_one_elsewhere_does_not(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Containerfile").write_text("FROM x\nCOPY src src\n")
    (repo / ".dockerignore").write_text(".git\n")
    (repo / "src").mkdir()
    (repo / "src/a.py").write_text("a = 1\n")
    (repo / "docs.md").write_text("about\n")
    git = shutil.which("git")
    assert git is not None
    subprocess.run([git, "init", "-q", str(repo)], check=True)
    before = image.inputs(repo, "base-1")
    (repo / "docs.md").write_text("about, more\n")
    assert image.inputs(repo, "base-1") == before
    (repo / "src/a.py").write_text("a = 2\n")
    changed = image.inputs(repo, "base-1")
    assert changed != before
    (repo / "src/a.py").chmod(0o755)  # a mode the image keeps
    assert image.inputs(repo, "base-1") != changed
    assert image.inputs(repo, "base-2") != image.inputs(repo, "base-1")
