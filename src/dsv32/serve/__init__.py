"""``dsv32 serve``: an OpenAI-compatible HTTP server over a local model, with V3.2 reasoning and tool
calls and continuous batching.

- :mod:`~dsv32.serve.protocol` — request bodies (pydantic); :mod:`~dsv32.serve.responses` — response
  bodies and stream chunks; :mod:`~dsv32.serve.errors` — OpenAI's error JSON;
- :mod:`~dsv32.serve.runtime` — the served model and how a chat request becomes its prompt;
- :mod:`~dsv32.serve.stream` — a V3.2 completion → reasoning/content/tool-call deltas as it arrives;
  :mod:`~dsv32.serve.template_stream` — the same for a chat-template model and its tool-call parser;
- :mod:`~dsv32.serve.detok` — incremental detokenization and stop strings;
- :mod:`~dsv32.serve.scheduler` — continuous batching on one thread over
  :class:`dsv32.engine.batch.RunningBatch`; :mod:`~dsv32.serve.jobs` — a request's view of its job;
- :mod:`~dsv32.serve.app` — the FastAPI application; :mod:`~dsv32.serve.metrics` — Prometheus text;
  :mod:`~dsv32.serve.middleware` — every request counted with the status its client saw;
- :mod:`~dsv32.serve.server` — running it with uvicorn (foreground or a background thread).
"""

from dsv32.serve.app import create_app
from dsv32.serve.errors import ServeError
from dsv32.serve.runtime import ServedModel, load_served
from dsv32.serve.server import ServerThread, check_listen, free_port, serve_forever, wait_until_up
from dsv32.serve.stream import PlainStream, V32Stream
from dsv32.serve.template_stream import TemplateStream

__all__ = [
    "PlainStream",
    "ServeError",
    "ServedModel",
    "ServerThread",
    "TemplateStream",
    "V32Stream",
    "check_listen",
    "create_app",
    "free_port",
    "load_served",
    "serve_forever",
    "wait_until_up",
]
