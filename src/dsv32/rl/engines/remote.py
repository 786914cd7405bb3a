"""A rollout engine in another process, over HTTP: ``dsv32 serve`` or vLLM.

Wire format (``POST {url}/inference/v1/generate``, vLLM's token-in/token-out endpoint)::

    {"model": ..., "token_ids": [...], "stream": false,
     "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
                         "logprobs": 0, "return_sampling_mask": true, "return_routed_experts": true}}
    → {"choices": [{"index", "token_ids", "logprobs": {"content": [{"token_id", "logprob"}, ...]},
                    "sampling_mask": [[kept ids], ...], "routed_experts": [[[expert, ...] per layer]
                    per position], "finish_reason"}], "weight_version": v}

vLLM's replies differ in two places, both read here: ``routed_experts`` is a base64 ``.npy`` array,
and the version is per choice, ``weight_versions: [{"version", "start", "end"}]`` spans (the oldest
counts). A version that is not a step number counts as none.

With ``api="dsv32"`` one request carries the whole batch (``token_ids`` a list of prompts, with
``pad_token_id``): ``dsv32 serve`` runs it as one :func:`dsv32.engine.generate` call seeded with
``seed`` — turn ``t`` of a rollout sends :func:`~dsv32.rl.engines.base.turn_seed`, the seed the
in-process engine's turn ``t`` samples with — so every turn samples exactly what the in-process
engine samples (its ``routed_experts`` cover the batch's padded layout, as in process). With
``api="vllm"`` each row is its own request, seeded ``seed + row``.
``sampling_mask`` and ``routed_experts`` are optional in a reply: without them the batch has no kept
sets / routing (the trainer then applies no Keep Sampling Mask / Keep Routing and says so once).

Weights (:meth:`RemoteEngine.sync`) go by file or, to ``dsv32 serve``, over a process group
(:class:`~dsv32.rl.engines.weight_sync.CollectiveWeightSync`); to vLLM by file, reloaded in place
through its dev-mode ``/collective_rpc`` (:meth:`RemoteEngine._sync_vllm`). By file: the trainer writes them (:mod:`.weight_sync`) where
the engine can read them and calls ``POST /update_weights {"path", "weight_version"}``; the engine
pauses, loads, resumes and reports ``GET /weight_info → {"weight_version"}``, which is checked.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from dsv32.rl.engines.base import SEED_MOD, EngineError, EngineOutput, turn_seed
from dsv32.rl.engines.weight_sync import CollectiveWeightSync, FileWeightSync


class RemoteEngine:
    """Samples over HTTP from the server at ``url`` (its root, e.g. ``http://127.0.0.1:8000``).
    ``sync``: the :class:`FileWeightSync` weights are written with (None: :meth:`sync` is refused)."""

    name = "remote"

    def __init__(
        self,
        url: str,
        *,
        api: str = "dsv32",
        sync: FileWeightSync | CollectiveWeightSync | None = None,
        timeout: float = 600.0,
        model: str | None = None,
        api_key: str | None = None,
    ) -> None:
        if api not in ("dsv32", "vllm"):
            raise EngineError(f"unknown engine api {api!r}; known: 'dsv32', 'vllm'")
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.api = api
        self.weights = sync
        self.timeout = timeout
        self.api_key = api_key
        self.model = model or self._served_model()
        self.synced: int | None = None  # the version this engine object last pushed

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise EngineError(f"{method} {self.url}{path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:  # refused, unreachable, timed out
            raise EngineError(f"{method} {self.url}{path}: {getattr(err, 'reason', err)}") from None
        try:
            return json.loads(text) if text else {}
        except json.JSONDecodeError:
            raise EngineError(f"{method} {self.url}{path}: the reply is not JSON: {text[:200]!r}") from None

    def _served_model(self) -> str:
        cards = self._request("GET", "/v1/models", timeout=min(self.timeout, 30.0)).get("data") or []
        if not cards:
            raise EngineError(f"{self.url}/v1/models lists no model")
        return cards[0]["id"]

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
        generator: torch.Generator | None,
        turn: int,
        return_kept: bool,
        return_routing: bool,
    ) -> EngineOutput:
        seed = turn_seed(generator, turn)
        params = {
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1,
            "stop_token_ids": list(eos),
            "logprobs": 0,
            "return_sampling_mask": return_kept,
            "return_routed_experts": return_routing,
        }
        if self.api == "dsv32":
            body = self._body(list(map(list, prompts)), params | {"seed": seed}) | {"pad_token_id": pad}
            reply = self._request("POST", "/inference/v1/generate", body)
            choices = reply.get("choices") or []
            versions = [_version(reply.get("weight_version"))] * len(prompts)
        else:

            def one(i: int) -> dict:
                row_seed = None if seed is None else (seed + i) % SEED_MOD
                return self._request(
                    "POST", "/inference/v1/generate", self._body(prompts[i], params | {"seed": row_seed})
                )

            with ThreadPoolExecutor(min(16, max(1, len(prompts)))) as pool:
                replies = list(pool.map(one, range(len(prompts))))
            choices = [(r.get("choices") or [None])[0] for r in replies]
            versions = [_choice_version(c, r.get("weight_version")) for c, r in zip(choices, replies)]
        if len(choices) != len(prompts) or any(c is None for c in choices):
            raise EngineError(f"the engine returned {len(choices)} choices for {len(prompts)} prompts")
        return _output(prompts, choices, versions, return_kept, return_routing, self.api == "dsv32")

    def _body(self, token_ids: list, params: dict) -> dict:
        return {"model": self.model, "token_ids": token_ids, "sampling_params": params, "stream": False}

    def weight_version(self) -> int | None:
        """The version the engine reports (None: none yet, or one that is not a step number)."""
        return _version(self._request("GET", "/weight_info").get("weight_version"))

    def sync(self, model: torch.nn.Module, version: int) -> float:
        """Write ``model``'s weights as ``version``, have the engine load them, and check the version it
        then reports; returns the seconds the whole sync took."""
        if self.weights is None:
            raise EngineError("this remote engine has no weight sync: give it a FileWeightSync")
        t = time.perf_counter()
        if self.api == "vllm" and isinstance(self.weights, FileWeightSync):
            return self._sync_vllm(model, version, t)
        if isinstance(self.weights, CollectiveWeightSync):
            if self.api != "dsv32":
                raise EngineError(
                    "the collective weight sync speaks dsv32 serve's /init_weight_transfer_engine; a vLLM "
                    "engine is not driven by it (see docs/rl.md, 'Scaling out')"
                )
            self.weights.push(self, model, version)
            return self._confirm(version, t)
        path, _ = self.weights.write(model, version)
        reply = self._request(
            "POST", "/update_weights", {"path": str(Path(path).resolve()), "weight_version": version}
        )
        if reply.get("weight_version") != version:
            raise EngineError(
                f"weight sync to {self.url}: pushed version {version}, the engine answered {reply}"
            )
        self.weights.prune()
        return self._confirm(version, t)

    def _sync_vllm(self, model: torch.nn.Module, version: int, t: float) -> float:
        """vLLM (its dev mode, ``VLLM_SERVER_DEV_MODE=1``): the weights written as a checkpoint
        directory of one safetensors file, then — generation paused, running requests let finish —
        every worker reloads them in place from it (``/collective_rpc`` ``reload_weights`` with
        ``weights_path``), the version is set (``/update_weight_version``) and generation resumes;
        ``/weight_info`` must then report the version."""
        folder, _ = self.weights.write_checkpoint(model, version)
        self.pause("wait")
        try:
            self._request(
                "POST",
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}},
            )
            self._request("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            self.resume()
        self.weights.prune()
        return self._confirm(version, t)

    def _confirm(self, version: int, t: float) -> float:
        served = self.weight_version()
        if served != version:
            raise EngineError(
                f"weight sync to {self.url}: pushed version {version}, the engine reports {served}"
            )
        self.synced = version
        return time.perf_counter() - t

    def pause(self, mode: str = "wait") -> None:
        self._request("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self._request("POST", "/resume")

    def close(self) -> None:
        pass


def _version(v) -> int | None:
    """A reported weight version as the trainer's step number; None when absent or not a number."""
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _choice_version(choice: dict | None, default) -> int | None:
    """vLLM reports ``weight_versions`` spans per choice (``[{"version", "start", "end"}]``, tokens
    ``[start, end)`` sampled by ``version``): the oldest counts. Else the reply's ``weight_version``."""
    spans = (choice or {}).get("weight_versions")
    if spans:
        found = [_version(span.get("version")) for span in spans]
        return None if None in found else min(found)
    return _version(default)


def _experts(value) -> torch.Tensor:
    """``routed_experts`` as nested lists, or vLLM's base64 ``.npy`` bytes → ``[positions, layers, k]``."""
    if isinstance(value, str):
        import base64
        import io

        import numpy as np

        value = np.load(io.BytesIO(base64.b64decode(value)), allow_pickle=False).astype(np.int64)
    return torch.as_tensor(value, dtype=torch.long)


def _logprobs(choice: dict, n: int) -> list[float]:
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        lp = [e["logprob"] for e in lp.get("content") or []]
    if not isinstance(lp, list) or len(lp) != n:
        raise EngineError(
            "the engine returned no sampling log-probs for every generated token (ask for logprobs=0; "
            "a vLLM server needs --max-logprobs >= 0)"
        )
    return [float(x) for x in lp]


def _output(
    prompts, choices, versions, return_kept: bool, return_routing: bool, batch_layout: bool
) -> EngineOutput:
    tokens = [list(map(int, c.get("token_ids") or [])) for c in choices]
    logprobs = [_logprobs(c, len(t)) for c, t in zip(choices, tokens)]
    kept = None
    if return_kept and all(c.get("sampling_mask") is not None for c in choices):
        kept = []
        for c, t in zip(choices, tokens):
            sets = c["sampling_mask"]
            if len(sets) != len(t):
                raise EngineError(f"the engine returned {len(sets)} kept sets for {len(t)} tokens")
            K = max((len(s) for s in sets), default=1)
            k = torch.full((len(t), K), -1, dtype=torch.int32)
            for j, s in enumerate(sets):
                k[j, : len(s)] = torch.tensor(s, dtype=torch.int32)
            kept.append(k)
    routing = None
    if return_routing and all(c.get("routed_experts") is not None for c in choices):
        routing = _routing(prompts, tokens, [c["routed_experts"] for c in choices], batch_layout)
    # rows sampled across a sync (one request per row): the oldest version counts
    version = None if any(v is None for v in versions) else min(versions)
    return EngineOutput(tokens=tokens, logprobs=logprobs, kept=kept, routing=routing, weight_version=version)


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
