"""The numpy-like build API. Everything here builds nodes; nothing runs."""

from .conv import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .math import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .shapes import *  # noqa: F401,F403
from .sources import *  # noqa: F401,F403
from .tensor import Tensor, apply, constant  # noqa: F401
from .vision import *  # noqa: F401,F403
