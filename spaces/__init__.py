"""Typed configs and search spaces: pure data, no torch, no ray."""
