"""A rollout engine in another process, over HTTP: ``dsv32 serve`` or vLLM.

Wire format (``POST {url}/inference/v1/generate``, vLLM's token-in/token-out endpoint), typed once in
:mod:`dsv32.engine.wire` for this client and ``dsv32 serve`` alike::

    {"model": ..., "token_ids": [...], "stream": false,
     "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
                         "logprobs": 0, "return_sampling_mask": true, "return_routed_experts": true}}
    → {"choices": [{"index", "token_ids", "logprobs": {"content": [{"token_id", "logprob"}, ...]},
                    "sampling_mask": [[kept ids], ...], "routed_experts": [[[expert, ...] per layer]
                    per position], "finish_reason"}], "weight_version": v}

vLLM's replies differ in two places, both read here: ``routed_experts`` is a base64 ``.npy`` array,
and the version is per choice, ``weight_versions: [{"version", "start", "end"}]`` spans (the oldest
counts). A version that is not a step number counts as none. A reply that does not fit the model is
an :class:`~dsv32.rl.engines.base.EngineError` naming the fields that are wrong, and a request the
engine would refuse (a temperature above 2, say) is one before it is sent.

With ``api="dsv32"`` one request carries the whole batch (``token_ids`` a list of prompts, with
``pad_token_id``): ``dsv32 serve`` runs it as one :func:`dsv32.engine.generate` call seeded with
``seed`` — turn ``t`` of a rollout sends :func:`~dsv32.rl.engines.base.turn_seed`, the seed the
in-process engine's turn ``t`` samples with — so every turn samples exactly what the in-process
engine samples (its ``routed_experts`` cover the batch's padded layout, as in process). With
``api="vllm"`` each row is its own request, seeded ``seed + row``.
``sampling_mask`` and ``routed_experts`` are optional in a reply: without them the batch has no kept
sets / routing (the trainer then applies no Keep Sampling Mask / Keep Routing and says so once).

Weights (:meth:`RemoteEngine.sync`) go through the engine's
:class:`~dsv32.rl.engines.weight_sync.WeightSync`: by file, or, to ``dsv32 serve``, over a process
group (:class:`~dsv32.rl.engines.weight_sync.CollectiveWeightSync`); to vLLM by file, reloaded in
place through its dev-mode ``/collective_rpc``. By file: the trainer writes them where the engine can
read them and calls ``POST /update_weights {"path", "weight_version"}``; the engine pauses, loads,
resumes and reports ``GET /weight_info → {"weight_version"}``, which is checked. A model that trains
a LoRA adapter sends only the adapter where ``lora_sync`` routes it so
(:func:`~dsv32.rl.engines.weight_sync.lora_route`: by file, ``dsv32 serve``'s ``/update_adapter`` or
vLLM's ``/v1/load_lora_adapter``, after which vLLM is asked for the adapter's name), else its merged
weights.

Constructing a :class:`RemoteEngine` sends nothing: :meth:`RemoteEngine.connect` (or the first
:meth:`~RemoteEngine.generate` or :meth:`~RemoteEngine.weight_version`) asks ``GET /v1/models`` for
the model it serves, and an engine that cannot be reached is an ``EngineError`` naming that request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from dsv32.engine.lora import has_adapter, merged_copy
from dsv32.engine.prefix import PrefixCache
from dsv32.engine.wire import (
    GenerateChoice,
    GenerateParams,
    GenerateRequest,
    GenerateResponse,
    ModelList,
    WeightInfo,
    as_version,
    decode_topk,
)
from dsv32.rl.engines.base import SEED_MOD, EngineError, EngineOutput, turn_seed
from dsv32.rl.engines.http import EngineClient, wire_body
from dsv32.rl.engines.weight_sync import VLLM_LORA_NAME, WeightSync, lora_route


class RemoteEngine:
    """Samples over HTTP from the server at ``url`` (its root, e.g. ``http://127.0.0.1:8000``).
    ``api``: ``"dsv32"`` (one batched request per call) or ``"vllm"`` (one request per row);
    ``sync``: the :class:`~dsv32.rl.engines.weight_sync.WeightSync` that pushes weights (None:
    :meth:`sync` is refused); ``model``: the name to ask for (None: the first one ``/v1/models``
    lists); ``retries``/``backoff``: a failed request sent again
    (:class:`~dsv32.rl.engines.http.EngineClient`); ``lora_sync``: how a LoRA policy's weights are
    sent (``auto``, ``adapter``, ``merged``: :func:`~dsv32.rl.engines.weight_sync.lora_route`, checked
    here). Nothing is sent before :meth:`connect` or the first call."""

    name = "remote"
    shares_weights = False

    def __init__(
        self,
        url: str,
        *,
        api: str = "dsv32",
        sync: WeightSync | None = None,
        timeout: float = 600.0,
        model: str | None = None,
        api_key: str | None = None,
        retries: int = 0,
        backoff: float = 1.0,
        lora_sync: str = "auto",
    ) -> None:
        self.lora_route = lora_route(lora_sync, sync) if sync is not None else "merged"
        self.client = EngineClient(
            url, api=api, timeout=timeout, api_key=api_key, retries=retries, backoff=backoff
        )
        self.weight_sync = sync
        self.model = model
        self.synced: int | None = None  # the version this engine object last pushed
        self._connected = False
        self._connecting = threading.Lock()

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def api(self) -> str:
        return self.client.api

    @property
    def retried(self) -> int:
        return self.client.retried

    def connect(self) -> None:
        """Ask the engine which model it serves (``GET /v1/models``), once; the first one listed is
        used unless a ``model`` was given. An engine that cannot be reached, or lists no model, is an
        :class:`EngineError`."""
        with self._connecting:
            if self._connected:
                return
            reply = self.client.typed(ModelList, "GET", "/v1/models", timeout=min(self.client.timeout, 30.0))
            if not reply.data:
                raise EngineError(f"{self.url}/v1/models lists no model")
            self.model = self.model or reply.data[0].id
            self._connected = True

    # ------------------------------------------------------------------ the engine
    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        eos: list[int],
        pad: int,
        generator: torch.Generator | Sequence[torch.Generator] | None,
        turn: int,
        return_kept: bool,
        return_routing: bool,
        prefix: PrefixCache | None = None,
        return_indexing: bool = False,
    ) -> EngineOutput:
        if prefix is not None:
            raise EngineError(
                "a prefix cache needs an engine that samples with the trainer's model (shares_weights); "
                "a remote engine keeps its own caches"
            )
        seed = turn_seed(_one_generator(generator), turn)
        self.connect()
        params = dict(
            max_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k if top_k > 0 else -1,
            stop_token_ids=list(eos),
            logprobs=0,
            return_sampling_mask=return_kept,
            return_routed_experts=return_routing,
        )
        if return_indexing:
            params["return_indexer_topk"] = True
        if self.api == "dsv32":
            body = self._body([list(p) for p in prompts], params, seed, pad_token_id=pad)
            reply = self.client.typed(GenerateResponse, "POST", "/inference/v1/generate", body)
            choices: list[GenerateChoice | None] = list(reply.choices)
            versions = [as_version(reply.weight_version)] * len(prompts)
        else:
            bodies = [
                self._body(list(p), params, None if seed is None else (seed + i) % SEED_MOD)
                for i, p in enumerate(prompts)
            ]

            def one(body: GenerateRequest) -> GenerateResponse:
                return self.client.typed(GenerateResponse, "POST", "/inference/v1/generate", body)

            with ThreadPoolExecutor(min(16, max(1, len(prompts)))) as pool:
                replies = list(pool.map(one, bodies))
            choices = [r.choices[0] if r.choices else None for r in replies]
            versions = [_choice_version(c, r.weight_version) for c, r in zip(choices, replies)]
        if len(choices) != len(prompts) or any(c is None for c in choices):
            raise EngineError(f"the engine returned {len(choices)} choices for {len(prompts)} prompts")
        output = _output(prompts, choices, versions, return_kept, return_routing, self.api == "dsv32")
        if return_indexing and all(c.indexer_topk is not None for c in choices):
            output.indexing = _indexing(prompts, output.tokens, choices, self.api == "dsv32")
        return output

    def _body(self, token_ids: list, params: dict, seed: int | None, **extra) -> GenerateRequest:
        sampling = wire_body(GenerateParams, **params, seed=seed)
        return wire_body(
            GenerateRequest,
            model=self.model,
            token_ids=token_ids,
            sampling_params=sampling,
            stream=False,
            **extra,
        )

    def weight_version(self) -> int | None:
        """The version the engine reports (None: none yet, or one that is not a step number)."""
        self.connect()
        return as_version(self.client.typed(WeightInfo, "GET", "/weight_info").weight_version)

    def sync(self, model: torch.nn.Module, version: int) -> float:
        """Push ``model``'s weights as ``version`` with this engine's weight sync, and check the
        version the engine then reports; returns the seconds the whole sync took. A model that trains a
        LoRA adapter sends the adapter alone (``lora_route`` ``"adapter"``: the engine holds the base
        weights) or its merged weights (:func:`dsv32.engine.lora.merged_copy`: the base weights with
        the adapter folded in, under the base model's names)."""
        if self.weight_sync is None:
            raise EngineError(
                "this remote engine has no weight sync: give it a FileWeightSync or a CollectiveWeightSync"
            )
        t = time.perf_counter()
        lora = has_adapter(model)
        if lora and self.lora_route == "adapter":
            self.weight_sync.push_adapter(self.client, model, version)
            if self.api == "vllm":  # vLLM samples with the adapter when asked for it by name
                self.model = VLLM_LORA_NAME
        else:
            self.weight_sync.push(self.client, merged_copy(model) if lora else model, version)
        served = self.weight_version()
        if served != version:
            raise EngineError(
                f"weight sync to {self.url}: pushed version {version}, the engine reports {served}"
            )
        self.synced = version
        return time.perf_counter() - t

    def close(self) -> None:
        pass


def _one_generator(generator: torch.Generator | Sequence[torch.Generator] | None) -> torch.Generator | None:
    """The one generator of a call: an engine in another process receives one seed per request."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    distinct = {id(g): g for g in generator}
    if len(distinct) != 1:
        raise EngineError(
            f"a remote engine samples one call with one generator, got {len(distinct)}: split the rows "
            "with split_calls (one call per generator)"
        )
    return next(iter(distinct.values()))


def _choice_version(choice: GenerateChoice | None, default: int | str | None) -> int | None:
    """vLLM reports ``weight_versions`` spans per choice (``[{"version", "start", "end"}]``, tokens
    ``[start, end)`` sampled by ``version``): the oldest counts. Else the reply's ``weight_version``."""
    spans = choice.weight_versions if choice is not None else None
    if spans:
        found = [as_version(span.version) for span in spans]
        return None if None in found else min(found)
    return as_version(default)


def _experts(value: list | str) -> torch.Tensor:
    """``routed_experts`` as nested lists, or vLLM's base64 ``.npy`` bytes → ``[positions, layers, k]``;
    anything else is an :class:`EngineError`."""
    try:
        if isinstance(value, str):
            import base64
            import io

            import numpy as np

            value = np.load(io.BytesIO(base64.b64decode(value)), allow_pickle=False).astype(np.int64)
        experts = torch.as_tensor(value, dtype=torch.long)
    except (ValueError, TypeError, RuntimeError, OSError) as err:
        raise EngineError(f"the engine's routed_experts cannot be read: {err}") from None
    if experts.numel() and experts.dim() != 3:
        raise EngineError(
            f"the engine's routed_experts have shape {list(experts.shape)}, not [positions, layers, k]"
        )
    return experts


def _output(
    prompts,
    choices: list[GenerateChoice],
    versions,
    return_kept: bool,
    return_routing: bool,
    batch_layout: bool,
) -> EngineOutput:
    tokens = [list(c.token_ids) for c in choices]
    logprobs = [c.sampling_logprobs() for c in choices]
    if any(lp is None for lp in logprobs):
        raise EngineError(
            "the engine returned no sampling log-probs for every generated token (ask for logprobs=0; "
            "a vLLM server needs --max-logprobs >= 0)"
        )
    kept = None
    if return_kept and all(c.sampling_mask is not None for c in choices):
        kept = []
        for c, t in zip(choices, tokens):
            sets = c.sampling_mask
            if len(sets) != len(t):
                raise EngineError(f"the engine returned {len(sets)} kept sets for {len(t)} tokens")
            K = max((len(s) for s in sets), default=1)
            k = torch.full((len(t), K), -1, dtype=torch.int32)
            for j, s in enumerate(sets):
                k[j, : len(s)] = torch.tensor(s, dtype=torch.int32)
            kept.append(k)
    routing = None
    if return_routing and all(c.routed_experts is not None for c in choices):
        routing = _routing(prompts, tokens, [c.routed_experts for c in choices], batch_layout)
    # rows sampled across a sync (one request per row): the oldest version counts
    version = None if any(v is None for v in versions) else min(versions)
    return EngineOutput(tokens=tokens, logprobs=logprobs, kept=kept, routing=routing, weight_version=version)


def _indexing(prompts, tokens, choices: list[GenerateChoice], batch_layout: bool) -> torch.Tensor:
    """Per-choice base64 ``[positions, layers, k]`` selections (row positions) → ``[layers, B, P + N -
    1, k]`` int32 laid out as :func:`_routing` lays out routing, −1 where nothing was recorded."""
    P = max(len(p) for p in prompts)
    N = max(1, max(len(t) for t in tokens))
    rows = []
    for i, c in enumerate(choices):
        try:
            rows.append(torch.from_numpy(decode_topk(c.indexer_topk, c.indexer_topk_shape or [])))
        except ValueError as err:
            raise EngineError(f"choice {i}: {err}") from err
    layers, k = rows[0].shape[1], rows[0].shape[2]
    out = torch.full((layers, len(prompts), P + N - 1, k), -1, dtype=torch.int32)
    for i, (p, r) in enumerate(zip(prompts, rows)):
        if r.shape[1:] != (layers, k):
            raise EngineError(f"choice {i}: indexer_topk of shape {list(r.shape)}, others {[layers, k]}")
        lo = 0 if batch_layout else P - len(p)
        n = min(r.shape[0], P + N - 1 - lo)
        out[:, i, lo : lo + n] = r.permute(1, 0, 2)[:, :n]
    return out


def _routing(prompts, tokens, rows: list[list], batch_layout: bool) -> torch.Tensor:
    """Per-row ``[positions, layers, k]`` routed experts → ``[layers, B, P + N - 1, k]`` with prompts
    left-padded to P. ``batch_layout``: each row already covers the batch's columns from the first
    (a batched ``dsv32 serve`` reply); otherwise a row covers its own positions (prompt then
    generated, the last token excluded) and padding positions route to expert 0 (they are masked out
    of attention and of the loss; only float rounding in the expert matmuls can tell)."""
    P = max(len(p) for p in prompts)
    N = max(1, max(len(t) for t in tokens))
    rows = [_experts(r) for r in rows]
    first = next((r for r in rows if r.numel()), None)
    if first is None:
        return None
    layers, k = first.shape[1], first.shape[2]
    out = torch.zeros(layers, len(prompts), P + N - 1, k, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, rows)):
        if not r.numel():
            continue
        t = r.permute(1, 0, 2)  # [layers, positions, k]
        lo = 0 if batch_layout else P - len(p)
        n = min(t.shape[1], P + N - 1 - lo)
        out[:, i, lo : lo + n] = t[:, :n]
    return out
