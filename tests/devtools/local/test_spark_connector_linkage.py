"""The Spark Kafka connector links against the token-provider jar the POM pins beside it.

The POM takes ``spark-token-provider-kafka`` from an older Spark line than the connector
(see the comment in ``connectors/pom.xml``). This test reads the JVM constant pools with
``javap``: every method and field of ``org.apache.spark.kafka010`` that the connector's classes
reference must exist, with the same descriptor, in the pinned token-provider jar.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from millstream.connectors.maven import MavenArtifacts
from millstream.engine.config import MillstreamConfig

pytestmark = pytest.mark.integration

_PACKAGE = "org/apache/spark/kafka010/"
_REFERENCE = re.compile(
    r"= (?:Methodref|InterfaceMethodref|Fieldref)\s+#\S+\s+// "
    r"(?P<owner>org/apache/spark/kafka010/[\w$]+)\.(?P<name>[\w$<>\"]+):(?P<descriptor>\S+)"
)
_MEMBER = re.compile(r"^\s+.*?(?P<name>[\w$<>]+)(?:\(.*\))?(?:\s+throws\s+.*)?;$")


def _javap(*arguments: str) -> str:
    javap = shutil.which("javap")
    assert javap is not None, "javap (part of the JDK 17 the README requires) is not on PATH"
    result = subprocess.run(
        [javap, *arguments], capture_output=True, text=True, timeout=300, check=True
    )
    return result.stdout


def _classes(jar: Path, prefix: str = "") -> list[str]:
    with zipfile.ZipFile(jar) as archive:
        return [
            name.removesuffix(".class").replace("/", ".")
            for name in archive.namelist()
            if name.endswith(".class") and name.startswith(prefix)
        ]


def _members(jar: Path) -> set[tuple[str, str, str]]:
    """(class, member name, descriptor) of every member of the jar's kafka010 classes."""
    members: set[tuple[str, str, str]] = set()
    for owner in _classes(jar, _PACKAGE):
        output = _javap("-s", "-p", "-cp", str(jar), owner).splitlines()
        simple = owner.rsplit(".", 1)[1]
        for declaration, descriptor in itertools.pairwise(output):
            match = _MEMBER.match(declaration)
            if match is None or "descriptor:" not in descriptor:
                continue
            name = match["name"]
            # javap prints constructors under the class name; the constant pool says <init>.
            name = "<init>" if name in (simple, owner) else name
            members.add((owner.replace(".", "/"), name, descriptor.split(":", 1)[1].strip()))
    return members


def test_every_kafka010_member_the_connector_uses_exists_in_the_pinned_jar(
    services: MillstreamConfig,
) -> None:
    jars = MavenArtifacts(services.home / "artifacts", print).classpath("spark-kafka")
    (connector,) = [jar for jar in jars if jar.name.startswith("spark-sql-kafka-0-10_")]
    (provider,) = [jar for jar in jars if jar.name.startswith("spark-token-provider-kafka-")]

    pool = _javap(
        "-v", "-cp", str(connector), *_classes(connector, "org/apache/spark/sql/kafka010/")
    )
    used = {
        (match["owner"], match["name"].strip('"'), match["descriptor"])
        for match in _REFERENCE.finditer(pool)
    }
    assert len(used) >= 5, "the connector should reference the token provider"
    missing = used - _members(provider)
    assert not missing, f"{provider.name} lacks members {connector.name} uses: {sorted(missing)}"
