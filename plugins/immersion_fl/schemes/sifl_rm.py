"""Random-matrix SIFL (seed 003): the algebra of SIFL M1 with that paper's key shape (``m = n + 1``:
one noise column, ``M = Pi1_left``, ``G = Pi1``) and a fresh offset each round (unit scale: the
paper gives neither a scale nor a DP analysis, so no epsilon is reported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scheme import SchemeContext

if TYPE_CHECKING:
    from .modular import ModularSiflM1


from .options import SiflOptions
from .sifl_m1 import SiflM1


def sifl_rm_scheme(options: SiflOptions, context: SchemeContext) -> SiflM1 | ModularSiflM1:
    """Random-matrix SIFL (seed 003): ``m = n + 1``, a fresh offset each round; float: unit
    scale and no DP figures; modular: uniform noise (per-element epsilon 0).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM1

        return ModularSiflM1(options, context, name="sifl-rm", default_extra=1)
    return SiflM1(options, context, name="sifl-rm", default_extra=1, report_dp=False)
