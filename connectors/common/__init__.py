"""Helpers shared by several connectors (durable writes, JSON Lines encoding).
"""
