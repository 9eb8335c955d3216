"""Lay out links to the source folders as they are imported (``ROOT/millstream/engine`` ->
``engine/``), from setup.cfg's ``package_dir``, for tools that cannot follow that mapping."""

import configparser
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(root: Path) -> None:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    shutil.rmtree(root, ignore_errors=True)
    (root / "millstream").mkdir(parents=True)
    for line in config["options"]["package_dir"].strip().splitlines():
        name, folder = (part.strip() for part in line.split("="))
        (root / name.replace(".", "/")).symlink_to(REPO / folder, target_is_directory=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
