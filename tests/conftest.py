"""Shared test setup: make the library importable as ``shadowline`` (as daemons on nodes import it)."""

import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
sys.path.insert(0, str(ROOT))

# scripts/test-suite runs one stream as a background job of a non-interactive shell, which starts it with SIGINT
# ignored, and an ignored signal stays ignored in every process a test starts (a Python child then never raises
# KeyboardInterrupt: the Ctrl-C test of `shadowline status --watch` hung in CI). A handled one is reset by exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The end-to-end tests' shared fixtures (site_testbed, site_runtime), available to every test module that asks.
pytest_plugins = ["tests.e2e.site_helpers"]


@pytest.fixture(autouse=True, scope="module")
def _testbed_instance_left_as_found():  # noqa: ANN202 (a fixture)
    """SHADOWLINE_TESTBED picks the testbed instance every `testbed.py` a test starts works on: a module that leaves
    it changed sends every later module's testbed commands to its instance (CI: a lifecycle test booted instance 6
    after the drills had loaded scripts/bench-failover). Restored, and the module that changed it named."""
    before = os.environ.get("SHADOWLINE_TESTBED")
    yield
    after = os.environ.get("SHADOWLINE_TESTBED")
    if after != before:
        if before is None:
            os.environ.pop("SHADOWLINE_TESTBED", None)
        else:
            os.environ["SHADOWLINE_TESTBED"] = before
        pytest.fail(f"the module left SHADOWLINE_TESTBED={after!r} (it was {before!r})")


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001 (pytest hook signature)
    """In CI (CI=true) a skipped test is a failure: every test must run on the CI machine."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") == "true" and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; in CI every test must run", red=True)
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ANN001, ARG001 (pytest hook signature)
    """Where the suite's time goes, by test file (setup, call and teardown summed): CI's budget is spent per file,
    since each end-to-end file boots and converges its own testbed (module fixtures)."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            where, duration = getattr(report, "nodeid", ""), getattr(report, "duration", None)
            if where and isinstance(duration, float):
                name = where.split("::")[0]
                per_file[name] = per_file.get(name, 0.0) + duration
    if len(per_file) < 2:
        return
    terminalreporter.write_sep("=", "time by test file (the 15 slowest)")
    for name, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f} s  in all ({len(per_file)} files)")
