"""``python -m tpusim``: the command line."""

import gc

from tpusim.cli.main import main

code = main()
# a run's trace and timelines are millions of objects: the collections Python runs at exit took seconds of the
# 10 s a container gives after SIGTERM (issue 44); frozen, they are left to the process's end
gc.freeze()
raise SystemExit(code)
