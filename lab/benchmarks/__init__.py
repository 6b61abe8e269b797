"""Benchmark programs and their renderer: python -m lab.benchmarks.NAME (run, agents, report)."""
