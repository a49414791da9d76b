"""The SDK's one secure sum (Bonawitz et al., CCS 2017, section 4, without double masking).

:mod:`.protocol`: key agreement, pair seeds, keystreams, fixed point, masks and dropout recovery
of one round, used by every secure-aggregation scheme and engine. :mod:`.round`: the one driver
of a round's phases (advertise, upload, reveal, abort and retry, unmask) that every engine runs
over its own transport. :mod:`.prg`: AES-128 in counter mode, the one cryptographic keystream
(also expands the public vectors of :mod:`immersion.lwe`).
"""
