"""Workspace paths: tools reach every file inside the root and nothing outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kwrl.tools import ToolError
from kwrl.tools.apps import Filesystem
from kwrl.tools.paths import relative, resolve


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "Reports").mkdir(parents=True)
    (workspace / "Reports" / "q3.md").write_text("revenue 45.5\n")
    (tmp_path / "secret.txt").write_text("password hunter2\n")
    return workspace


def test_a_relative_path_inside_the_root_resolves_to_the_real_file(root: Path) -> None:
    assert resolve(root, "Reports/q3.md") == (root / "Reports" / "q3.md").resolve()
    assert resolve(root, "Reports/../Reports/q3.md", kind="file").name == "q3.md"
    assert resolve(root, ".", kind="dir") == root.resolve()


@pytest.mark.parametrize("rel", ["../secret.txt", "Reports/../../secret.txt", ".."])
def test_dot_dot_that_climbs_out_of_the_root_is_refused(root: Path, rel: str) -> None:
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve(root, rel)


@pytest.mark.parametrize("rel", ["/etc/passwd", "~/secret.txt", "~"])
def test_absolute_and_home_paths_are_refused(root: Path, rel: str) -> None:
    with pytest.raises(ToolError, match="absolute; use a path relative"):
        resolve(root, rel)


def test_a_symlink_planted_in_the_workspace_that_points_outside_is_refused(root: Path) -> None:
    os.symlink(root.parent / "secret.txt", root / "innocent.txt")
    os.symlink(root.parent, root / "up")
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve(root, "innocent.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve(root, "up/secret.txt")


def test_a_symlink_that_stays_inside_the_workspace_is_allowed(root: Path) -> None:
    os.symlink(root / "Reports" / "q3.md", root / "latest.md")
    assert resolve(root, "latest.md") == (root / "Reports" / "q3.md").resolve()
    assert relative(root, root / "Reports" / "q3.md") == "Reports/q3.md"


def test_missing_files_and_wrong_kinds_are_errors_that_say_what_to_do(root: Path) -> None:
    with pytest.raises(ToolError, match="does not exist; list the folder"):
        resolve(root, "Reports/q4.md")
    with pytest.raises(ToolError, match="is a folder, not a file"):
        resolve(root, "Reports", kind="file")
    # A write may name a folder that does not exist yet: the caller creates it, inside the root.
    assert resolve(root, "Nope/x.md", must_exist=False) == root.resolve() / "Nope" / "x.md"
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve(root, "Nope/../../x.md", must_exist=False)
    with pytest.raises(ToolError, match="NUL"):
        resolve(root, "a\x00b")


def test_the_filesystem_app_refuses_the_same_paths(root: Path) -> None:
    fs = Filesystem(root)
    os.symlink(root.parent / "secret.txt", root / "innocent.txt")
    for rel in ("../secret.txt", "/etc/passwd", "~/secret.txt", "innocent.txt"):
        with pytest.raises(ToolError):
            fs.read(rel)
    assert "revenue 45.5" in fs.read("Reports/q3.md")


def test_walking_tools_skip_a_planted_link_out_of_the_workspace(root: Path) -> None:
    os.symlink(root.parent / "secret.txt", root / "innocent.txt")
    os.symlink(root.parent, root / "up")
    fs = Filesystem(root)
    assert "hunter2" not in fs.search("password")
    assert "no matches" in fs.search("password")
    listing = fs.list_files(".") + fs.tree(".") + fs.find("*")
    assert "innocent.txt" not in listing and "up/" not in listing
    assert "Reports/q3.md" in fs.find("*")
