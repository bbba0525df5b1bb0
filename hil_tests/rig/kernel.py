"""The kernel's side of a `LinkSettings`: the tc and nftables commands both kernel backends run.

The netns backend (a veth pair it creates) and the bridge backend (two interfaces it is given) shape the
same way, so the commands are built once, here: ``tc tbf`` on an interface's egress for RATE, and one
nftables table that drops packets arriving on the shaped interfaces for LOSS and DOWN. Only the table's
family and hooks differ: a namespace end delivers locally (``inet``/``input``), a bridge forwards
(``bridge``/``forward``, plus ``input`` for what the bridge delivers to the rig's own relay).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import LinkSettings

# tbf's queue holds a time's worth of bytes at the rate, like a modem's buffer (``--queue-s``, default 1 s).
# It is sized by time alone, never by a byte floor: a 15 kB floor was 12.6 s of queue at 9.6 kbit/s, which
# tail-dropped new connections' SYNs behind a bulk flow for seconds. The limit counts the burst too, and the
# burst is never below one frame, so a frame always fits.
DEFAULT_QUEUE_SECONDS = 1.0
# nft's numgen draws below this modulus: LOSS has a resolution of 1e-7 percent.
LOSS_MODULUS = 1_000_000_000


class BackendError(RuntimeError):
    """A kernel command failed; the message names the command and carries its stderr."""


class KernelShaping:
    """What both kernel backends do on a settings change: bring the kernel from the settings in force to the
    new ones (``_apply``, theirs), undo a half-applied change as far as the kernel lets them, and leave to
    the relay, when there is one, only what the kernel cannot do here (delay and jitter: no netem)."""

    _applied: LinkSettings
    _relay: Relay | None

    async def _apply(self, old: LinkSettings, new: LinkSettings) -> None:
        raise NotImplementedError

    async def apply(self, settings: LinkSettings) -> None:
        """Bring qdiscs and drop rules to ``settings``; on failure restore the previous settings and raise."""
        previous = self._applied
        try:
            await self._apply(previous, settings)
        except BackendError:
            with contextlib.suppress(BackendError):
                await self._apply(settings, previous)
            raise
        self._applied = settings
        if self._relay is not None:
            self._relay.apply(LinkSettings(delay_ms=settings.delay_ms, jitter_ms=settings.jitter_ms))


async def run_command(*argv: str, stdin: bytes | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate(stdin)
    if process.returncode != 0:
        raise BackendError(f"{' '.join(argv)}: {err.decode(errors='replace').strip() or f'exit {process.returncode}'}")
    return out.decode()


def tbf_limit(settings: LinkSettings, queue_s: float = DEFAULT_QUEUE_SECONDS) -> int:
    """Bytes tbf may hold: the burst plus ``queue_s`` at the rate."""
    return settings.burst_bytes + int(settings.rate_bps / 8 * queue_s)


def tbf_arguments(settings: LinkSettings, queue_s: float = DEFAULT_QUEUE_SECONDS) -> list[str]:
    """The ``tbf ...`` tail of a ``tc qdisc replace dev X root`` command for a shaped ``settings``."""
    limit = tbf_limit(settings, queue_s)
    return ["tbf", "rate", f"{settings.rate_bps}bit", "burst", str(settings.burst_bytes), "limit", str(limit)]


def drop_rules(table: str, family: str, hooks: Sequence[str], interfaces: Sequence[str], settings: LinkSettings) -> str:
    """An nft script that replaces ``table`` in one transaction (add+delete makes it idempotent): in each of
    ``hooks`` it drops every packet (DOWN) or a LOSS share of the packets arriving on ``interfaces``."""
    names = ", ".join(f'"{name}"' for name in interfaces)
    match = f"iifname {{ {names} }}"
    if not settings.up:
        rule = f"{match} drop"
    elif settings.loss_pct:
        threshold = round(settings.loss_pct / 100 * LOSS_MODULUS)
        rule = f"{match} numgen random mod {LOSS_MODULUS} < {threshold} drop"
    else:
        rule = ""
    chains = "".join(
        f"  chain {hook} {{\n"
        f"    type filter hook {hook} priority 0; policy accept;\n"
        f"    {rule}\n"
        f"  }}\n"
        for hook in hooks
    )
    return f"add table {family} {table}\ndelete table {family} {table}\ntable {family} {table} {{\n{chains}}}\n"


async def delete_table(family: str, table: str, namespace_exec: Sequence[str] = ()) -> None:
    """Remove ``table`` if it exists (add+delete in one transaction never fails on a missing one)."""
    script = f"add table {family} {table}\ndelete table {family} {table}\n".encode()
    await run_command(*namespace_exec, "nft", "-f", "-", stdin=script)
