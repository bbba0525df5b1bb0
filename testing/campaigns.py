"""How many examples a property campaign runs: its own count under ``make test``, a capped one under
``make check``.

In hypothesis an explicit ``settings(max_examples=...)`` outranks the loaded profile, so the ``check``
profile alone shortened only the properties that had no count of their own - and the long campaigns
(200-500 examples over the topic tree, the retained store, the codecs) were what made the unit layer slow.
Campaigns therefore take their settings from `campaign`, which keeps the count a test asks for unless the
``check`` profile is loaded. ``make test`` runs every campaign in full; ``make check`` is the inner loop.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings

CHECK_PROFILE = "check"
CHECK_MAX_EXAMPLES = 20

settings.register_profile(CHECK_PROFILE, max_examples=CHECK_MAX_EXAMPLES)


def campaign(max_examples: int, **options: Any) -> settings:
    """Settings for a campaign of ``max_examples`` (capped under the ``check`` profile) and ``options``."""
    if settings.get_current_profile_name() == CHECK_PROFILE:
        max_examples = min(max_examples, CHECK_MAX_EXAMPLES)
    return settings(max_examples=max_examples, **options)
