"""Learn an embedding table back from lookups: `table[idx]` with repeated ids.

Each step draws a batch of token ids (with many repeats, Zipf-like, as real
text has) and the targets `tanh(true_table[idx])`. The gradient of the loss
with respect to the whole table is dense, and the contributions of repeated
ids accumulate (a scatter-add). Each lookup's squared error is weighted by
1 / (how often its id occurs in the batch), so a row's gradient is the mean
of its lookups' and frequent rows do not overshoot; plain SGD then trains the
table inside the compiled step (`gc.train_step`). After training, the rows
that were looked up match the true table.

    python examples/embedding_lookup.py
"""

from __future__ import annotations

import numpy as np

import gradcompiler as gc


def build_embedding_step(vocab: int, lookups: int, dim: int, lr: float):
    """The training step: Σ_k share_k · Σ_d (tanh(table[idx_k]) − target_k)², SGD at `lr`."""
    with gc.Graph("embedding_lookup"):
        table = gc.param("table", (vocab, dim))
        idx = gc.input("idx", (lookups,), "int64")
        target = gc.input("target", (lookups, dim))
        share = gc.input("share", (lookups, 1))  # 1 / the count of idx[k] in the batch
        loss = (share * (gc.tanh(table[idx]) - target) ** 2).sum()
    return gc.train_step(loss, [table], gc.optim.SGD(lr))


def zipf_ids(rng: np.random.Generator, vocab: int, count: int) -> np.ndarray:
    """Ids in [0, vocab) where id k is drawn ∝ 1/(k+1): frequent ids repeat within a batch."""
    weights = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=count, p=weights / weights.sum()).astype(np.int64)


def main(steps: int = 100, vocab: int = 1000, lookups: int = 4096, dim: int = 16,
         lr: float = 0.5, seed: int = 0, verbose: bool = True) -> dict:
    """Train; return the loss history, the error of the frequent rows, and how many ids repeated.

    The loss is the squared error summed over the rows looked up, each row's the mean of
    its lookups'."""
    rng = np.random.default_rng(seed)
    step = build_embedding_step(vocab, lookups, dim, lr)
    true_table = rng.uniform(-1, 1, (vocab, dim)).astype(np.float32)
    state = step.init({"table": np.zeros((vocab, dim), np.float32)})
    history, repeats = [], 0
    for i in range(steps):
        idx = zipf_ids(rng, vocab, lookups)
        repeats = lookups - len(np.unique(idx))
        share = 1.0 / np.bincount(idx, minlength=vocab)[idx, None].astype(np.float32)
        history.append(step(state, idx=idx, target=np.tanh(true_table[idx]), share=share))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps - 1):
            print(f"step {i:4d}  loss {history[-1]:.6f}  ({repeats} repeated ids in the batch)")
    frequent = np.arange(min(vocab, 20))
    row_error = float(np.max(np.abs(state["table"][frequent] - true_table[frequent])))
    if verbose:
        print(f"largest error on the 20 most frequent rows: {row_error:.4f}")
    return dict(losses=history, frequent_row_error=row_error, repeated_ids=repeats)


if __name__ == "__main__":
    main()
