"""The RL endpoints of ``dsv32 serve`` (vLLM's names), which make it a remote rollout engine.

- ``POST /inference/v1/generate`` — token ids in, token ids out: ``{"model", "token_ids",
  "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
  "logprobs", "return_sampling_mask", "return_routed_experts"}}`` → ``{"choices": [{"index",
  "token_ids", "logprobs": {"content": [{"token_id", "logprob"}]}, "sampling_mask",
  "routed_experts", "finish_reason"}], "usage", "weight_version"}``; the format is one typed model
  shared with the remote engine (:mod:`dsv32.engine.wire`), and the sampling bounds are those of the
  OpenAI routes. ``logprobs`` are the sampling
  log-probs (of the truncated, renormalized distribution sampled from); ``sampling_mask``: per
  generated token the ids kept by top-k/top-p (only when sampling truncates); ``routed_experts``:
  for a native MoE model, per position of the row (prompt, then generated, the last token excluded)
  and per MoE layer, the experts it was routed to. ``token_ids`` may also be a list of prompts: one
  batch, run as one :func:`dsv32.engine.generate` call seeded with ``seed``, its prompts left-padded
  to the longest with ``pad_token_id`` — the request's, else the model's pad id, else the first stop
  id, else 0; the reply's ``pad_token_id`` states which. Padding is masked out, so it changes no
  token or log-prob; its ``routed_experts`` cover every column of the batch's layout (padding
  included: the experts the padding took shape the batch's expert matmuls). A
  generate runs alone on the model: the continuous batch of the OpenAI endpoints waits for it.
- ``POST /pause?mode=abort|wait|keep`` — stop generating: ``abort`` fails the running and queued
  requests, ``wait`` stops admitting and lets the running ones finish (``timeout`` seconds, default
  600), ``keep`` holds them where they are (they continue on ``/resume``, with the weights then
  loaded). Requests arriving while paused wait for ``/resume``. ``POST /resume``; ``GET /is_paused``.
- ``POST /update_weights {"path", "weight_version"}`` — load a weight file
  (:mod:`dsv32.engine.weight_files`: every ``state_dict()`` key, checked) between two model steps;
  on a server that is not paused, it pauses (``wait``) first and resumes after.
- ``POST /update_adapter {"path", "weight_version"}`` — a trainer that trains a LoRA adapter sends
  only the adapter: a directory in peft's save format (``adapter_config.json``,
  ``adapter_model.safetensors`` with the version stamped in its metadata,
  :func:`dsv32.engine.lora.save_adapter`), merged into the served weights between two model steps
  (:class:`dsv32.engine.lora.MergedAdapters`: each adapted layer ``W₀ + α/r · B A`` from a kept copy
  of its weight before the first adapter; a layer a later adapter leaves out gets ``W₀`` back). The
  version rules are those of a weight file: the stamped version must be the request's, and
  ``/weight_info`` then reports it (``adapter`` True). A directory that is not a LoRA adapter, or
  whose tensors do not fit the served model, is a 400 naming what is wrong, and nothing changes. The
  served weights must be the trainer's base weights (start the server from the same checkpoint); a
  later full ``/update_weights`` becomes the base of the next adapter.
- ``POST /init_weight_transfer_engine {"master_address", "master_port", "backend", "timeout"}`` —
  join the trainer's two-party ``torch.distributed`` group as rank 1
  (:mod:`dsv32.engine.weight_transfer`; ``backend`` gloo or nccl, default by the model's device;
  every wait at most ``timeout`` seconds, at most 600). Returns once the group is formed; a group
  that cannot be formed in time is a 503.
- ``POST /update_weights {"weight_version", "names", "dtypes", "shapes"}`` (no ``path``) — the
  weights come over that group: the announced tensors are checked against the model's
  ``state_dict()`` (keys and shapes; a mismatch is a 400 and nothing changes), the reply
  (``{"accepted": true}``) comes at once, and the tensors the trainer then broadcasts are received
  into fresh buffers, copied into the model between two model steps (pausing as a file update does)
  and the version set. A transfer that fails or times out leaves the weights and version as they
  were, reports its error in ``/weight_info`` and closes the group (the next transfer needs a new
  ``/init_weight_transfer_engine``).
- ``GET /weight_info`` — ``{"weight_version", "path", "model", "transfer"}``: the version last
  loaded (None before any update: the weights the server started with carry no version) and the
  group's state (``backend``, ``receiving``, ``error`` of the last transfer).

The routes that change what the server does — ``/pause``, ``/resume``, ``/update_weights`` and
``/init_weight_transfer_engine`` (:data:`CONTROL_ROUTES`) — are served only when the application is
made with ``rl_routes=True`` (``dsv32 serve --enable-rl-routes``, as vLLM keeps its weight routes to
its development mode); otherwise each is a 404 whose message names the flag. The read-only ones stay:
``/inference/v1/generate`` samples as the OpenAI routes do (token ids instead of text),
``/is_paused`` and ``/weight_info`` report state. Weight files are read from the server's own
filesystem: these routes take the API key when one is set, and are meant for a trainer on the same
machine or a shared disk; a refused file's reply names the file and what is wrong with it, never its
contents. A malformed body is a 400 in OpenAI's error JSON, as on the OpenAI routes.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from fastapi import Depends, FastAPI, Query

from dsv32.dsa.hf import sparse_dsa
from dsv32.engine import generate, weight_transfer
from dsv32.engine.backends import backend_for
from dsv32.engine.lora import LoRAError, MergedAdapters, read_adapter
from dsv32.engine.weight_files import WeightFileError, load_weights
from dsv32.engine.wire import (
    ChoiceLogprobs,
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    InitTransferRequest,
    TokenLogprob,
    UpdateAdapterRequest,
    UpdateWeightsRequest,
    Usage,
    encode_topk,
    engine_top_k,
)
from dsv32.model import DeepseekV32
from dsv32.serve.errors import ServeError, invalid, unknown_model
from dsv32.serve.protocol import check_text
from dsv32.serve.runtime import ServedModel
from dsv32.serve.scheduler import PAUSE_MODES, Scheduler

MAX_ROWS = 1024
WAIT_LIMIT = 600.0
#: The routes served only with ``rl_routes=True`` (``--enable-rl-routes``): (method, path).
CONTROL_ROUTES = (
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("POST", "/update_weights"),
    ("POST", "/update_adapter"),
    ("POST", "/init_weight_transfer_engine"),
)


class RLControl:
    """Pause state and weight version of one server; the blocking work runs off the event loop."""

    def __init__(self, served: ServedModel, scheduler: Scheduler) -> None:
        self.served = served
        self.scheduler = scheduler
        self.lock = threading.Lock()  # pause / resume / update one at a time
        self.resumed = threading.Event()
        self.resumed.set()
        self.mode: str | None = None
        self.version: int | None = None
        self.path: str | None = None
        self.group = None  # the weight transfer group (rank 1), once a trainer set one up
        self.backend: str | None = None
        self.transfer_timeout = 60.0
        self.receiving: threading.Thread | None = None
        self.transfer_error: str | None = None
        self.adapters = MergedAdapters(served.model)
        self.adapter = False  # whether the version served is an adapter merged into the base weights

    # ------------------------------------------------------------------ pause / resume
    def pause(self, mode: str, timeout: float = WAIT_LIMIT) -> dict[str, Any]:
        with self.lock:
            return self._pause(mode, timeout)

    def _pause(self, mode: str, timeout: float) -> dict[str, Any]:
        self.resumed.clear()
        try:
            aborted = self.scheduler.pause(mode, timeout)
        except ServeError:  # wait ran out of time: the scheduler generates again
            self.mode = None
            self.resumed.set()
            raise
        self.mode = mode
        return {"paused": True, "mode": mode, "aborted": aborted}

    def resume(self) -> dict[str, Any]:
        with self.lock:
            self._resume()
        return {"paused": False}

    def _resume(self) -> None:
        self.scheduler.resume()
        self.mode = None
        self.resumed.set()

    # ------------------------------------------------------------------ weights
    @contextmanager
    def _swapping(self) -> Iterator[None]:
        """The served weights may change inside: the control lock held, the scheduler paused (unless a
        client paused it, then it stays paused after) and the model lock held."""
        with self.lock:
            was_paused = self.mode is not None
            if not was_paused:
                self._pause("wait", WAIT_LIMIT)
            try:
                with self.scheduler.model_lock:
                    try:
                        yield
                    finally:  # the kept entries belong to the weights that computed them
                        self.scheduler.clear_prefix()
            finally:
                if not was_paused:
                    self._resume()

    def update(self, path: str, version: int) -> dict[str, Any]:
        self._not_receiving()
        with self._swapping():
            try:
                loaded = load_weights(self.served.model, path)
            except WeightFileError as err:
                raise invalid(str(err), "path") from None
            if loaded != version:
                raise invalid(
                    f"{path} holds weight version {loaded}, the request says {version}", "weight_version"
                )
            self.version, self.path, self.adapter = version, path, False
            self.adapters.forget()  # these weights are the base of the next adapter
        return {"weight_version": self.version}

    def update_adapter(self, path: str, version: int) -> dict[str, Any]:
        """Merge the LoRA adapter at ``path`` (stamped ``version``) into the served weights."""
        self._not_receiving()
        try:
            adapter = read_adapter(path)
            self.adapters.check(adapter)
        except LoRAError as err:
            raise invalid(str(err), "path") from None
        if adapter.version != version:
            raise invalid(
                f"{path} holds weight version {adapter.version}, the request says {version}", "weight_version"
            )
        with self._swapping():
            self.adapters.apply(adapter)
            self.version, self.path, self.adapter = version, path, True
        return {"weight_version": self.version, "adapter": True, "layers": len(adapter.pairs)}

    def info(self) -> dict[str, Any]:
        transfer = {
            "backend": self.backend if self.group is not None else None,
            "receiving": self._receiving(),
            "error": self.transfer_error,
        }
        return {
            "weight_version": self.version,
            "path": self.path,
            "model": self.served.name,
            "adapter": self.adapter,
            "transfer": transfer,
        }

    # ------------------------------------------------------------------ weights over a process group
    def _receiving(self) -> bool:
        return self.receiving is not None and self.receiving.is_alive()

    def _not_receiving(self) -> None:
        if self._receiving():
            raise ServeError("a weight transfer is in progress", status=409, type="invalid_request_error")

    def init_transfer(self, body: InitTransferRequest) -> dict[str, Any]:
        self._not_receiving()
        device = next(self.served.model.parameters()).device
        backend = body.backend or weight_transfer.backend_for(device)
        if backend == "nccl" and device.type != "cuda":
            raise invalid(
                f"the nccl backend needs the model on CUDA; it is on {device.type}: use gloo", "backend"
            )
        self.group = None
        try:
            self.group = weight_transfer.transfer_group(
                body.master_address, body.master_port, 1, backend, body.timeout
            )
        except weight_transfer.TransferError as err:
            raise ServeError(str(err), status=503, type="server_error") from None
        self.backend, self.transfer_timeout, self.transfer_error = backend, body.timeout, None
        return {"backend": backend, "rank": 1, "world_size": 2}

    def update_collective(self, body: UpdateWeightsRequest) -> dict[str, Any]:
        if self.group is None:
            raise invalid("no weight transfer group: POST /init_weight_transfer_engine first", "names")
        self._not_receiving()
        try:
            specs = weight_transfer.check_specs(
                self.served.model, body.names or [], body.dtypes or [], body.shapes or []
            )
        except weight_transfer.TransferError as err:
            raise invalid(str(err), "names") from None
        self.transfer_error = None
        self.receiving = threading.Thread(
            target=self._receive, args=(specs, body.weight_version), name="weight-transfer", daemon=True
        )
        self.receiving.start()
        return {"accepted": True, "weight_version": body.weight_version, "tensors": len(specs)}

    def _receive(self, specs, version: int) -> None:
        group, timeout = self.group, self.transfer_timeout
        device = next(self.served.model.parameters()).device
        try:
            tensors = weight_transfer.receive(group, specs, device, timeout)
        except weight_transfer.TransferError as err:
            self.transfer_error, self.group = str(err), None  # the group's sequence is lost: set up anew
            return
        try:
            with self._swapping():
                weight_transfer.copy_into(self.served.model, tensors)
                self.version, self.path, self.adapter = version, None, False
                self.adapters.forget()
        except ServeError as err:  # the scheduler could not be paused in time
            self.transfer_error = f"received, not loaded: {err}"

    # ------------------------------------------------------------------ generation
    def generate(self, body: GenerateRequest) -> dict[str, Any]:
        if not self.resumed.wait(WAIT_LIMIT):
            raise ServeError(
                f"the server stayed paused for {WAIT_LIMIT:g} s", status=503, type="server_error"
            )
        served, p = self.served, body.sampling_params
        prompts = body.prompts
        self._check(prompts, body)
        model = served.model
        native = isinstance(model, DeepseekV32)
        truncating = p.temperature >= 1e-5 and (p.top_p < 1.0 or p.top_k > 0)
        generator = None if p.seed is None else torch.Generator().manual_seed(p.seed)
        eos = [] if p.ignore_eos else served.eos_ids if p.stop_token_ids is None else p.stop_token_ids
        pad = self._pad_id(body.pad_token_id, eos)
        routing = p.return_routed_experts and native
        indexing = p.return_indexer_topk and sparse_dsa(model)
        with self.scheduler.model_lock:
            version = self.version
            out = generate(
                model,
                prompts,
                max_new_tokens=p.max_tokens,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=engine_top_k(p.top_k),
                eos_token_id=eos,
                pad_token_id=pad,
                generator=generator,
                return_routing=routing,
                return_kept=p.return_sampling_mask and truncating,
                return_indexing=indexing,
                # kept positions' routing and selections are not recorded again
                prefix=None if routing or indexing else self.scheduler.prefix,
            )
        reply = self._reply(prompts, out, set(eos), version, body.batched)
        if body.batched:
            reply.pad_token_id = pad
        return reply.model_dump(exclude_unset=True)

    def _pad_id(self, requested: int | None, eos: list[int]) -> int:
        """The id a batch is left-padded with: the request's, else the model's, else the first stop
        id, else 0 (the rule of :func:`dsv32.engine.generate`)."""
        if requested is not None:
            return requested
        own = backend_for(self.served.model).pad_token_id
        if own is not None:
            return int(own)
        return int(eos[0]) if eos else 0

    def _check(self, prompts: list[list[int]], body: GenerateRequest) -> None:
        p = body.sampling_params
        if not prompts or len(prompts) > MAX_ROWS:
            raise invalid(f"token_ids must hold 1 to {MAX_ROWS} prompts", "token_ids")
        vocab = self.served.vocab_size
        for ids in prompts:
            if not ids:
                raise invalid("a prompt has no tokens", "token_ids")
            if any(not 0 <= t < vocab for t in ids):
                raise invalid(f"token ids must be in [0, {vocab})", "token_ids")
            if len(ids) + p.max_tokens > self.served.max_model_len:
                raise invalid(
                    f"a prompt of {len(ids)} tokens plus max_tokens {p.max_tokens} exceeds the model's "
                    f"{self.served.max_model_len} positions",
                    "sampling_params.max_tokens",
                )
        if p.stop_token_ids is not None and any(not 0 <= t < vocab for t in p.stop_token_ids):
            raise invalid(f"stop_token_ids must be in [0, {vocab})", "sampling_params.stop_token_ids")
        if body.pad_token_id is not None and not 0 <= body.pad_token_id < vocab:
            raise invalid(f"pad_token_id must be in [0, {vocab})", "pad_token_id")

    def _reply(self, prompts, out, eos: set[int], version: int | None, batched: bool) -> GenerateResponse:
        lengths, tokens, logps = out.lengths.tolist(), out.tokens.tolist(), out.logprobs.tolist()
        P = max(len(x) for x in prompts)
        choices = []
        for j, n in enumerate(lengths):
            ids = tokens[j][:n]
            sampling_mask = routed_experts = None
            if out.kept_token_ids is not None:
                sampling_mask = [[k for k in row if k >= 0] for row in out.kept_token_ids[j, :n].tolist()]
            topk = shape = None
            if out.indexing is not None:  # laid out as routed_experts; row positions need no shift
                lo = 0 if batched else P - len(prompts[j])
                hi = out.indexing.shape[2] if batched else lo + len(prompts[j]) + n - 1
                topk, shape = encode_topk(out.indexing[:, j, lo:hi].permute(1, 0, 2).cpu().numpy())
            if out.routing is not None:  # a batch: every column of the padded layout, padding included
                lo = 0 if batched else P - len(prompts[j])
                hi = out.routing.shape[2] if batched else lo + len(prompts[j]) + n - 1
                routed_experts = out.routing[:, j, lo:hi].permute(1, 0, 2).tolist()
            content = [TokenLogprob(token_id=t, logprob=lp) for t, lp in zip(ids, logps[j][:n])]
            choices.append(
                GenerateChoice(
                    index=j,
                    token_ids=ids,
                    logprobs=ChoiceLogprobs(content=content),
                    finish_reason="stop" if n and ids[-1] in eos else "length",
                    sampling_mask=sampling_mask,
                    routed_experts=routed_experts,
                    indexer_topk=topk,
                    indexer_topk_shape=shape,
                )
            )
        return GenerateResponse(
            id=f"gen-{uuid.uuid4().hex}",
            object="generate",
            model=self.served.name,
            choices=choices,
            usage=Usage(prompt_tokens=sum(map(len, prompts)), completion_tokens=sum(lengths)),
            weight_version=version,
        )


def rl_routes_off(method: str, path: str) -> ServeError:
    return ServeError(
        f"{method} {path} is not served: the routes that pause the server and load weights are off unless "
        "dsv32 serve is started with --enable-rl-routes",
        status=404,
        code="rl_routes_disabled",
    )


def _refuse(method: str, path: str):
    async def off() -> None:
        raise rl_routes_off(method, path)

    return off


def register_rl_routes(
    app: FastAPI, served: ServedModel, scheduler: Scheduler, authorize, *, control_routes: bool = False
) -> RLControl:
    """Add the RL endpoints to ``app`` (``authorize``: the app's API-key dependency); the routes of
    :data:`CONTROL_ROUTES` only with ``control_routes``, else each answers 404 saying so."""
    control = RLControl(served, scheduler)
    auth = [Depends(authorize)]

    @app.post("/inference/v1/generate", dependencies=auth)
    async def rl_generate(body: GenerateRequest) -> dict[str, Any]:
        check_text(body)
        if body.model is not None and body.model != served.name:
            raise unknown_model(body.model, served.name)
        if body.stream:
            raise invalid("streaming is not supported on /inference/v1/generate", "stream")
        return await asyncio.to_thread(control.generate, body)

    @app.get("/is_paused", dependencies=auth)
    async def is_paused() -> dict[str, Any]:
        return {"is_paused": control.mode is not None, "mode": control.mode}

    @app.get("/weight_info", dependencies=auth)
    async def weight_info() -> dict[str, Any]:
        return control.info()

    if not control_routes:
        for method, path in CONTROL_ROUTES:
            app.add_api_route(path, _refuse(method, path), methods=[method], dependencies=auth)
        return control

    @app.post("/pause", dependencies=auth)
    async def pause(
        mode: str = Query("abort", pattern=f"^({'|'.join(PAUSE_MODES)})$"),
        timeout: float = Query(WAIT_LIMIT, gt=0, le=WAIT_LIMIT),
    ) -> dict[str, Any]:
        return await asyncio.to_thread(control.pause, mode, timeout)

    @app.post("/resume", dependencies=auth)
    async def resume() -> dict[str, Any]:
        return await asyncio.to_thread(control.resume)

    @app.post("/update_weights", dependencies=auth)
    async def update_weights(body: UpdateWeightsRequest) -> dict[str, Any]:
        check_text(body)
        if body.path is None:
            if body.names is None:
                raise invalid("give path (a weight file) or names, dtypes and shapes (a transfer)", "path")
            return await asyncio.to_thread(control.update_collective, body)
        return await asyncio.to_thread(control.update, body.path, body.weight_version)

    @app.post("/update_adapter", dependencies=auth)
    async def update_adapter(body: UpdateAdapterRequest) -> dict[str, Any]:
        check_text(body)
        return await asyncio.to_thread(control.update_adapter, body.path, body.weight_version)

    @app.post("/init_weight_transfer_engine", dependencies=auth)
    async def init_weight_transfer_engine(body: InitTransferRequest) -> dict[str, Any]:
        check_text(body)
        return await asyncio.to_thread(control.init_transfer, body)

    return control
