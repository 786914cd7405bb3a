"""Evaluation of a DSA model: perplexity dense vs sparse, and how much attention the indexer keeps.

For each sequence length L and top-k on held-out sequences:

- ``ppl_dense`` — the model with dense attention; ``ppl_dsa`` — with DSA at top-k (Eq. 2);
  ``ppl_dsa_untrained`` — DSA with freshly initialized indexers (same seeds as :func:`attach_dsa`);
  ``ppl_dsa_oracle`` — DSA attending to the oracle top-k (the keys with the largest head-summed dense
  attention): the best any indexer could do at this k, so ``ppl_dsa / ppl_dsa_oracle`` is what is
  left for indexer training to win;
- ``attention_recall`` — share of the dense attention mass (head-averaged) inside the indexer's
  top-k, averaged over layers, heads and the queries that see more than k keys (for the others any
  selection is complete, so they are left out); ``attention_recall_oracle`` — the same for the best
  possible k keys (top-k of the true head-summed attention); ``attention_recall_untrained``;
- a per-layer breakdown of the three recalls.

Recall and the untrained baseline need a Hugging Face model with :func:`dsv32.dsa.attach_dsa` (the
evaluator observes each layer's queries/keys); for the native model only perplexities are reported.
One dense pass gives the dense perplexity and every recall; each top-k costs one sparse pass (two
with the untrained baseline).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from dsv32.dsa.hf import LayerView, get_dsa, random_indexers
from dsv32.dsa.loss import RecallSums, attention_recall

logger = logging.getLogger(__name__)


@dataclass
class EvalPoint:
    """Results at one (sequence length, top-k)."""

    seq_len: int
    topk: int
    sequences: int
    tokens: int
    ppl_dense: float
    ppl_dsa: float
    ppl_dsa_untrained: float | None = None
    ppl_dsa_oracle: float | None = None
    attention_recall: float | None = None
    attention_recall_oracle: float | None = None
    attention_recall_untrained: float | None = None
    recall_queries: int = 0
    per_layer: list[dict] = field(default_factory=list)  # {layer, recall, oracle, untrained}
    by_position: list[dict] = field(default_factory=list)  # gap_by_position's rows

    @property
    def ppl_gap(self) -> float:
        """Relative perplexity increase of DSA over dense."""
        return self.ppl_dsa / self.ppl_dense - 1

    def to_dict(self) -> dict:
        return asdict(self) | {"ppl_gap": self.ppl_gap}


def _ppl(nll: float, n: int) -> float:
    return math.exp(nll / max(1, n))


@torch.no_grad()
def _nll(dm, seqs: torch.Tensor, batch_size: int, observer=None) -> tuple[float, int, torch.Tensor]:
    """Summed NLL, predicted tokens, and the NLL summed over sequences per position ``[T - 1]``."""
    per_position = torch.zeros(seqs.shape[1] - 1, dtype=torch.float64)
    handle = get_dsa(dm.model) if observer is not None else None
    for a in range(0, seqs.shape[0], batch_size):
        ids = seqs[a : a + batch_size].to(dm.device)
        with handle.observing(observer) if handle is not None else contextlib.nullcontext():
            per_position += dm.token_nll(ids).sum(0).double().cpu()
    return float(per_position.sum()), seqs.shape[0] * per_position.numel(), per_position


def position_buckets(length: int, topk: int) -> list[tuple[int, int]]:
    """Query positions ``[start, end)`` of a ``length``-token sequence (positions ``0 … length - 2``
    predict the next token): first those that see at most ``topk`` keys (DSA is exact there), then
    buckets doubling from ``topk``."""
    last = length - 1
    edges = [0]
    edge = min(topk, last)
    while edge < last:
        edges.append(edge)
        edge *= 2
    edges.append(last)
    return list(itertools.pairwise(edges))


def gap_by_position(
    length: int,
    topk: int,
    n_sequences: int,
    dense: torch.Tensor,
    sparse: torch.Tensor,
    oracle: torch.Tensor | None,
) -> list[dict]:
    """Where in the sequence the DSA loss goes: per :func:`position_buckets` bucket, perplexity dense,
    DSA and oracle top-k, and DSA's gap over dense."""
    rows = []
    for a, b in position_buckets(length, topk):
        n = (b - a) * n_sequences
        d, p = _ppl(float(dense[a:b].sum()), n), _ppl(float(sparse[a:b].sum()), n)
        o = None if oracle is None else _ppl(float(oracle[a:b].sum()), n)
        rows.append({"start": a, "end": b, "tokens": n, "ppl_dense": d, "ppl_dsa": p, "ppl_dsa_oracle": o,
                     "ppl_gap": p / d - 1})  # fmt: skip
    return rows


