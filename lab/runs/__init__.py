"""The GPU runs, each a program: python -m lab.runs.NAME (the stage loop and re-exec helpers in stages.py)."""
