"""``python -m tpusim``: the command line."""

from tpusim.cli.main import main

raise SystemExit(main())
