"""`python -m pyllm_a100 …` is `pyllm …`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
