"""The lab's tests: the product tests' fixtures and helpers (tests/conftest.py, which also makes ``import lab`` find
this checkout while ``pyllm_a100`` still comes from the installed package and its build)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pyllm_tests_conftest", REPO / "tests" / "conftest.py")
_shared = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _shared
_spec.loader.exec_module(_shared)
globals().update({name: value for name, value in vars(_shared).items() if not name.startswith("__")})
