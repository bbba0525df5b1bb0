"""Schema of the ``[firmware]`` section: what the gateway must know to refuse a version its fleet would.

```toml
[firmware]
# The thermostats' update.key values (hex of X||Y, ECDSA P-256): a published version must carry a
# manifest.sig that one of them verifies (appliance firmware publish refuses it otherwise, unless --force).
keys = ["04ab...(128 hex digits)"]
```

Without ``keys`` the gateway does not know what the thermostats hold: it publishes what it is given, and
says so (``"verified": null``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting
from appliance.firmware.signing import SigningError, point_from_hex


@dataclass(frozen=True, slots=True)
class FirmwareConfig:
    keys: tuple[str, ...] = setting(
        (), doc="the fleet's public keys (the thermostats' update.key, hex of X||Y); publish verifies against them"
    )

    def checked(self, given: Mapping[str, Any], path: str) -> FirmwareConfig:
        for index, key in enumerate(self.keys):
            try:
                point_from_hex(key)
            except SigningError as exc:
                raise ConfigError(f"{join(path, 'keys')}[{index}]", str(exc)) from None
        return self
