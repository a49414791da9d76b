"""The plugin system (pluggy): :mod:`.hookspecs` (what a plugin may register), :mod:`.manager`
(the registry built from the ``immersion`` entry points) and :mod:`.builtin` (the numpy and torch
backends and the core's attacks, registered like any third-party plugin).
"""
