"""Restartable workflows end to end: trees, fan-out, wake-up races, scale, the docs' examples."""
