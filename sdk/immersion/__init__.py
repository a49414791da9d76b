"""immersion: privacy in cloud computing through immersion-based coding (seed 002 and follow-ups).

Examples
--------
>>> import numpy as np
>>> from immersion import immerse
>>> imm = immerse(lambda x, y: 0.5 * x + y, lambda x, y: 2.0 * x, n_state=1, n_input=1,
...               n_output=1, rng=0)
>>> imm.report().epsilon_input <= 1e-3 * (1 + 1e-12)
True
"""

from .coding.design import Design
from .coding.factory import Immersion, TargetAlgorithm, draw_keys, immerse
from .errors import (
    ImmersionError,
    InvalidArgumentError,
    KeyFileError,
    NonFiniteError,
    OptionalDependencyError,
    PluginError,
    PrecisionError,
)
from .keys import Keys, NoiseLaw, load_keys, save_keys
from .privacy import PrivacyReport
from .systems import immerse_system

__version__ = "0.1.0"

__all__ = [
    "immerse",
    "immerse_system",
    "draw_keys",
    "Design",
    "Immersion",
    "TargetAlgorithm",
    "Keys",
    "NoiseLaw",
    "load_keys",
    "save_keys",
    "PrivacyReport",
    "ImmersionError",
    "InvalidArgumentError",
    "NonFiniteError",
    "PrecisionError",
    "KeyFileError",
    "OptionalDependencyError",
    "PluginError",
    "__version__",
]
