"""Clients of a running cluster: the ``eosink`` command line and the REST client it uses.
"""
