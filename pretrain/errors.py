"""The one exception type for bad user input.

Anything raised as UserError is printed by the CLI as a single line on stderr with exit
code 2 and no traceback. The message must say what is wrong and what was expected.
"""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a recipe field): a one-line message."""
