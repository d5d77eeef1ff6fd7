"""The one exception type for bad user input.

Anything raised as UserError is printed by the CLI as a single line on stderr with exit
code 2 and no traceback. The message must say what is wrong and what was expected.
"""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a recipe field): a one-line message."""


def validation_message(error: dict) -> str:
    """One pydantic error's message without pydantic's own prefix ("Value error, set without
    domain_corpus" reads "set without domain_corpus"): our validators write whole sentences."""
    message = str(error.get("msg", ""))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message
