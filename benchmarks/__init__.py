"""Throughput comparisons (run as modules, never as tests)."""
