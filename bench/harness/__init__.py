"""Measurement machinery shared by every benchmarked system."""
