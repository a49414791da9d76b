"""Repository-level pytest configuration: skip modules whose optional extra is not installed, and
run BLAS on the calling thread.

OpenBLAS's worker threads were seen spinning forever inside ``numpy.linalg.qr`` called from a
Flower server thread while Ray started its processes (a whole-suite run, twice; never alone), so
the tests, and the processes they start, use one BLAS thread. The library itself sets nothing.
"""

import importlib.util
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # subprocesses: Ray workers, CLI runs
try:
    from threadpoolctl import threadpool_limits
except ImportError:  # threadpoolctl comes with scikit-learn (extra fl)
    pass
else:
    _BLAS_ON_THE_CALLING_THREAD = threadpool_limits(limits=1, user_api="blas")

collect_ignore = (
    []
    if importlib.util.find_spec("flwr")
    else ["plugins/immersion_fl/flower/app.py", "plugins/immersion_fl/flower/native.py"]
)
