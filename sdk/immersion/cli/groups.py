"""The click group class of every ``immersion`` command group (errors as one line)."""

from __future__ import annotations

from typing import Any

import click

from ..errors import ImmersionError


class CommandGroup(click.Group):
    """A click group that turns the SDK's own errors into a one-line message and exit code 2.

    Errors of the machine (a file that cannot be written, memory that cannot be had) get a
    one-line message and exit code 1; anything else is a bug and keeps its traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImmersionError as exc:
            raise click.UsageError(str(exc)) from None
        except (OSError, MemoryError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
