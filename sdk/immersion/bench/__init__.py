"""Side-by-side benchmarks behind ``immersion bench`` and ``benchmarks/`` (ratios in one run).

:mod:`.core`: ``bench core`` and ``bench codec``. :mod:`.control`: ``bench control`` (encrypted
controllers, ECLib beside). :mod:`.remote`: ``bench remote`` (many plants against one server).
Not run by the test suite; the figures are saved as JSON with their commands (``docs/figures``).
"""
