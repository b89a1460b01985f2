"""`python -m gradcompiler.bench [options]`: the same as `gradcompiler bench`."""

import sys

from .suite import main

sys.exit(main())
