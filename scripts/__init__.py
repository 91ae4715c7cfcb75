"""Command-line entry points: run them as files (python scripts/NAME.py).

A package, so that `scripts._quiet`, imported first by each, is found in this checkout.
"""
