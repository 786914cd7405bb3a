"""The wire format of a rollout engine over HTTP, one typed model for both ends, and the sampling bounds
every route of ``dsv32 serve`` shares.

``dsv32 serve`` validates what it receives with these models (:mod:`dsv32.serve.rl_routes`,
:mod:`dsv32.serve.protocol`) and the remote rollout engine builds its requests and reads the replies
with them (:mod:`dsv32.rl.engines.remote`), so the two cannot drift apart. pydantic only, no web
framework.

- ``POST /inference/v1/generate`` (vLLM's token-in/token-out route): :class:`GenerateRequest` with its
  :class:`GenerateParams` → :class:`GenerateResponse`, one :class:`GenerateChoice` per prompt (token
  ids, sampling log-probs, kept sets, routed experts; vLLM's per-choice ``weight_versions`` spans and
  base64 ``routed_experts`` are read too);
- ``POST /update_weights`` (:class:`UpdateWeightsRequest`), ``POST /init_weight_transfer_engine``
  (:class:`InitTransferRequest`), ``GET /weight_info`` (:class:`WeightInfo`), ``GET /v1/models``
  (:class:`ModelList`).

Sampling bounds, the same on ``/v1/completions``, ``/v1/chat/completions`` and
``/inference/v1/generate`` (the same fields, hence the same messages): ``temperature`` a finite
number in [0, 2] (below 1e-5 decodes greedily), ``top_p`` in (0, 1], ``top_k`` -1 or 0 (both off:
-1 is vLLM's word for it, 0 dsv32's) or a number of tokens >= 1, ``seed`` a signed 64-bit integer,
``max_tokens`` >= 1. Requests take JSON's types as they are: a token id is an integer, never a
string, a float or a boolean. Unknown fields of a request are ignored, as vLLM ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
TopK = Annotated[int, Field(ge=-1)]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63)]
MaxTokens = Annotated[int, Field(ge=1)]
WeightVersion = Annotated[int, Field(ge=0, lt=2**63)]
TransferTimeout = Annotated[float, Field(gt=0.0, le=600.0, allow_inf_nan=False)]
# a host name or an IPv4/IPv6 address, as a TCP store takes it
Host = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:%-]+$")]


def engine_top_k(top_k: int) -> int:
    """``top_k`` as :func:`dsv32.engine.generate` takes it: 0 for off (-1 and 0 on the wire)."""
    return max(0, top_k)


def problems(err: ValidationError, limit: int = 3) -> str:
    """The first ``limit`` problems of ``err`` as ``"choices[0].token_ids[2]: Input should be ..."``."""
    out = []
    for e in err.errors()[:limit]:
        where = ""
        for step in e.get("loc", ()):
            where += f"[{step}]" if isinstance(step, int) else (f".{step}" if where else str(step))
        out.append(f"{where or 'the body'}: {e.get('msg')}")
    more = len(err.errors()) - limit
    return "; ".join(out) + (f" (and {more} more)" if more > 0 else "")


class _Request(BaseModel):
    """A request: JSON's types as they are (``"5"`` or ``true`` is not an integer); unknown fields
    ignored, as vLLM ignores them."""

    model_config = ConfigDict(strict=True, extra="ignore")


class _Reply(BaseModel):
    """A reply: the types checked, fields this side does not read ignored (vLLM sends more)."""

    model_config = ConfigDict(strict=True, extra="ignore")


# ---------------------------------------------------------------------- POST /inference/v1/generate
class GenerateParams(_Request):
    """``sampling_params`` of a generate request (vLLM's names). ``logprobs``: any count asks for the
    sampled token's log-prob (of the truncated, renormalized distribution sampled from);
    ``return_sampling_mask``: the kept top-k/top-p set per generated token;
    ``return_routed_experts``: the MoE routing (native V3.2 models); ``return_indexer_topk``: the
    keys each position's DSA layers attended to (Keep Indexing; a model with DSA in sparse mode);
    ``ignore_eos``: decode to ``max_tokens`` past every stop token (vLLM's benchmark setting)."""

    max_tokens: MaxTokens = 16
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = -1
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0)
    return_sampling_mask: bool = False
    return_routed_experts: bool = False
    return_indexer_topk: bool = False
    seed: Seed | None = None


class GenerateRequest(_Request):
    """``token_ids``: one prompt, or a list of prompts (one batch, left-padded with
    ``pad_token_id`` to the longest)."""

    model: str | None = None
    token_ids: list[int] | list[list[int]]
    sampling_params: GenerateParams = Field(default_factory=GenerateParams)
    stream: bool = False
    pad_token_id: int | None = None

    @field_validator("token_ids", mode="before")
    @classmethod
    def _token_lists(cls, value: Any) -> Any:
        """One message that says where, instead of one per member of the union."""
        shape = "a list of token ids (one prompt) or a list of such lists (a batch)"
        if not isinstance(value, list):
            raise ValueError(f"must be {shape}")
        batched = bool(value) and isinstance(value[0], list)
        for i, row in enumerate(value if batched else [value]):
            if not isinstance(row, list):
                raise ValueError(f"must be {shape}; item {i} is not a list")
            for j, t in enumerate(row):
                if type(t) is not int:
                    where = f"[{i}][{j}]" if batched else f"[{j}]"
                    raise ValueError(f"token_ids{where} is {t!r}: a token id is a JSON integer")
        return value

    @property
    def batched(self) -> bool:
        return bool(self.token_ids) and isinstance(self.token_ids[0], list)

    @property
    def prompts(self) -> list[list[int]]:
        return [list(x) for x in self.token_ids] if self.batched else [list(self.token_ids)]


class TokenLogprob(_Reply):
    token_id: int | None = None
    logprob: float


class ChoiceLogprobs(_Reply):
    content: list[TokenLogprob] | None = None


class VersionSpan(_Reply):
    """vLLM: tokens ``[start, end)`` of a choice were sampled by weights ``version``."""

    version: int | str | None = None
    start: int | None = None
    end: int | None = None


class GenerateChoice(_Reply):
    """One prompt's continuation. ``logprobs``: the sampling log-prob of each generated token;
    ``sampling_mask``: per generated token the kept ids; ``routed_experts``: per position and MoE
    layer the experts (nested lists, or vLLM's base64 ``.npy``); ``weight_versions``: vLLM's spans."""

    index: int = 0
    token_ids: list[int]
    logprobs: ChoiceLogprobs | list[float] | None = None
    finish_reason: str | None = None
    sampling_mask: list[list[int]] | None = None
    routed_experts: list[list[list[int]]] | str | None = None
    weight_versions: list[VersionSpan] | None = None
    #: Keep Indexing: base64 of little-endian int32 ``[positions, DSA layers, index_topk]`` (row
    #: positions of the selected keys, −1 empty; :func:`encode_topk`) laid out as ``routed_experts``
    indexer_topk: str | None = None
    indexer_topk_shape: list[int] | None = None

    def sampling_logprobs(self) -> list[float] | None:
        """The log-prob of every generated token, or None when the reply has none for each."""
        lp = self.logprobs
        if isinstance(lp, ChoiceLogprobs):
            lp = None if lp.content is None else [e.logprob for e in lp.content]
        return lp if lp is not None and len(lp) == len(self.token_ids) else None


class Usage(_Reply):
    prompt_tokens: int
    completion_tokens: int


class GenerateResponse(_Reply):
    """``weight_version``: the version of the weights that sampled (None: never updated);
    ``pad_token_id``: the id a batch's prompts were left-padded with (a batch only)."""

    id: str | None = None
    object: str | None = None
    model: str | None = None
    choices: list[GenerateChoice]
    usage: Usage | None = None
    weight_version: int | str | None = None
    pad_token_id: int | None = None


# ---------------------------------------------------------------------- weights
class UpdateWeightsRequest(_Request):
    """``{"path", "weight_version"}`` (a weight file on the engine's disk) or ``{"weight_version",
    "names", "dtypes", "shapes"}`` (the tensors that follow over the transfer group)."""

    path: str | None = None
    weight_version: WeightVersion
    names: list[str] | None = None
    dtypes: list[str] | None = None
    shapes: list[list[Annotated[int, Field(ge=0)]]] | None = None


class UpdateAdapterRequest(_Request):
    """``{"path", "weight_version"}``: a LoRA adapter directory in peft's save format on the engine's
    disk, merged into the base weights the engine serves."""

    path: str = Field(min_length=1, max_length=4096)
    weight_version: WeightVersion


class InitTransferRequest(_Request):
    """Join the trainer's two-party group at ``master_address:master_port`` as rank 1; every wait
    at most ``timeout`` seconds (None ``backend``: by the engine's device)."""

    master_address: Host
    master_port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] | None = None
    timeout: TransferTimeout = 60.0


