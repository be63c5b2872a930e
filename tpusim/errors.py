"""The one exception type for bad user input.

The CLI prints a ``TpusimError`` as a single line and exits with code 2, so a user
who mistypes a topology or a chip sees what is wrong and what is accepted, never a
traceback from our internals.
"""


class TpusimError(ValueError):
    """Bad input a user can fix: the message says what is wrong and what is accepted."""
