"""The GPU runs, each a program: python -m lab.runs.NAME (their stage loop: lab/bench/stages.py)."""
