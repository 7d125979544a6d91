"""``python -m tlaunch.runtime.supervisor NODE_FILE COORDINATOR``: the package is imported once
(a module run with ``-m`` would run twice: as ``__main__``, and as the module its pickled
classes name)."""

import os
import sys

from tlaunch.runtime import settle
from tlaunch.runtime.supervisor import main

settle()  # its imports are done: collections again (the node is forked after, from frozen pages)
code = main(sys.argv[1:])
sys.stdout.flush()
os._exit(code)
