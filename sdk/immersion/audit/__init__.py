"""``immersion audit``: the known attacks on each scheme and the figures they measure.

:mod:`.runner`: runs every registered attack (:func:`~immersion.audit.runner.run_audit`).
Attacks on the core ``immerse(f, g)`` (scheme ``"immerse"``): :mod:`.eavesdropper`, an
eavesdropper on the user-cloud link who collects many encoded inputs ``y~_k = Pi1 y_k + N1 s_k``
under one key (seed 002 eq. 16), the ``subspace`` attack (PCA) and the ``known-plaintext`` attack
(least squares on a few pairs), each measured without and with key rotation
(:mod:`immersion.coding.rotation`); :mod:`.modular`, the same and a lattice attack on the modular
encoding. :mod:`.lwe`: the attacks on ``coding="lwe"``. :mod:`.specs`: their registrations.
"""
