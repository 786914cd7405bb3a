"""Trainer → engine weight sync: every strategy is a :class:`WeightSync`, one ``push(client, model,
version)`` that returns once the engine behind ``client`` (an
:class:`~dsv32.rl.engines.http.EngineClient`) has the weights; the engine then reports the version.

The ``file`` backend writes version-stamped safetensors of the whole ``state_dict()``
(:mod:`dsv32.engine.weight_files`: every key, tied head included, written atomically) into a
directory the engine can read, and keeps only the newest: ``dsv32 serve`` loads the file on
``POST /update_weights {"path", "weight_version"}``; vLLM (its dev mode) reloads a checkpoint
directory of that one file in place (``/collective_rpc`` ``reload_weights``) between a pause and a
resume, and takes the version from ``/update_weight_version``.

The ``collective`` backend (:class:`CollectiveWeightSync`) broadcasts the same tensors over a
two-party ``torch.distributed`` group with the engine (:mod:`dsv32.engine.weight_transfer`): NCCL when
the trainer's weights are on a GPU, gloo on CPUs, the same code. The trainer hosts the group's store
on the address it reaches the engine from and asks the engine to join
(``POST /init_weight_transfer_engine``); each sync announces names, dtypes and shapes with the version
(``POST /update_weights``), the engine checks them against its model, the trainer broadcasts, and the
sync ends when ``GET /weight_info`` reports the version (or the transfer's error). ``sync = "nccl"``
is accepted as the same backend where the trainer's weights are on CUDA.

A trainer that trains a LoRA adapter (``[lora]``) sends only the adapter where the route allows it
(:func:`lora_route`, ``[engine] lora_sync``): :meth:`FileWeightSync.push_adapter` writes it in peft's
save format, version-stamped, as ``adapter-v<version>/`` and — to ``dsv32 serve`` — calls
``POST /update_adapter {"path", "weight_version"}`` (merged into the served base weights, the
version checked as for a weight file), or — to vLLM started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` — ``POST /v1/load_lora_adapter {"lora_name", "lora_path",
"load_inplace": true}`` then ``/update_weight_version``, between a pause and a resume; the engine then
samples with ``model = lora_name`` (:data:`VLLM_LORA_NAME`). Otherwise the merged weights go as a full
sync.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import torch

from dsv32.engine import weight_transfer
from dsv32.engine.lora import save_adapter
from dsv32.engine.weight_files import save_weights, weights_file
from dsv32.engine.wire import (
    InitTransferRequest,
    TransferState,
    UpdateAdapterRequest,
    UpdateWeightsRequest,
    WeightInfo,
)
from dsv32.rl.engines.base import EngineError
from dsv32.rl.engines.http import EngineClient, wire_body

#: The name vLLM serves the trainer's adapter under (``/v1/load_lora_adapter``'s ``lora_name``).
VLLM_LORA_NAME = "dsv32-policy"
#: ``[engine] lora_sync``: ``adapter`` (only the adapter; by file), ``merged`` (the merged weights
#: through the engine's weight sync), ``auto`` (the adapter where the sync is by file, else merged).
LORA_SYNCS = ("auto", "adapter", "merged")


def lora_route(lora_sync: str, sync: WeightSync | None) -> str:
    """``"adapter"`` or ``"merged"``: how a LoRA policy's weights reach an engine whose weight sync
    is ``sync``, as ``lora_sync`` asks; an :class:`EngineError` for an adapter sync ``sync`` cannot
    send (only the file sync sends adapters)."""
    if lora_sync not in LORA_SYNCS:
        raise EngineError(f"unknown lora_sync {lora_sync!r}; known: {', '.join(map(repr, LORA_SYNCS))}")
    by_file = sync is not None and sync.sends_adapters
    if lora_sync == "adapter" and not by_file:
        raise EngineError(
            "[engine] lora_sync = 'adapter' sends the adapter by file: use sync = 'file', or lora_sync = "
            "'merged' to send the merged weights over the collective sync"
        )
    return "adapter" if lora_sync == "adapter" or (lora_sync == "auto" and by_file) else "merged"


class WeightSync(Protocol):
    """How a remote engine gets the trainer's weights."""

    name: str
    sends_adapters: bool
    """Whether it has ``push_adapter(client, model, version)``: a LoRA policy's adapter alone."""

    def push(self, client: EngineClient, model: torch.nn.Module, version: int) -> None:
        """Give the engine behind ``client`` ``model``'s whole ``state_dict()`` as ``version``;
        returns once the engine has taken them (the caller then checks the version it reports). A
        sync the engine's ``client.api`` cannot take is an :class:`EngineError` before anything is
        sent."""
        ...


