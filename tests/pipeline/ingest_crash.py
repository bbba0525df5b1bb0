"""Run the ingest in a process that dies (os._exit) at the moment it would write a message.

Used by test_ingest.py: prints "ready" once subscribed; exits with status 17 when the first message reaches
the landing writer, so that message has been received but neither written nor acknowledged.
"""

import os
import sys
import threading

from pipeline.ingest import Ingest, IngestConfig
from pipeline.landing import LandingWriter

CRASH_STATUS = 17


def die_instead_of_writing(self, kind, record):
    os._exit(CRASH_STATUS)


if __name__ == "__main__":
    host, port, landing, client_id = sys.argv[1:5]
    LandingWriter.append = die_instead_of_writing
    ingest = Ingest(IngestConfig(host=host, port=int(port), landing=landing, client_id=client_id))
    threading.Thread(target=lambda: ingest.ready.wait() and print("ready", flush=True), daemon=True).start()
    ingest.run(threading.Event())
