"""``eosink spark ...``: run eosink's Spark jobs without spark-submit.

    eosink spark run <job> [--run-id ID] [--bootstrap HOST:PORT] [--master URL] [job args...]
    eosink spark jobs        list the jobs
    eosink spark jars        resolve the Kafka source/sink and spark-avro jars with Maven and print their paths

``run`` starts a SparkSession in this process (``local[*,4]`` unless ``--master`` is given: the
``,4`` lets Spark retry a failed task locally, which plain ``local[*]`` never does) and prints the
job's result as JSON. The run id is the idempotency key: running again with the same one publishes
nothing new; omit it and a new one is generated and printed.
"""

from __future__ import annotations

import importlib
import sys

from eosink.spark_jobs.jobs import ALIASES, JOBS

USAGE = "usage: eosink spark {run <job> [--run-id ID] [job args...] | jobs | jars}"
DEFAULT_LOCAL_MASTER = "local[*,4]"


def main(argv: list[str]) -> int:
    """Entry point; ``argv`` is what follows ``eosink spark`` (a leading ``spark`` is tolerated)."""
    args = list(argv)
    if args and args[0] == "spark":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() if args else USAGE, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "jobs":
        for name, module in JOBS.items():
            doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()[0]
            print(f"{name:16} {doc}")
        return 0
    if command == "jars":
        from eosink.spark_jobs.jars import resolve_jars

        for p in resolve_jars():
            print(p)
        return 0
    if command != "run":
        print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    if not rest or rest[0].startswith("-"):
        print(f"which job? one of: {', '.join(JOBS)}\n{USAGE}", file=sys.stderr)
        return 2
    name = ALIASES.get(rest[0], rest[0])
    if name not in JOBS:
        print(f"unknown job {rest[0]!r}; one of: {', '.join(JOBS)}", file=sys.stderr)
        return 2
    job_args = rest[1:]
    if "--master" not in job_args and not any(a.startswith("--master=") for a in job_args):
        job_args = ["--master", DEFAULT_LOCAL_MASTER, *job_args]
    from eosink.spark_jobs.jobs._common import main as run_job

    return run_job(importlib.import_module(JOBS[name]), job_args, prog=f"eosink spark run {name}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
