"""Benchmark programs and their renderer: python -m lab.benchmarks.NAME (run, gpu, agents, synth_speed, report)."""
