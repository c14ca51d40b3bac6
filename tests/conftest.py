"""Shared test setup: make the library importable as ``shadowline`` (as daemons on nodes import it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
sys.path.insert(0, str(ROOT))

# The end-to-end tests' shared fixtures (site_testbed, site_runtime), available to every test module that asks.
pytest_plugins = ["tests.e2e.site_helpers"]


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001 (pytest hook signature)
    """In CI (CI=true) a skipped test is a failure: every test must run on the CI machine."""
    import os

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") == "true" and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; in CI every test must run", red=True)
        session.exitstatus = 1