class TransferState(_Reply):
    backend: str | None = None
    receiving: bool = False
    error: str | None = None


class WeightInfo(_Reply):
    weight_version: int | str | None = None
    path: str | None = None
    model: str | None = None
    adapter: bool | None = None
    transfer: TransferState | None = None


class ModelCard(_Reply):
    id: str


class ModelList(_Reply):
    data: list[ModelCard] = Field(default_factory=list)


def encode_topk(selection) -> tuple[str, list[int]]:
    """An integer array ``[positions, layers, k]`` → (base64 of its little-endian int32 bytes, shape)."""
    import base64

    import numpy as np

    a = np.ascontiguousarray(np.asarray(selection), dtype="<i4")
    return base64.b64encode(a.tobytes()).decode("ascii"), list(a.shape)


def decode_topk(data: str, shape: list[int]):
    """:func:`encode_topk`'s output → an int32 numpy array of ``shape``; ``ValueError`` when the bytes
    do not hold that shape."""
    import base64
    import binascii

    import numpy as np

    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error as err:
        raise ValueError(f"indexer_topk is not base64: {err}") from err
    if len(shape) != 3 or any(n < 0 for n in shape) or len(raw) != 4 * int(np.prod(shape)):
        raise ValueError(f"indexer_topk holds {len(raw)} bytes, not int32 of shape {shape}")
    return np.frombuffer(raw, dtype="<i4").reshape(shape).astype(np.int32)


def as_version(value: int | str | None) -> int | None:
    """A reported weight version as a trainer's step number; None when absent or not a number
    (vLLM's versions are strings)."""
    if isinstance(value, int):
        return value
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
