"""tlaunch's pickler: code pickled by value keeps the file it came from."""

from __future__ import annotations

import pickle
import sys
import types

import cloudpickle

from tlaunch.pickling import dumps


def test_code_pickled_by_value_keeps_its_file_name(tmp_path) -> None:
    """cloudpickle 3.1.3 renames it ``<dynamic-code>``: tracebacks then lose their source lines."""
    source = tmp_path / "user_helpers.py"
    source.write_text("def fails():\n    raise ValueError('from the helper')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import user_helpers

        cloudpickle.register_pickle_by_value(user_helpers)
        try:
            data = dumps(user_helpers.fails)
        finally:
            cloudpickle.unregister_pickle_by_value(user_helpers)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_helpers", None)
    fails = pickle.loads(data)
    assert isinstance(fails, types.FunctionType) and fails.__module__ == "user_helpers"
    assert fails.__code__.co_filename == str(source)
