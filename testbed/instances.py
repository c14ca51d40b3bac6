"""Another testbed instance in the same process: testbed/testbed.py loaded again, bound to that instance."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


def load_testbed(instance: int | str) -> ModuleType:
    """testbed/testbed.py bound to one testbed instance, as a module of its own.

    The testbed reads SHADOWLINE_TESTBED once, when its package is imported (testbed/names.py); test directories
    that need their own instance (so that their hosts and deployments never meet another directory's) load their
    own copy of the whole package with this, under the name _shadowline_testbed_<i>, and the whole suite still
    runs in one pytest session. Returns that copy's testbed.py (the package's one namespace).
    """
    package = f"_shadowline_testbed_{instance}"
    facade = f"{package}.testbed"
    if facade in sys.modules:
        return sys.modules[facade]
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(package, here / "__init__.py", submodule_search_locations=[str(here)])
    assert spec is not None and spec.loader is not None
    saved = os.environ.get("SHADOWLINE_TESTBED")
    os.environ["SHADOWLINE_TESTBED"] = str(instance)
    sys.modules[package] = importlib.util.module_from_spec(spec)  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(sys.modules[package])
        return importlib.import_module(facade)
    except BaseException:
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        raise
    finally:
        if saved is None:
            del os.environ["SHADOWLINE_TESTBED"]
        else:
            os.environ["SHADOWLINE_TESTBED"] = saved
