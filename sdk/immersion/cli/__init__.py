"""The ``immersion`` command (click): :mod:`.main` holds the commands, :mod:`.params` the
parameter types shared with the plugins' commands, :mod:`.docsite` the ``immersion docs`` build.
"""
