"""The JVM jars for Spark's Kafka source/sink and spark-avro, resolved from Maven Central with Maven.

Spark's ``spark.jars.packages`` resolves through Ivy, which does not see the Maven settings and
mirrors of every network; ``mvn dependency:copy-dependencies`` on the pom shipped in
``spark_jobs/jvm/pom.xml`` does, and the jars are then passed to Spark by path (``spark.jars``).
The pom lists exactly the jars pyspark does not ship (see its comments), so the cache holds
nothing that could clash with pyspark's own classpath.

Cache: ``${XDG_CACHE_HOME:-~/.cache}/eosink/jvm/spark-<sha1(pom)[:12]>/`` with a ``.complete``
marker written last; a change to the pom resolves into a new directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from eosink.connectors.api.errors import FatalError


class JarResolutionError(FatalError):
    """Maven could not resolve the jars (offline, or the pom is broken); names the command."""


def pom_path() -> Path:
    return Path(str(resources.files("spark_jobs") / "jvm" / "pom.xml"))


def cache_dir(pom: Path | None = None) -> Path:
    pom = pom or pom_path()
    digest = hashlib.sha1(pom.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "eosink" / "jvm" / f"spark-{digest}"


def resolve_jars(pom: Path | None = None, timeout_s: float = 600.0) -> list[Path]:
    """Paths of the jars, resolving them with Maven on first use (race-safe: build, then rename)."""
    pom = pom or pom_path()
    target = cache_dir(pom)
    if (target / ".complete").exists():
        return sorted(target.glob("*.jar"))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    cmd = [
        shutil.which("mvn") or "mvn",
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
    except (OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise JarResolutionError(f"cannot run {' '.join(cmd)}: {e}", component="spark-jars") from None
    if proc.returncode != 0 or not list(tmp.glob("*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise JarResolutionError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(tail), component="spark-jars"
        )
    (tmp / ".complete").write_text("\n".join(sorted(p.name for p in tmp.glob("*.jar"))) + "\n")
    try:
        os.rename(tmp, target)
    except OSError:  # another process won the race; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(target.glob("*.jar"))
