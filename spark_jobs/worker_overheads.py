"""Two costs a PySpark worker pays around every task, whatever the task does, kept out of its way.

**Zips re-read before every task.** PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task (after adding the
task's ``pyFiles``), and on Python 3.11 and older ``zipimporter.invalidate_caches`` re-reads the
archive's whole central directory at once. Spark puts ``pyspark.zip`` (thousands of entries) and the
py4j zip on every worker's path, so each task of a Python writer paid ~0.1-0.2 s of CPU before its
first row: in a profile of the streaming publisher, half of its Python workers' CPU. Python 3.12
made the re-read lazy (CPython gh-103200); this module does the same for the zips already on the
path, in the worker that imports it: an archive is read again only when its size or modification
time changed, so a ``pyFiles`` zip replaced under the same name is still seen.

**A full garbage collection after every task.** A reused worker runs ``gc.collect()`` after each
task, and a full collection walks every object the process tracks: pyspark's, pyarrow's and
confluent-kafka's modules, classes and functions, hundreds of thousands of objects that never die
(~16% of a streaming publisher's worker thread in a profile). :func:`freeze_startup_objects` moves
what is alive at the worker's first task into the permanent generation (``gc.freeze()``), so the
collections after each task walk only what tasks allocated since. Reference counting still frees
frozen objects; only cycles among them would never be collected, so the freeze happens once per
process, after a collection, when what is alive is the worker's imports and one task's set-up.
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport

_STAMP = "_eosink_stamp"


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class ChangedOnlyZipImporter(zipimport.zipimporter):
    """A ``zipimporter`` whose ``invalidate_caches`` re-reads the archive only when the file changed."""

    def invalidate_caches(self) -> None:
        stamp = _stamp(self.archive)
        if stamp is None or stamp != getattr(self, _STAMP, None):
            super().invalidate_caches()
            setattr(self, _STAMP, stamp)


_frozen = False


def freeze_startup_objects() -> bool:
    """Once per process: collect, then exclude every surviving object from later collections."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True


def install() -> None:
    """Both, in the calling worker; cheap after the first call, so every task may call it."""
    lazy_zip_caches()
    freeze_startup_objects()


def lazy_zip_caches() -> int:
    """Make this process's zip importers re-read only changed archives; returns how many it changed.

    Idempotent and cheap (a dictionary walk). A no-op where the
    interpreter's own ``zipimporter`` is already lazy (3.12 and later).
    """
    if sys.version_info >= (3, 12):
        return 0
    changed = 0
    for finder in list(sys.path_importer_cache.values()):
        if type(finder) is zipimport.zipimporter:
            setattr(finder, _STAMP, _stamp(finder.archive))
            finder.__class__ = ChangedOnlyZipImporter
            changed += 1
    return changed
