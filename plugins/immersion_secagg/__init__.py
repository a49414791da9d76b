"""Secure aggregation as a source of differential privacy (seed 001), and how to top it up.

Registers the federated schemes ``sgd-dp``, ``gsgd-dp`` and ``gd-dp`` and the command
``immersion dp secagg``.
"""
from __future__ import annotations
