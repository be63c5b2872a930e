"""Readiness gates for users' CI: budgets over a run's report (budgets.py), JUnit XML (junit.py), and the
pytest plugin (plugin.py, the ``pytest11`` entry point ``tpusim``). ``tpusim check`` and the plugin share
budgets.py so a budget means the same thing on the command line and in a test."""
