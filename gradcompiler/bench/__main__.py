"""`python -m gradcompiler.bench [options]`: the same as `gradcompiler bench`, through the
command-line tool, so an error (no GPU for --target cuda, say) is the same one clean line."""

import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
