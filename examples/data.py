"""Real data that needs no download, batched deterministically: the batch of step ``i`` is a
function of ``(seed, i)`` alone, so a run resumed from a checkpoint sees the batches an
uninterrupted run would have seen.

- :class:`Digits`: scikit-learn's bundled handwritten digits (1797 grey 8x8 images, 10
  classes), upsampled (nearest neighbour) to ``image_size`` and repeated over 3 channels.
- :class:`Text`: the running interpreter's standard library sources (its ``*.py`` files, in
  sorted order), as characters; the ``vocab - 1`` most frequent characters get their own id
  (ties broken by code point), every other character the last id.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import sysconfig

import numpy as np

#: characters of standard-library source the text corpus reads at most
TEXT_CHARS = 1 << 20


def _rng(seed: int, step: int) -> np.random.Generator:
    return np.random.default_rng([seed, step])


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError(f"the digits come with scikit-learn, which is not installed ({e}); "
                          f"pip install -e '.[examples]'") from e
    bunch = load_digits()
    images = bunch.images / 16.0                          # 0..16 -> 0..1
    images = (images - images.mean()) / images.std()      # one mean and scale for the set
    return images, bunch.target.astype(np.int64)


class Digits:
    """``batch(step)`` -> images ``(batch_size, 3, image_size, image_size)`` and labels
    ``(batch_size,)`` (class ids as ``dtype``, as Gluon's losses take them)."""

    classes = 10

    def __init__(self, batch_size: int, image_size: int, seed: int, dtype: str):
        self.batch_size, self.image_size, self.seed, self.dtype = (batch_size, image_size,
                                                                    seed, dtype)
        images, self.labels = _digits()
        rows = np.arange(image_size) * images.shape[1] // image_size
        cols = np.arange(image_size) * images.shape[2] // image_size
        self.images = images[:, rows][:, :, cols]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        pick = _rng(self.seed, step).integers(0, len(self.labels), self.batch_size)
        grey = self.images[pick][:, None]
        x = np.repeat(grey, 3, axis=1).astype(self.dtype)
        return x, self.labels[pick].astype(self.dtype)

    def fingerprint(self) -> str:
        return f"sklearn-digits:{len(self.labels)}"


@functools.lru_cache(maxsize=1)
def _stdlib_text(limit: int = TEXT_CHARS) -> str:
    folder = sysconfig.get_paths()["stdlib"]
    parts, size = [], 0
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        size += len(parts[-1])
        if size >= limit:
            break
    if not parts:
        raise FileNotFoundError(f"no *.py files in the standard library folder {folder!r}")
    return "".join(parts)[:limit]


class Text:
    """``batch(step)`` -> token ids ``(batch_size, seq_len)`` and the next tokens
    ``(batch_size, seq_len)``, both as ``dtype`` (Gluon's Embedding takes float ids)."""

    def __init__(self, batch_size: int, seq_len: int, vocab: int, seed: int, dtype: str):
        self.batch_size, self.seq_len, self.seed, self.dtype = batch_size, seq_len, seed, dtype
        codes = np.frombuffer(_stdlib_text().encode("utf-32-le"), dtype=np.uint32)
        chars, counts = np.unique(codes, return_counts=True)
        by_frequency = chars[np.lexsort((chars, -counts))]      # most frequent first
        kept = by_frequency[:vocab - 1]
        ids = np.full(len(chars), vocab - 1, dtype=np.int64)    # the rest: one unknown id
        ids[np.searchsorted(chars, kept)] = np.arange(len(kept))
        self.tokens = ids[np.searchsorted(chars, codes)]
        self.vocab = vocab
        self.alphabet = "".join(map(chr, kept))
        if len(self.tokens) <= seq_len + 1:
            raise ValueError(f"the text has {len(self.tokens)} characters, too few for "
                             f"sequences of {seq_len}")

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        starts = _rng(self.seed, step).integers(0, len(self.tokens) - self.seq_len - 1,
                                                self.batch_size)
        window = starts[:, None] + np.arange(self.seq_len + 1)
        tokens = self.tokens[window]
        return tokens[:, :-1].astype(self.dtype), tokens[:, 1:].astype(self.dtype)

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.tokens.astype(np.int32).tobytes()).hexdigest()[:16]
        return f"stdlib-text:{len(self.tokens)}:{digest}"
