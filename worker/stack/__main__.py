"""``python -m eosink.worker.stack up|down|status [--json] [--only COMPONENT]``."""

from eosink.worker.stack.cli import main

raise SystemExit(main())
