"""Packages are discovered, never listed: every package under each folder that setup.cfg's
``package_dir`` maps onto ``millstream.*`` (a new subpackage ships without a line here)."""

import configparser
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def package_dirs() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(HERE / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)  # type: ignore[misc]


def packages(dirs: dict[str, str]) -> list[str]:
    found = []
    for name, folder in dirs.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    return sorted(found)


DIRS = package_dirs()
setup(package_dir=DIRS, packages=packages(DIRS))