class FileWeightSync:
    """Writes version-stamped weight files under ``directory`` (which the engine must be able to
    read) and keeps only the newest ``keep`` of them."""

    name = "file"
    sends_adapters = True

    def __init__(self, directory: str | Path, keep: int = 1) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def push(self, client: EngineClient, model: torch.nn.Module, version: int) -> None:
        if client.api == "vllm":
            self._push_vllm(client, model, version)
        else:
            path, _ = self.write(model, version)
            body = wire_body(UpdateWeightsRequest, path=str(Path(path).resolve()), weight_version=version)
            reply = client.request("POST", "/update_weights", body)
            if reply.get("weight_version") != version:
                raise EngineError(
                    f"weight sync to {client.url}: pushed version {version}, the engine answered {reply}"
                )
        self.prune()

    def push_adapter(self, client: EngineClient, model: torch.nn.Module, version: int) -> None:
        """Only ``model``'s LoRA adapter, as ``version`` (module docstring): ``dsv32 serve``'s
        ``/update_adapter``, or vLLM's ``/v1/load_lora_adapter`` (a vLLM without runtime LoRA loading
        is an :class:`EngineError` that says how to start it, or to sync merged weights)."""
        folder = save_adapter(model, self.directory / f"adapter-v{version:06d}", version=version)
        path = str(folder.resolve())
        if client.api == "vllm":
            client.pause("wait")
            try:
                body = {"lora_name": VLLM_LORA_NAME, "lora_path": path, "load_inplace": True}
                try:
                    client.request("POST", "/v1/load_lora_adapter", body, retry=False, text=True)
                except EngineError as err:
                    raise EngineError(
                        f"{err} — an adapter sync needs vLLM started with --enable-lora (and --max-lora-rank at "
                        "least the adapter's rank) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; else set [engine] "
                        "lora_sync = 'merged'"
                    ) from None
                client.request("POST", "/update_weight_version", {"new_version": str(version)})
            finally:
                client.resume()
        else:
            body = wire_body(UpdateAdapterRequest, path=path, weight_version=version)
            reply = client.request("POST", "/update_adapter", body)
            if reply.get("weight_version") != version:
                raise EngineError(
                    f"adapter sync to {client.url}: pushed version {version}, the engine answered {reply}"
                )
        self.prune()

    def _push_vllm(self, client: EngineClient, model: torch.nn.Module, version: int) -> None:
        """vLLM (its dev mode, ``VLLM_SERVER_DEV_MODE=1``): the weights written as a checkpoint
        directory of one safetensors file, then — generation paused, running requests let finish —
        every worker reloads them in place from it (``/collective_rpc`` ``reload_weights`` with
        ``weights_path``), the version is set (``/update_weight_version``) and generation resumes."""
        folder, _ = self.write_checkpoint(model, version)
        client.pause("wait")
        try:
            client.request(
                "POST",
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}},
            )
            client.request("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            client.resume()

    def write(self, model: torch.nn.Module, version: int) -> tuple[Path, float]:
        t = time.perf_counter()
        path = save_weights(model, weights_file(self.directory, version), version)
        return path, time.perf_counter() - t

    def write_checkpoint(self, model: torch.nn.Module, version: int) -> tuple[Path, float]:
        """The same file alone in a directory of its own, ``v<version>/model.safetensors``: what an
        engine that loads a checkpoint directory (vLLM's ``reload_weights``) reads."""
        t = time.perf_counter()
        folder = self.directory / f"v{version:06d}"
        if folder.exists():
            shutil.rmtree(folder)
        save_weights(model, folder / "model.safetensors", version)
        return folder, time.perf_counter() - t

    def prune(self) -> None:
        files = sorted(self.directory.glob("weights-v*.safetensors"))
        for old in files[: max(0, len(files) - self.keep)]:
            old.unlink(missing_ok=True)
        for pattern in ("v[0-9]*", "adapter-v[0-9]*"):
            folders = sorted(p for p in self.directory.glob(pattern) if p.is_dir())
            for old in folders[: max(0, len(folders) - self.keep)]:
                shutil.rmtree(old, ignore_errors=True)


class CollectiveWeightSync:
    """Pushes weights to a remote engine over a two-party process group (see the module docstring).
    ``backend``: ``"gloo"`` / ``"nccl"``, or None to follow the device of the trainer's weights;
    ``timeout``: seconds any step (joining, a tensor, the engine's confirmation) may take."""

    name = "collective"
    sends_adapters = False

    def __init__(self, backend: str | None = None, timeout: float = 60.0) -> None:
        if backend is not None and backend not in weight_transfer.BACKENDS:
            raise EngineError(
                f"unknown transfer backend {backend!r}; known: {list(weight_transfer.BACKENDS)}"
            )
        if not 0 < timeout <= 600:
            raise EngineError(f"the weight transfer timeout must be in (0, 600] seconds, got {timeout:g}")
        self.backend, self.timeout = backend, timeout
        self.group = None

    def connect(self, client: EngineClient, device) -> None:
        """Form the group with the engine behind ``client``: this process is rank 0 and hosts the
        store; the engine joins as rank 1."""
        backend = self.backend or weight_transfer.backend_for(device)
        host = _address_towards(client.url)
        port = _free_port(host)
        answer: dict = {}
        body = wire_body(
            InitTransferRequest, master_address=host, master_port=port, backend=backend, timeout=self.timeout
        )

        def ask() -> None:
            try:
                answer["reply"] = client.request(
                    "POST", "/init_weight_transfer_engine", body, timeout=self.timeout + 10, retry=False
                )
            except EngineError as err:
                answer["error"] = err

        asking = threading.Thread(target=ask, name="init-weight-transfer", daemon=True)
        asking.start()
        try:
            group = weight_transfer.transfer_group(host, port, 0, backend, self.timeout)
        except weight_transfer.TransferError as err:
            asking.join(self.timeout + 15)
            raise EngineError(f"weight transfer to {client.url}: {answer.get('error') or err}") from None
        asking.join(self.timeout + 15)
        if "reply" not in answer:
            raise EngineError(
                f"weight transfer to {client.url}: the engine did not join: "
                f"{answer.get('error') or 'no answer in time'}"
            )
        self.group = group

    def push(self, client: EngineClient, model: torch.nn.Module, version: int) -> None:
        """Send ``model``'s whole ``state_dict()`` as ``version``; returns once the engine serves it."""
        if client.api != "dsv32":
            raise EngineError(
                "the collective weight sync speaks dsv32 serve's /init_weight_transfer_engine; a vLLM "
                "engine is not driven by it (see docs/rl.md, 'Scaling out')"
            )
        state = model.state_dict()
        if self.group is None:
            self.connect(client, next(iter(state.values())).device)
        announce = wire_body(
            UpdateWeightsRequest, weight_version=version, **weight_transfer.tensor_specs(state)
        )
        # a refusal (keys, shapes): nothing is sent; never sent twice (the broadcast follows it)
        client.request("POST", "/update_weights", announce, retry=False)
        try:
            weight_transfer.send(self.group, state, self.timeout)
        except weight_transfer.TransferError as err:
            self.group = None  # the engine drops its end too: the next sync forms a new group
            raise EngineError(f"weight transfer to {client.url}: {err}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            info = client.typed(WeightInfo, "GET", "/weight_info")
            transfer = info.transfer or TransferState()
            if info.weight_version == version and not transfer.receiving:
                return
            if transfer.error:
                self.group = None
                raise EngineError(f"weight transfer to {client.url}: the engine reports {transfer.error}")
            if time.monotonic() > deadline:
                raise EngineError(
                    f"weight transfer to {client.url}: version {version} sent, the engine still reports "
                    f"{info.weight_version} after {self.timeout:g} s"
                )
            time.sleep(0.02)


def _address_towards(url: str) -> str:
    """This machine's address on the route to ``url``'s host (what the engine can connect back to)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
        except OSError as err:
            raise EngineError(f"no route to the engine's host {host!r}: {err}") from None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def weight_sync(
    kind: str, directory: str | Path, *, device: str | torch.device = "cpu", timeout: float = 60.0
) -> WeightSync:
    """The backend of ``[engine] sync``: ``file``; ``collective`` (NCCL for weights on CUDA, gloo on
    CPUs); ``nccl``, the collective backend where ``device`` is CUDA."""
    if kind == "file":
        return FileWeightSync(directory)
    if kind == "collective":
        return CollectiveWeightSync(timeout=timeout)
    if kind == "nccl":
        if torch.device(device).type != "cuda":
            raise EngineError(
                "[engine] sync = 'nccl' needs the trainer's weights on CUDA; on CPUs use "
                "sync = 'collective' (gloo) or 'file'"
            )
        return CollectiveWeightSync("nccl", timeout=timeout)
    raise EngineError(f"unknown weight sync {kind!r}; known: 'file', 'collective', 'nccl'")
