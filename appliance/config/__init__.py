"""Gateway configuration: one TOML or JSON file, validated with errors that name the field path."""

from appliance.config.errors import ConfigError
from appliance.config.load import GatewayConfig, load_config

__all__ = ["ConfigError", "GatewayConfig", "load_config"]
