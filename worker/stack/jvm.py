"""JVM servers from Maven Central: resolve a pom's jars once into a cache, find ``java``.

The cache key is the pom's content hash, so editing a pom resolves afresh and an unchanged pom
never runs Maven again (the ``.complete`` marker is written only after a full copy). A first run
prints what it resolves and an elapsed-time line every ~10 s on stderr, as Maven is quiet here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

from eosink.worker.stack import proc
from eosink.worker.stack.errors import ComponentError
from eosink.worker.stack.gotools import run_with_progress

POM_DIR = Path(__file__).resolve().parent / "jvm"
MAVEN_TIMEOUT_S = 600

# Two Mavens writing one ~/.m2 at once can corrupt a half-downloaded artifact: take turns,
# within this process (threads) and across processes (flock).
_maven_turn = threading.Lock()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eosink" / "jvm"


def java(component: str) -> str:
    """Path of ``java``: ``$JAVA_HOME/bin/java`` if set, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ComponentError(
            component,
            "`java` was not found on PATH (and JAVA_HOME is not set); install a JRE 17+, "
            "e.g. `apt-get install -y openjdk-17-jre-headless`",
            None,
        )
    return found


def classpath(name: str, component: str) -> str:
    """The ``-cp`` value for the jars of ``jvm/<name>/pom.xml``, resolving them on first use."""
    return str(resolve_jars(name, component) / "*")


def resolve_jars(name: str, component: str) -> Path:
    """Directory holding every jar of the pom; runs ``mvn dependency:copy-dependencies`` if needed."""
    pom = POM_DIR / name / "pom.xml"
    try:
        digest = hashlib.sha1(pom.read_bytes()).hexdigest()[:12]
    except OSError as e:
        raise ComponentError(component, f"cannot read its pom {pom}: {e}", None) from None
    target = cache_root() / f"{name}-{digest}"
    complete = target / ".complete"
    if complete.exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ComponentError(
            component,
            f"`mvn` was not found on PATH; it is needed once to fetch the jars of {pom} "
            "(`apt-get install -y maven`)",
            None,
        )
    with _maven_turn, proc.file_lock(cache_root() / ".maven.lock"):
        if complete.exists():  # another process resolved it while we waited
            return target
        target.mkdir(parents=True, exist_ok=True)
        argv = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom),
                "dependency:copy-dependencies", f"-DoutputDirectory={target}"]
        # Silent for up to minutes otherwise: say what runs, then how long it has been running.
        done = run_with_progress(argv, None, f"resolving {name} jars with Maven (first run only)", component,
                                 sys.stderr, timeout_s=MAVEN_TIMEOUT_S)
        if done.returncode != 0 or not any(target.glob("*.jar")):
            output = proc.strip_ansi(done.stdout + done.stderr)
            tail = "\n".join(output.splitlines()[-20:])
            raise ComponentError(
                component,
                f"Maven failed to resolve {pom} (exit {done.returncode}; command: {' '.join(argv)})",
                None,
                tail,
            )
        complete.touch()
    return target
