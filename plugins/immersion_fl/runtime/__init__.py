"""The SDK's federated runner: the server's rounds (:mod:`.engine`, :mod:`.federation`), clients
(:mod:`.client`, :mod:`.models`, :mod:`.optimizers`, :mod:`.user_model`), data (:mod:`.data`),
checkpoints (:mod:`.checkpoint`), injected faults (:mod:`.faults`) and the secure-aggregation
round on the core's secure sum (:mod:`.secure`). Schemes plug in through
:class:`immersion_fl.scheme.Scheme`; nothing here imports a scheme's module but plain FedAvg's.
"""
