"""Reads result files and writes tables, figures and reports (no ray)."""
