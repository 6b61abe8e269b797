"""python -m pyllm_a100.cli: how serve/rpc-worker --detach start their supervisor (pyllm _supervise DIR)."""

from .app import main

main()
