"""Training text: documents → tokens → fixed-length sequences, with a deterministic held-out split.

A *document* is a file or a JSONL record. Its split is decided by a hash of its name alone (so adding
files never moves another file across the split), and documents are visited in a seeded hash order
(so a token budget samples the whole corpus, not its first folder). Documents are joined with the
tokenizer's end-of-text token and the stream is cut into ``seq_len`` sequences.

A source with too few documents for that split — one text file, or a few — would leave a split
without a single sequence. Then, and only then, every document is split *by position* instead: it is
cut into blocks of :data:`SPLIT_BLOCK_CHARS` characters and the last ``eval_percent`` % of each
block is held out (:func:`position_split`). Both rules depend only on the source and the recipe, so a
run and its resume read the same splits.

The default source, ``"stdlib"``, is the Python standard library's ``.py`` sources
(``sysconfig.get_paths()["stdlib"]``, without ``site-packages``): real, long, varied text that every
machine with Python already has.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dsv32.train.dsa.config import DataConfig, TrainConfigError

logger = logging.getLogger(__name__)


@dataclass
class Document:
    name: str  # stable id: relative path, or "file.jsonl:LINE"
    path: Path
    line: int | None = None  # JSONL record: its line number (from 0) and its bytes in the file
    offset: int = 0
    size: int = 0
    text: str | None = None  # a document held in memory (``stdlib-docs``): its text

    def read(self, text_field: str) -> str:
        if self.text is not None:
            return self.text
        if self.line is None:
            return self.path.read_text(encoding="utf-8", errors="replace")
        with self.path.open("rb") as f:
            f.seek(self.offset)
            raw = f.read(self.size)
        return _jsonl_text(raw.decode("utf-8"), self.path, self.line, text_field)


def _jsonl_text(raw: str, path: Path, line: int, text_field: str) -> str:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TrainConfigError(f"{path}:{line + 1}: not JSON ({err})") from err
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise TrainConfigError(f"{path}:{line + 1}: no string field {text_field!r} (set data.text_field)")
    return record[text_field]


# A line as text mode reads one: ended by \r\n, \r or \n (or by the end of the file).
_TEXT_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def jsonl_documents(path: Path) -> list[Document]:
    """One document per non-blank line of ``path``, numbered as text mode numbers lines, with its
    byte range (so reading a record is a seek, whatever its place in the file). A line that is not
    UTF-8 is a :class:`TrainConfigError` naming ``FILE:LINE``."""
    docs: list[Document] = []
    line, offset = 0, 0
    with path.open("rb") as f:
        for raw in f:  # split on b"\n"; a lone \r inside a chunk also ends a line in text mode
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                before = raw[: err.start].decode("utf-8")
                line += before.replace("\r\n", "\n").count("\r")
                column = len(before) - max(before.rfind("\r"), -1)
                raise TrainConfigError(
                    f"{path}:{line + 1}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {column}); "
                    "save the file as UTF-8"
                ) from None
            parts = _TEXT_LINE.findall(text) if "\r" in text else [text]
            for part in parts:
                size = len(part.encode("utf-8"))
                if part.strip():
                    docs.append(Document(f"{path.name}:{line}", path, line, offset, size))
                line, offset = line + 1, offset + size
    return docs


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_docs() -> list[Document]:
    """``"stdlib-docs"``: the Python language reference's prose, one document per topic, as the
    interpreter ships it for ``help()`` (``pydoc_data.topics``, about 460,000 characters of English
    reStructuredText). Prose, not code: held-out text of another kind than ``"stdlib"``'s sources.
    Each document's ``path`` is the module's file, so a run that evaluates on these documents can
    leave that file out of its ``"stdlib"`` training text (:func:`exclude_documents`)."""
    from pydoc_data import topics

    path = Path(topics.__file__)
    return [Document(f"stdlib-docs/{name}", path, text=text) for name, text in sorted(topics.topics.items())]


def exclude_documents(docs: list[Document], other: list[Document]) -> list[Document]:
    """``docs`` without any document read from a file that one of ``other`` is read from (the
    training text of a run that holds ``other`` out whole)."""
    taken = {d.path.resolve() for d in other}
    return [d for d in docs if d.path.resolve() not in taken]


def list_documents(cfg: DataConfig) -> list[Document]:
    """Every document of ``cfg.source`` (unordered)."""
    docs: list[Document] = []
    for source in [s.strip() for s in cfg.source.split(",") if s.strip()]:
        if source == "stdlib-docs":
            docs.extend(stdlib_docs())
            continue
        if source == "stdlib":
            root = stdlib_root()
            for path in root.rglob("*.py"):
                rel = path.relative_to(root)
                if "site-packages" not in rel.parts and path.is_file():
                    docs.append(Document(f"stdlib/{rel.as_posix()}", path))
            continue
        path = Path(source)
        if path.is_dir():
            exts = {e.lower() for e in cfg.extensions}
            for file in path.rglob("*"):
                if file.is_file() and file.suffix.lower() in exts:
                    docs.append(Document(file.relative_to(path).as_posix(), file))
        elif path.is_file() and path.suffix.lower() == ".jsonl":
            docs.extend(jsonl_documents(path))
        elif path.is_file():
            docs.append(Document(path.name, path))
        else:
            raise TrainConfigError(
                f"data source {source!r} is neither 'stdlib', 'stdlib-docs' nor an existing file or directory"
            )
    if not docs:
        raise TrainConfigError(f"data source {cfg.source!r} holds no documents (extensions {cfg.extensions})")
    return docs


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


def is_held_out(name: str, eval_percent: float) -> bool:
    """Deterministic per-document split: True for about ``eval_percent`` % of names."""
    return _hash(f"split:{name}") % 10_000 < eval_percent * 100


#: Block length of the position split: the held-out text of a document is spread over it every this
#: many characters.
SPLIT_BLOCK_CHARS = 20_000


def position_split(text: str, eval_percent: float) -> list[tuple[bool, str]]:
    """A document's text as ``(held_out, piece)`` pieces in order: each block of
    :data:`SPLIT_BLOCK_CHARS` characters (the last one shorter) gives its first part to training
    and its last ``eval_percent`` % (rounded to whole characters) to the held-out split."""
    pieces: list[tuple[bool, str]] = []
    for start in range(0, len(text), SPLIT_BLOCK_CHARS):
        block = text[start : start + SPLIT_BLOCK_CHARS]
        cut = len(block) - round(len(block) * eval_percent / 100)
        pieces += [(held, part) for held, part in ((False, block[:cut]), (True, block[cut:])) if part]
    return pieces


@dataclass
class TokenData:
    """Packed token streams of the two splits; ``seq_len`` is the training length."""

    train_stream: torch.Tensor  # [N] int64
    eval_stream: torch.Tensor  # [M] int64
    seq_len: int
    source: str = ""

    def train_sequences(self, seq_len: int | None = None) -> torch.Tensor:
        return _pack(self.train_stream, seq_len or self.seq_len)

    def eval_sequences(self, seq_len: int | None = None, limit: int | None = None) -> torch.Tensor:
        seqs = _pack(self.eval_stream, seq_len or self.seq_len)
        return seqs if limit is None else seqs[:limit]

    @classmethod
    def from_sequences(cls, train: torch.Tensor, eval: torch.Tensor) -> TokenData:
        """From ready ``[N, T]`` token tensors (tests, custom pipelines)."""
        return cls(train.reshape(-1).long(), eval.reshape(-1).long(), train.shape[-1], "tensors")


def _pack(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def separator_id(tokenizer) -> int:
    """The document separator: ``<|endoftext|>`` when the vocabulary has it, else the EOS token."""
    vocab = tokenizer.get_vocab()
    if "<|endoftext|>" in vocab:
        return int(vocab["<|endoftext|>"])
    if tokenizer.eos_token_id is None:
        raise TrainConfigError(
            "the tokenizer has neither <|endoftext|> nor an EOS token to separate documents"
        )
    return int(tokenizer.eos_token_id)


def load_token_data(
    cfg: DataConfig, tokenizer, train_tokens: int, eval_tokens: int, docs: list[Document] | None = None
) -> TokenData:
    """Tokenize documents (seeded hash order) until each split has its budget — ``train_tokens`` /
    ``eval_tokens``, capped by ``cfg.max_*_tokens`` — or the corpus ends. ``docs``: the source's
    documents when already listed (:func:`list_documents`, which checks the source without a model)."""
    if cfg.max_train_tokens is not None:
        train_tokens = min(train_tokens, cfg.max_train_tokens)
    if cfg.max_eval_tokens is not None:
        eval_tokens = min(eval_tokens, cfg.max_eval_tokens)
    docs = in_order(list_documents(cfg) if docs is None else docs, cfg.seed)
    budget = {False: train_tokens, True: eval_tokens}
    streams = _tokenize(docs, cfg, tokenizer, budget, by_position=False)
    if min(len(streams[False]), len(streams[True])) < cfg.seq_len:
        logger.info(
            "data: split by document, %r gives %d train / %d held-out tokens (less than one sequence of "
            "%d in a split): splitting every document by position instead",
            cfg.source, len(streams[False]), len(streams[True]), cfg.seq_len,
        )  # fmt: skip
        streams = _tokenize(docs, cfg, tokenizer, budget, by_position=True)
    for held, name in ((False, "train"), (True, "held-out")):
        if len(streams[held]) < budget[held]:
            logger.info(
                "data: the %s split has %d tokens (< %d asked)", name, len(streams[held]), budget[held]
            )
    train = torch.tensor(streams[False][:train_tokens], dtype=torch.long)
    held_out = torch.tensor(streams[True][:eval_tokens], dtype=torch.long)
    if train.numel() < cfg.seq_len or held_out.numel() < cfg.seq_len:
        raise TrainConfigError(
            f"data source {cfg.source!r} gives {train.numel()} train / {held_out.numel()} held-out tokens "
            f"even with every document split by position ({cfg.eval_percent:g} % of each block held out): "
            f"not one sequence of {cfg.seq_len} in each (add text, lower data.seq_len, or change "
            "data.eval_percent)"
        )
    return TokenData(train, held_out, cfg.seq_len, cfg.source)


def in_order(docs: list[Document], seed: int) -> list[Document]:
    """``docs`` in the seeded hash order every token budget reads them in."""
    return sorted(docs, key=lambda d: _hash(f"order:{seed}:{d.name}"))


def held_out_stream(docs: list[Document], cfg: DataConfig, tokenizer, tokens: int) -> torch.Tensor:
    """A source held out whole (``eval.off_domain``): its documents in the seeded hash order, joined by
    the separator, until ``tokens`` tokens (or the documents end)."""
    sep = separator_id(tokenizer)
    stream: list[int] = []
    for doc in in_order(docs, cfg.seed):
        if len(stream) >= tokens:
            break
        text = doc.read(cfg.text_field)
        if text.strip():
            stream += [*_encode(tokenizer, text), sep]
    return torch.tensor(stream[:tokens], dtype=torch.long)


def _tokenize(
    docs: list[Document], cfg: DataConfig, tokenizer, budget: dict[bool, int], by_position: bool
) -> dict[bool, list[int]]:
    """The token streams of the two splits (``False``: train, ``True``: held-out), each piece of text
    followed by the separator, until both budgets are met or the documents end."""
    sep = separator_id(tokenizer)
    streams: dict[bool, list[int]] = {False: [], True: []}
    for doc in docs:
        if all(len(streams[h]) >= budget[h] for h in (False, True)):
            break
        held = None if by_position else is_held_out(doc.name, cfg.eval_percent)
        if held is not None and len(streams[held]) >= budget[held]:
            continue
        text = doc.read(cfg.text_field)
        if not text.strip():
            continue
        pieces = position_split(text, cfg.eval_percent) if held is None else [(held, text)]
        for part_held, piece in pieces:
            if len(streams[part_held]) < budget[part_held]:
                streams[part_held].extend(_encode(tokenizer, piece))
                streams[part_held].append(sep)
    return streams


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def sequence_order(num_sequences: int, seed: int, start: int, count: int) -> list[int]:
    """Sequence ids at stream positions ``start .. start + count - 1`` of an endless stream of
    seeded permutations of ``range(num_sequences)`` (one permutation per pass over the data)."""
    out: list[int] = []
    perm_epoch, perm = -1, None
    for pos in range(start, start + count):
        epoch = pos // num_sequences
        if epoch != perm_epoch:
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perm, perm_epoch = torch.randperm(num_sequences, generator=g).tolist(), epoch
        out.append(perm[pos % num_sequences])
    return out


def iter_batches(ids: list[int], batch_size: int) -> Iterator[list[int]]:
    for a in range(0, len(ids), batch_size):
        yield ids[a : a + batch_size]
