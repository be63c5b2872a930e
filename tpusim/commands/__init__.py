"""One module per ``python -m tpusim`` subcommand: ``add_parser(subparsers)`` and ``run(args)``."""
