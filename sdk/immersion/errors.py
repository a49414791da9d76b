"""Exceptions raised by the SDK.

Every error that comes from bad input names the offending argument, so that a user
reading the message knows what to change.
"""

from __future__ import annotations


class ImmersionError(Exception):
    """Base class of every error raised on purpose by this SDK."""


class InvalidArgumentError(ImmersionError, ValueError):
    """An argument has the wrong type, shape, range or value.

    Parameters
    ----------
    argument : str
        Name of the offending argument, as the user wrote it (kept as ``self.argument``).
    message : str
        What was expected and what was given; the error reads ``"argument: message"``.

    Examples
    --------
    >>> str(InvalidArgumentError("steps", "expected an integer >= 1, got 0"))
    'steps: expected an integer >= 1, got 0'
    """

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {message}")


class NonFiniteError(InvalidArgumentError):
    """An array contains NaN or inf where finite numbers are required."""


class PrecisionError(ImmersionError, ValueError):
    """The requested privacy cannot be decoded within the requested tolerance.

    Parameters
    ----------
    message : str
        The error message.
    smallest_feasible_epsilon_input, smallest_feasible_epsilon_output : float
        The smallest per-element epsilons (same ratio as requested) whose predicted
        decode error meets the tolerance for the chosen dtype (kept as attributes).
    """

    def __init__(
        self,
        message: str,
        *,
        smallest_feasible_epsilon_input: float,
        smallest_feasible_epsilon_output: float,
    ) -> None:
        self.smallest_feasible_epsilon_input = smallest_feasible_epsilon_input
        self.smallest_feasible_epsilon_output = smallest_feasible_epsilon_output
        super().__init__(message)


class KeyFileError(ImmersionError):
    """A key file is missing, truncated, tampered with or of the wrong kind."""


class OptionalDependencyError(ImmersionError, ImportError):
    """An optional dependency (an extra) is needed but not installed.

    Parameters
    ----------
    package : str
        The missing package, as pip names it.
    extra : str
        The extra of ``immersion-coding`` that installs it.
    purpose : str
        What needs it (the message starts with it).

    Examples
    --------
    >>> message = str(OptionalDependencyError("torch", "torch", "the torch backend"))
    >>> message.startswith("the torch backend needs"), message.endswith("'immersion-coding[torch]'")
    (True, True)
    """

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package '{package}'. "
            f"Install it with: pip install 'immersion-coding[{extra}]'"
        )


class PluginError(ImmersionError):
    """A plugin could not be registered (for example a duplicate name)."""


class ImmersionSecurityWarning(UserWarning):
    """A setting that voids the protection a coding otherwise claims (emitted once per process).

    Today: a seeded ``rng`` with ``coding="lwe"`` (:func:`immersion.lwe.encrypt_controller`),
    whose whole security is the secrecy of a key derived from that seed; a small integer seed can
    be guessed. Seeds are for tests and reproducible benchmarks; leave ``rng`` out (OS entropy)
    or pass ``secure=True`` for real use. Silence it where a seed is deliberate with
    ``warnings.filterwarnings("ignore", category=ImmersionSecurityWarning)``.

    Examples
    --------
    >>> issubclass(ImmersionSecurityWarning, UserWarning)
    True
    """
