"""The audit: a connector's sinks read back, each by itself, and counted against its outbox.

:mod:`.source` reads the outbox read_committed, :mod:`.tally` counts one sink against it,
:mod:`.run` ties them to the decision log, :mod:`.render` prints the report. The sinks' side is
the contract :mod:`eosink.connectors.api.audit`.
"""
