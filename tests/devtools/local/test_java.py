from __future__ import annotations

import stat
from pathlib import Path

import pytest

from millstream.devtools.local.java import find_java, parse_java_major
from millstream.engine.errors import JavaNotFoundError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "25" 2025-09-16', 25),
        ('openjdk version "21.0.2" 2024-01-16 LTS', 21),
    ],
)
def test_parse_java_major(output: str, major: int) -> None:
    assert parse_java_major(output) == major


def _fake_java(folder: Path, version: str) -> Path:
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2025-01-01' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return java


def test_java_home_with_java_17_is_used(tmp_path: Path) -> None:
    java = _fake_java(tmp_path, "17.0.9")
    runtime = find_java({"JAVA_HOME": str(tmp_path), "PATH": ""})
    assert (runtime.executable, runtime.major) == (java, 17)


def test_wrong_java_version_says_which_and_what_to_do(tmp_path: Path) -> None:
    _fake_java(tmp_path, "25.0.1")
    with pytest.raises(JavaNotFoundError, match=r"is Java 25.*Set JAVA_HOME to a JDK 17"):
        find_java({"JAVA_HOME": str(tmp_path), "PATH": ""})


def test_missing_java_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(JavaNotFoundError, match=r"Java is not installed.*openjdk-17"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(JavaNotFoundError, match="has no bin/java"):
        find_java({"JAVA_HOME": str(tmp_path / "nowhere"), "PATH": ""})
