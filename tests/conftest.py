"""Shared test setup: make the library importable as ``shadowline`` (as daemons on nodes import it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
sys.path.insert(0, str(ROOT))
