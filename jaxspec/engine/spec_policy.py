"""Each step's draft length k, from 0 (verify nothing, draft nothing) to num_speculative_tokens = K.

A fixed k is right for one batch size and one acceptance rate only: at high batch the verify step is
compute-bound and drafts that are rarely accepted cost more than they give. Three policies, chosen by
`speculative_config` (jaxspec.config.SpeculativeConfig):

- fixed (the default): k = K every step.
- a table, `"num_speculative_tokens_per_batch_size": {"1": 3, "32": 1, "96": 0}`: k for the largest listed
  batch size not above the step's number of decode rows (vLLM's static per-batch-size schedule).
- `"dynamic": true`: the k that maximizes expected tokens per second,

      rate(k) = sum over the step's rows r of E_r(k)  /  t(B, k)
      E_r(k) = 1 + sum_{j < k} prod_{i <= j} a_r[i]

  where t(B, k) is the step time of padded batch B with k drafts, measured at warm-up, and a_r[i] the
  probability that draft position i is accepted once every earlier one was: counted over recent steps (counts
  decay by DECAY per step), per slot (the request in it) shrunk toward the global rate, which is shrunk toward
  PRIOR. Positions no recent step offered drift back to the prior, so a policy that stopped speculating tries
  again after a while.

Whatever k a step runs with, the output is lossless: drafts are verified by rejection sampling, and a step never
accepts more drafts than the previous step made (SlotState.num_drafts).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.98  # per step: the global counts describe about the last 50 steps
SLOT_DECAY = 0.9  # per step the slot is observed: a request's own recent drafts
PRIOR = 0.6  # conditional acceptance of a position nobody has measured
PRIOR_WEIGHT = 8.0  # pseudo-observations behind the prior
SLOT_WEIGHT = 4.0  # pseudo-observations of the global rate behind each slot's own


class SpecPolicy:
    """A fixed k (default K) every step; the base of the others. `choices`: the k values it may pick (the decode
    programs to compile)."""

    def __init__(self, max_k: int, k: int | None = None):
        self.max_k = max_k
        self.k = max_k if k is None else k
        if not 0 <= self.k <= max_k:
            raise ValueError(f"k={self.k} must be in [0, num_speculative_tokens={max_k}]")
        self.choices = [self.k]
        self.num_steps_by_k = {k: 0 for k in self.choices}

    def choose(self, num_rows: int, bucket: int, slots: np.ndarray) -> int:
        return self.k

    def observe(self, slots: np.ndarray, k: int, num_accepted: np.ndarray) -> None:
        """One committed step: the rows' slots and how many drafts each accepted (of k)."""

    def reset_slots(self, slots: list[int]) -> None:
        """New requests in these slots."""

    def record(self, k: int) -> None:
        self.num_steps_by_k[k] = self.num_steps_by_k.get(k, 0) + 1


class TablePolicy(SpecPolicy):
    def __init__(self, max_k: int, table: dict[int, int]):
        super().__init__(max_k)
        self.sizes = sorted(table)
        self.values = [table[b] for b in self.sizes]
        self.choices = sorted(set(self.values))
        self.num_steps_by_k = {k: 0 for k in self.choices}

    def choose(self, num_rows: int, bucket: int, slots: np.ndarray) -> int:
        i = np.searchsorted(self.sizes, num_rows, side="right") - 1
        return self.values[max(i, 0)]


class DynamicPolicy(SpecPolicy):
    def __init__(self, max_k: int, num_slots: int):
        super().__init__(max_k)
        self.choices = list(range(max_k + 1))
        self.num_steps_by_k = {k: 0 for k in self.choices}
        self.reached = np.zeros(max_k)  # decayed counts per position, all rows
        self.accepted = np.zeros(max_k)
        self.slot_reached = np.zeros((num_slots + 1, max_k))
        self.slot_accepted = np.zeros((num_slots + 1, max_k))
        self.step_times: dict[tuple[int, int], float] = {}  # (bucket, k) -> seconds

    def set_step_times(self, times: dict[tuple[int, int], float]) -> None:
        self.step_times = dict(times)

    def reset_slots(self, slots: list[int]) -> None:
        self.slot_reached[slots] = 0.0
        self.slot_accepted[slots] = 0.0

    def observe(self, slots: np.ndarray, k: int, num_accepted: np.ndarray) -> None:
        self.reached *= DECAY
        self.accepted *= DECAY
        if k == 0 or not len(slots):
            return
        j = np.arange(self.max_k)
        n = np.asarray(num_accepted)[:, None]
        reached = (j <= n) & (j < k)  # [rows, K]: every earlier draft accepted, and this one offered
        accepted = j < n
        self.reached += reached.sum(axis=0)
        self.accepted += accepted.sum(axis=0)
        self.slot_reached[slots] = self.slot_reached[slots] * SLOT_DECAY + reached
        self.slot_accepted[slots] = self.slot_accepted[slots] * SLOT_DECAY + accepted

    def acceptance(self, slots: np.ndarray) -> np.ndarray:
        """a[r, i]: the estimated conditional acceptance of draft position i for each row's slot."""
        rate = (self.accepted + PRIOR_WEIGHT * PRIOR) / (self.reached + PRIOR_WEIGHT)  # [K]
        return (self.slot_accepted[slots] + SLOT_WEIGHT * rate) / (self.slot_reached[slots] + SLOT_WEIGHT)

    def expected_tokens(self, slots: np.ndarray) -> np.ndarray:
        """[K + 1]: the tokens a step with k = 0..K is expected to emit, summed over the rows."""
        reach = np.cumprod(self.acceptance(slots), axis=1).sum(axis=0)  # [K]: sum_r prod_{i<=j} a_r[i]
        return len(slots) + np.concatenate([[0.0], np.cumsum(reach)])

    def choose(self, num_rows: int, bucket: int, slots: np.ndarray) -> int:
        times = np.array([self.step_times.get((bucket, k), np.nan) for k in self.choices])
        if np.isnan(times).any():  # not measured (a policy set up without warm-up): speculate fully
            return self.max_k
        rate = self.expected_tokens(np.asarray(slots)) / times
        return int(np.argmax(rate >= rate.max() * (1 - 1e-3)))  # the smallest k within 0.1 % of the best


def make_policy(spec, num_slots: int) -> SpecPolicy:
    """The policy a SpeculativeConfig asks for (None: no head, k = 0 always)."""
    if spec is None:
        return SpecPolicy(0)
    if spec.dynamic:
        return DynamicPolicy(spec.num_speculative_tokens, num_slots)
    if spec.num_speculative_tokens_per_batch_size:
        return TablePolicy(spec.num_speculative_tokens, spec.num_speculative_tokens_per_batch_size)
    return SpecPolicy(spec.num_speculative_tokens)
