"""``python -m worker.stack up|down|status [--json] [--only COMPONENT]``."""

from worker.stack.cli import main

raise SystemExit(main())
