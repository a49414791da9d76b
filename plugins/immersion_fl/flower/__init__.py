"""Federated learning on Flower (extra: fl): the SDK runner as Flower apps (:mod:`.engine`, the
deployment app :mod:`.app`), the strategy wrapper and client mod for a Flower app of the user's
own (:mod:`.native`), and TLS certificates and SuperNode keys (:mod:`.tls`).
"""
