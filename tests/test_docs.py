"""The README and the getting-started page work as written.

A newcomer copies the README's commands; a command that drifted from the CLI, a config file that
moved or a link to a page that is gone is the first thing they meet. So the five-minute path is run
here exactly as the two pages show it (one block, the same on both), against the real stack, and its
output is checked; the set-up commands are checked against the Makefile; every relative link of the
README must name a file (the site's own links are checked by ``mkdocs build --strict`` in ``make test``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)


def quickstart(page: Path) -> str:
    """The page's five-minute block: the one that registers the quickstart connector."""
    found = [b for b in bash_blocks(page) if "configs/quickstart/orders.json" in b]
    assert len(found) == 1, f"{page}: expected one five-minute block, found {len(found)}"
    return found[0]


def test_the_readme_fits_on_a_screen_or_two():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_and_the_getting_started_page_show_the_same_two_commands_and_path():
    first = bash_blocks(README)[0]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()] == ["make demo", "make test"]
    assert first in bash_blocks(GETTING_STARTED)
    assert quickstart(README) == quickstart(GETTING_STARTED)


@pytest.mark.parametrize("target", ["demo", "test", "docs"])
def test_every_make_target_the_pages_name_exists(target):
    dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr


def test_every_relative_link_of_the_readme_names_a_file():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" in target:
            continue
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"


@pytest.mark.spark
def test_the_five_minute_path_runs_as_written(stack):
    """Publish 10,000 orders from Spark, start a worker, register the connector, wait, count; then the same
    run again publishes nothing. The block runs in bash with -e: any command that fails fails the test."""
    assert stack.postgres_dsn == "postgresql://eosink@127.0.0.1:15432/eosink", "the block names the stack's default DSN"
    block = quickstart(README)
    script = "set -euo pipefail\ntrap 'kill ${WORKER:-} 2>/dev/null || true' EXIT\n" + block
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ORDERS_DB_URL")}
    try:
        run = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    finally:
        log = REPO / "worker.log"
        worker_log = log.read_text()[-3000:] if log.exists() else ""
        log.unlink(missing_ok=True)
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}\n" \
                                f"worker.log:\n{worker_log}"
    assert re.search(r"^\s*10000 \|\s*10000\s*$", run.stdout, re.M), run.stdout
    assert '"status": "already_published"' in run.stdout  # the second run of r1
    assert "lag" in run.stdout and '"state":"RUNNING"' in run.stdout.replace(" ", "")
