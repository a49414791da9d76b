"""Repository-level pytest configuration: skip modules whose optional extra is not installed."""

import importlib.util

collect_ignore = (
    []
    if importlib.util.find_spec("flwr")
    else ["plugins/immersion_fl/flower_app.py", "plugins/immersion_fl/flower_native.py"]
)