class _RecallObserver:
    """Per layer, the recall of the trained (and untrained) indexers' top-k for each k, and the
    oracle's, from the dense pass's queries/keys."""

    def __init__(self, topks: list[int], untrained: dict | None) -> None:
        self.topks = topks
        self.untrained = untrained
        self.sums: dict[tuple[str, int, int], RecallSums] = {}  # (which, k, layer)

    def __call__(self, view: LayerView) -> None:
        T = view.q.shape[1]
        sels = {}
        for k in self.topks:
            if k >= T:
                continue
            sels[f"trained:{k}"] = view.topk(k)
            if self.untrained is not None:
                sels[f"untrained:{k}"] = view.topk(k, self.untrained[view.layer_idx])
        if not sels:
            return
        res = attention_recall(view.q, view.k, sels, scale=view.scale, key_padding_mask=view.key_padding_mask)
        for name, sums in res.items():
            which, k = name.split(":")
            key = (which, int(k), view.layer_idx)
            self.sums.setdefault(key, RecallSums()).add(sums)

    def summary(self, k: int) -> tuple[float | None, float | None, float | None, int, list[dict]]:
        """(recall, oracle, untrained recall, queries, per-layer rows) at top-k, averaged over layers."""
        layers = sorted({layer for which, kk, layer in self.sums if kk == k and which == "trained"})
        if not layers:
            return None, None, None, 0, []
        rows = []
        for layer in layers:
            t = self.sums[("trained", k, layer)]
            u = self.sums.get(("untrained", k, layer))
            rows.append(
                {
                    "layer": layer,
                    "recall": t.mean_recall,
                    "oracle": t.mean_oracle,
                    "untrained": None if u is None else u.mean_recall,
                }
            )
        mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        untrained = mean("untrained") if all(r["untrained"] is not None for r in rows) else None
        queries = self.sums[("trained", k, layers[0])].queries
        return mean("recall"), mean("oracle"), untrained, queries, rows


def evaluate_dsa(
    dm,
    sequences: dict[int, torch.Tensor],
    topks: list[int],
    *,
    batch_size: int = 1,
    untrained: bool = True,
    recall: bool = True,
    oracle: bool = True,
    ppl_dense: dict[int, float] | None = None,
    progress: bool = True,
) -> list[EvalPoint]:
    """Evaluate ``dm`` (a :class:`dsv32.train.DSAModel`) on held-out ``sequences`` (``{L: [N, L]}``) at
    each top-k. ``ppl_dense`` may pass already-known dense perplexities per length (skips their pass
    when no recall is asked). The model's DSA mode and top-k are restored afterwards."""
    hf = dm.kind == "hf"
    if not hf:
        untrained = recall = oracle = False
    fresh = random_indexers(dm.model) if hf and untrained else None
    old_mode, old_k = (get_dsa(dm.model).mode if hf else "sparse"), dm.topk
    points: list[EvalPoint] = []
    was_training = dm.model.training
    dm.model.eval()
    try:
        for L, seqs in sequences.items():
            t0 = time.time()
            observer = _RecallObserver(topks, fresh) if recall else None
            dm.set_mode("dense")
            dense_pos = None
            if ppl_dense is not None and L in ppl_dense and observer is None:
                dense, tokens = ppl_dense[L], seqs.shape[0] * (L - 1)
            else:
                nll, tokens, dense_pos = _nll(dm, seqs, batch_size, observer)
                dense = _ppl(nll, tokens)
            _log(progress, f"eval L={L}: dense ppl {dense:.4f} ({time.time() - t0:.0f} s)")
            for k in topks:
                t1 = time.time()
                dm.set_mode("sparse", k)
                nll, _, sparse_pos = _nll(dm, seqs, batch_size)
                sparse = _ppl(nll, tokens)
                base = None
                if fresh is not None:
                    with get_dsa(dm.model).using_indexers(fresh):
                        base = _ppl(*_nll(dm, seqs, batch_size)[:2])
                best = oracle_pos = None
                if oracle and k < L:
                    with get_dsa(dm.model).selecting_oracle():
                        nll, _, oracle_pos = _nll(dm, seqs, batch_size)
                        best = _ppl(nll, tokens)
                elif oracle:
                    best, oracle_pos = sparse, sparse_pos  # top-k >= L: every selection is complete
                by_position = (
                    [] if dense_pos is None
                    else gap_by_position(L, k, seqs.shape[0], dense_pos, sparse_pos, oracle_pos)
                )  # fmt: skip
                rec, orc, unt, queries, rows = observer.summary(k) if observer else (None, None, None, 0, [])
                if observer is not None and k >= L:  # every query selects all it sees
                    rec = orc = 1.0
                    unt = 1.0 if fresh is not None else None
                points.append(
                    EvalPoint(
                        seq_len=L,
                        topk=k,
                        sequences=seqs.shape[0],
                        tokens=tokens,
                        ppl_dense=dense,
                        ppl_dsa=sparse,
                        ppl_dsa_untrained=base,
                        ppl_dsa_oracle=best,
                        attention_recall=rec,
                        attention_recall_oracle=orc,
                        attention_recall_untrained=unt,
                        recall_queries=queries,
                        per_layer=rows,
                        by_position=by_position,
                    )
                )
                msg = f"eval L={L} k={k}: DSA ppl {sparse:.4f}"
                if base is not None:
                    msg += f", untrained {base:.4f}"
                if best is not None:
                    msg += f", oracle top-k {best:.4f}"
                if rec is not None:
                    msg += f"; recall {rec:.4f} (oracle {orc:.4f})"
                _log(progress, msg + f" ({time.time() - t1:.0f} s)")
    finally:
        dm.set_mode(old_mode, old_k)
        dm.model.train(was_training)
    return points


def _log(progress: bool, msg: str) -> None:
    if progress:
        logger.info(msg)
