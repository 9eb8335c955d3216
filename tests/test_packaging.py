"""The package installs whole: the sdist and the wheel built from it carry every module, and
in a fresh virtualenv every module imports and every command of the CLI answers ``--help``."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]

# Walks every millstream package from where it is installed and imports each module; prints
# each module's file. The deprecated aliases warn, which is what they are for.
IMPORT_EVERY_MODULE = """
import importlib, pkgutil, warnings
warnings.simplefilter("ignore", DeprecationWarning)
import millstream
for info in pkgutil.walk_packages(millstream.__path__, "millstream."):
    module = importlib.import_module(info.name)
    print(info.name, module.__file__)
"""


def package_dirs() -> dict[str, Path]:
    """setup.cfg's ``package_dir``: each top-level package and the folder it is in."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    return {
        name.strip(): REPO / folder.strip() for name, folder in (line.split("=") for line in lines)
    }


def installed_packages() -> list[str]:
    return sorted(package_dirs())


def _sources() -> set[str]:
    """The modules of the checkout, as import names."""
    names = set()
    for package, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join((package, *parts)))
    return names


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist of the checkout, and the wheel built from that sdist (not from the checkout,
    so that a file missing from the sdist is missing from the wheel too)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", out, REPO],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (sdist,) = out.glob("millstream-*.tar.gz")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, sdist],
        check=True,
        timeout=600,
    )
    (wheel,) = out.glob("millstream-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, built: tuple[Path, Path]) -> Path:
    """A new virtualenv with the wheel installed. Its dependencies come from the test's own
    environment through a path file (plain paths: that environment's own path files, the
    editable install of the checkout among them, are not run)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", built[1]],
        check=True,
        timeout=300,
    )
    return venv


def test_the_sdist_and_the_wheel_carry_every_module_and_file(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in in_wheel
        if name.endswith(".py")
    }
    assert _sources() == modules
    for data in (
        "millstream/engine/py.typed",
        "millstream/spark/py.typed",
        "millstream/connectors/pom.xml",
        "millstream/connectors/maven-settings.xml",
        "millstream/connectors/log4j2.properties",
        "millstream/devtools/local/kafka-tools-log4j2.properties",
        "millstream/schemas/envelope.avsc",
        "millstream/ui/assets/index.html",
        "millstream/ui/assets/app.js",
        "millstream/ui/assets/style.css",
    ):
        assert data in in_wheel, f"{data} missing from {wheel.name}"
    assert not any(name.startswith(("engine/", "connectors/", "tests/")) for name in in_wheel)
    with tarfile.open(sdist) as archive:
        in_sdist = archive.getnames()
    assert any(name.endswith("/setup.py") for name in in_sdist)


def test_every_module_imports_from_a_fresh_virtualenv(fresh_venv: Path) -> None:
    result = subprocess.run(
        [fresh_venv / "bin" / "python", "-c", IMPORT_EVERY_MODULE],
        cwd=fresh_venv,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    imported = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert set(imported) == _sources()
    outside = [name for name, file in imported.items() if not file.startswith(str(fresh_venv))]
    assert not outside, f"imported from outside the virtualenv: {outside}"


def test_every_command_answers_help_from_a_fresh_virtualenv(fresh_venv: Path) -> None:
    millstream = fresh_venv / "bin" / "millstream"
    top = subprocess.run(
        [millstream, "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    (choices,) = re.findall(r"\{([a-z,]+)\}", top)[:1]
    commands = choices.split(",")
    assert {"up", "run", "produce", "tail", "watermarks", "state", "prove"} <= set(commands)
    for command in commands:
        result = subprocess.run(
            [millstream, command, "--help"], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"millstream {command} --help: {result.stderr}"
        assert f"usage: millstream {command}" in result.stdout
