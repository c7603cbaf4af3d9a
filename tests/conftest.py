"""Every test runs with its own temporary home and caches, and fails if it reaches the real home.

HOME and the XDG folders point into a fresh temporary folder per test (TOPOPLAN_CACHE is unset) (not tmp_path, whose
contents some tests list), so no test reads the user's model cache (~/.cache/topoplan/models) or leaves
anything there, and child processes inherit the same. home_guard.py watches this process's file accesses.
"""

from __future__ import annotations

import home_guard
import pytest

home_guard.install()
CACHE_VARS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for name in CACHE_VARS:
        monkeypatch.setenv(name, str(home / f".{name[4:-5].lower()}"))
    monkeypatch.delenv("TOPOPLAN_CACHE", raising=False)  # the user's own cache folder, if set, is not ours
    before = len(home_guard.touched)
    yield home
    reached = home_guard.touched[before:]
    del home_guard.touched[before:]
    if reached:
        pytest.fail(f"the test reached the real home ({home_guard.REAL_HOME}): "
                    + ", ".join(f"{event} {path}" for event, path in reached[:5]), pytrace=False)
