"""``python -m tpusim``: the command line."""

from tpusim.cli import main

raise SystemExit(main())
