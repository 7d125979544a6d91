"""``python -m tlaunch.runtime.supervisor NODE_FILE COORDINATOR``: the package is imported once
(a module run with ``-m`` would run twice: as ``__main__``, and as the module its pickled
classes name)."""

import os
import sys

from tlaunch.runtime.supervisor import main

code = main(sys.argv[1:])
sys.stdout.flush()
os._exit(code)
