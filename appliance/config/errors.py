"""The one exception type for bad configuration.

Every validator reports the dotted path of the field it rejects (``broker.listeners[0].port``), so an
operator can find the line in a file without reading a traceback.
"""


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message
