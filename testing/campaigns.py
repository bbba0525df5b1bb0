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

SUITE_PROFILE = "suite"
CHECK_PROFILE = "check"
CHECK_MAX_EXAMPLES = 20

# No per-example deadline: hypothesis' default (200 ms of wall time per example) is a real-time bound, and
# on a loaded machine it failed properties that hold (a 35 ms example took 280 ms at load 20). What an
# example may cost is judged where it matters, by the tests that measure it (bytecodes, budgets).
settings.register_profile(SUITE_PROFILE, deadline=None)
settings.register_profile(CHECK_PROFILE, parent=settings.get_profile(SUITE_PROFILE), max_examples=CHECK_MAX_EXAMPLES)
settings.load_profile(SUITE_PROFILE)  # ``--hypothesis-profile=check`` loads the other one after this import


def campaign(max_examples: int, **options: Any) -> settings:
    """Settings for a campaign of ``max_examples`` (capped under the ``check`` profile) and ``options``."""
    if settings.get_current_profile_name() == CHECK_PROFILE:
        max_examples = min(max_examples, CHECK_MAX_EXAMPLES)
    return settings(max_examples=max_examples, **options)
