"""The leaf every subsystem's configuration builds on: ``ConfigError`` (which names the field path) and
the declarative schema (``schema``: a setting is one dataclass field, one parser builds every section).
It imports no subsystem; composing the sections into the gateway's configuration is
``appliance.gateway_config``, above them all. ``default.toml`` here is the embedded default
configuration."""

from appliance.config.errors import ConfigError

__all__ = ["ConfigError"]
