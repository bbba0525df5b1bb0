"""The firmware service: answers thermostats' chunk requests, after everything else the gateway has to do.

Low priority is built from three things. Requests are queued (``ChunkQueue``: bounded, one per client) and
acknowledged at once, so ``on_publish`` never holds the broker. One worker task serves the queue one chunk
at a time, yielding to the event loop before each (``Runtime.sleep(0)``: whatever the loop has ready, such
as set point requests and their notifications, runs first). And each thermostat has at most one chunk
outstanding: it asks for the next only after the last arrived, so a fleet update puts at most one chunk per
thermostat in the broker's queues, ahead of a set point notification to that same thermostat. A full queue
refuses the request with PUBACK 0x97 (quota exceeded); the thermostat tries again later.

The envelope is every in-process service's (``appliance.broker.request_envelope``): MQTT 5, QoS 1, a
Response Topic that is a topic name, not the request topic and one the requester may itself publish to
under the broker's ACL, Correlation Data; otherwise PUBACK 0x83 (0x90 or 0x87 and a DISCONNECT for a
forbidden response topic) and no reply. The ACL is asked again when the queued reply is sent. No
``__protVer``: the thermostats do not speak the SDKs' RPC convention, and a user property costs their heap.
Anything about the payload is answered on the response topic (``-ERR``), never by silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import (
    QUOTA_EXCEEDED,
    BrokerHandle,
    InboundPublish,
    PublishVerdict,
    ServiceDefaults,
)
from appliance.broker.request_envelope import CONSUMED, EnvelopeRules, open_request, refused, respond
from appliance.firmware.protocol import (
    REQUEST_TOPIC,
    ChunkQueue,
    PendingChunk,
    RequestError,
    chunk_reply,
    error_reply,
    parse_request,
)
from appliance.firmware.repository import Repository
from appliance.runtime import Runtime

log = logging.getLogger(__name__)

#: Thermostats whose chunk requests may wait at once; more are refused (0x97) and retry.
QUEUE_LIMIT = 256
ENVELOPE = EnvelopeRules(service="the firmware service", requests="firmware requests", request_topic=REQUEST_TOPIC)


class FirmwareService(ServiceDefaults):
    topic_filters: tuple[str, ...] = (REQUEST_TOPIC,)

    def __init__(self, data_dir: Path, queue_limit: int = QUEUE_LIMIT, runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.repository = Repository(Path(data_dir) / "firmware")
        self.queue = ChunkQueue(queue_limit)
        self.served = 0  # chunks answered (a counter for tests and status)
        self._broker: BrokerHandle | None = None
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    async def start(self, broker: BrokerHandle) -> None:
        self._broker = broker
        self._worker = asyncio.get_running_loop().create_task(self._serve_forever(), name="firmware-chunks")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    def on_client_disconnected(self, client_id: str) -> None:
        self.queue.discard(client_id)  # nobody to answer; the thermostat asks again after reconnecting

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        if self._broker is None:
            raise RuntimeError("the firmware service has not been started")
        request = open_request(ENVELOPE, self._broker, message)
        if isinstance(request, PublishVerdict):
            return request
        if not self.queue.offer(message.client_id, PendingChunk(request, message.payload)):
            return refused("the firmware queue is full, try again later", QUOTA_EXCEEDED)
        self._wake.set()
        return CONSUMED

    def answer(self, payload: bytes) -> bytes:
        """The reply to one request payload (no I/O beyond the repository's file reads)."""
        try:
            request = parse_request(payload)
        except RequestError as exc:
            return error_reply(str(exc))
        data = self.repository.read(request.version, request.path)
        if data is None:
            known = request.version in self.repository.versions()
            return error_reply(f"no such file {request.path!r} in version {request.version}" if known
                               else f"unknown version {request.version}")
        return chunk_reply(data, request)

    async def _serve_forever(self) -> None:
        while True:
            if not len(self.queue):
                self._wake.clear()
                await self._wake.wait()
            await self.runtime.sleep(0)  # after whatever else the loop has ready
            item = self.queue.pop()
            if item is None or self._broker is None:
                continue
            client_id, pending = item
            try:
                reply = self.answer(pending.payload)
            except Exception:
                log.exception("firmware: failed to answer %s", client_id)
                reply = error_reply("internal error, see the gateway log")
            if respond(ENVELOPE, self._broker, pending.request, reply):
                self.served += 1
