from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _tlaunch_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test's runs out of the real ~/.tlaunch."""
    monkeypatch.setenv("TLAUNCH_HOME", str(tmp_path_factory.mktemp("tlaunch-home")))
