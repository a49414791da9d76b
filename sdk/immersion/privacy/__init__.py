"""Privacy (per-element DP of seeds 002 and 000), composition, and the precision model."""

from .accounting import compose_gaussian, compose_laplace
from .design import design_noise
from .precision import PrecisionPrediction, predict_decode_error
from .report import GUARANTEE, PrivacyReport, privacy_report
from .theorems import gaussian_epsilon, gaussian_min_sigma_bar, laplace_epsilon, laplace_scale_for

__all__ = [
    "PrivacyReport",
    "privacy_report",
    "design_noise",
    "predict_decode_error",
    "PrecisionPrediction",
    "compose_laplace",
    "compose_gaussian",
    "laplace_epsilon",
    "laplace_scale_for",
    "gaussian_epsilon",
    "gaussian_min_sigma_bar",
    "GUARANTEE",
]
