"""The affine immersion of seed 002 (Proposition 1, eqs. 16-18) and its variants.

:mod:`.factory`: :func:`~immersion.immerse` and :func:`~immersion.draw_keys`, the one
float/modular dispatch above both variants. :mod:`.design`: :class:`~immersion.Design`, the
dimensions and options checked once, and the noise design's targets. :mod:`.keygen`: the random
streams and the key geometry. :mod:`.handle`: the user side (float64 or torch),
:mod:`.modular`: the integer variant modulo ``2^64``. :mod:`.target` and :mod:`.target_codes`:
the cloud side (eq. 17). :mod:`.probing`: the user's ``f`` and ``g`` checked on first call.
:mod:`.rotation`, :mod:`.key_pool`, :mod:`.noise_blocks`: fresh keys and noise drawn ahead of
time. The public names are re-exported by :mod:`immersion`.
"""
