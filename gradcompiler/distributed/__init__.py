"""Data-parallel training on Ray: `DataParallel` (data_parallel.py), the ring all-reduce
(allreduce.py) and the re-specialisation of a graph to a shard (shard.py).

Importing this package needs no Ray; building a DataParallel does, and says how to install
it (`pip install 'gradcompiler[distributed]'`) where it is missing.
"""

from ..errors import ReplicaDivergedError, ShardError, WorkerLostError  # noqa: F401
from .data_parallel import DataParallel, ReplicatedState  # noqa: F401
