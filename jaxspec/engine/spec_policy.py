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

  where t(B, k) is the step time of padded batch B with k drafts, measured at warm-up (ModelRunner.time_decode) and
  fitted non-decreasing in k, and a_r[i] the probability that draft position i is accepted once every earlier one
  was: counted over recent steps and the rows offered that position (prompt lookup, a head's fallback, may offer
  a row fewer than k) (counts decay by DECAY per step that offered the position), per slot (the request
  in it) shrunk toward the global rate, which is shrunk toward PRIOR. A position no step offers keeps its estimate,
  forgotten toward the prior only slowly (IDLE_DECAY per step, a memory of about 500 steps): a policy that stopped
  speculating tries again after a while, and one that settled on a small k does not keep re-trying a large one on
  stale hopes (at DECAY, it spent a third of its steps at k = 3 on chat prompts where k = 1 was best).

The policy runs on the host at every step, between the device's steps, so its bookkeeping is a dozen numpy
operations on [rows, 2K] arrays, not a loop over rows; and it runs them rarely. A step's observation is queued and
folded in when the next decision needs it, each run of steps over the same rows with the same k in one pass (the
same arithmetic up to rounding: a count decaying by f a step ends at count * f^G + sum_g new_g f^(G-1-g)), and a
decision stands for REDECIDE_EVERY steps while the batch stays about the same: the same bucket, with at most
1/CHANGED_ROWS of its rows (at least one) finished or new since the decision; each new decision that confirms the
standing one (the same bucket and k) lets the next stand twice as long, up to MAX_STANDING steps, and one that
changes k starts again from REDECIDE_EVERY (a steady batch: a decision every 32 steps, not every 4). The estimates
move ~2 % a step, and a batch whose requests finish one after another changes a little at almost every step:
redeciding whenever the rows differed at all made the policy cost 0.17-0.25 ms a step of host work at 256 rows on
the CPU machine, inside the engine (four times its cost in a tight loop). Each numpy call on these small arrays
costs 1.5-6 us whatever its size, so the fold uses the cheap ones (take, a table of count rows per k) and few of
them per run. Inside the engine on the H200's host at 256 rows, where a step is host-bound (~3 ms), its calls cost
0.16 ms a step with fancy indexing and per-row comparisons and a decision every 4 steps, 0.12 with the cheap calls,
0.095 with decisions that stand longer once confirmed, 0.074-0.077 (amid rounds of 0.056-0.093) with fewer
calls per folded step, and 0.028 ms a step at batch 1 (2026-12-04).

Whatever k a step runs with, the output is lossless: drafts are verified by rejection sampling, and a step never
accepts more drafts than the previous step made (SlotState.num_drafts).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.98  # per step that offers the position: the global counts describe about the last 50 steps
IDLE_DECAY = 0.998  # per step that does not: an unmeasured position drifts back to the prior over ~500 steps
SLOT_DECAY = 0.9  # per step the slot is observed and offered the position: a request's own recent drafts
PRIOR = 0.6  # conditional acceptance of a position nobody has measured
PRIOR_WEIGHT = 8.0  # pseudo-observations behind the prior
SLOT_WEIGHT = 4.0  # pseudo-observations of the global rate behind each slot's own
REDECIDE_EVERY = 4  # steps a decision stands while the batch stays about the same
MAX_STANDING = 32  # ... doubled each time a new decision confirms it (same bucket and k), up to this
CHANGED_ROWS = 8  # ... which it does while at most 1 / CHANGED_ROWS of its rows changed (at least one)
MAX_QUEUED = 64  # observations queued at most before they are folded in


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

    def observe(self, slots: np.ndarray, k: int, num_accepted: np.ndarray,
                num_offered: np.ndarray | None = None) -> None:
        """One committed step: the rows' slots, how many drafts each accepted, and how many it was offered (None:
        k each; fewer where prompt lookup, the head's fallback, found a shorter continuation, or near
        max_model_len)."""

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
        K = max_k
        self.choices = list(range(K + 1))
        self.num_steps_by_k = {k: 0 for k in self.choices}
        # decayed counts per draft position: how often it was reached (offered, every earlier draft accepted),
        # then how often it was accepted, [2K]; per slot the same, [S+1, 2K]
        self.counts = np.zeros(2 * K)
        self.slot_counts = np.zeros((num_slots + 1, 2 * K))
        self.measured_step_times: dict[tuple[int, int], float] = {}  # (bucket, k) -> seconds, as measured
        self._times: dict[int, list[float]] = {}  # bucket -> seconds for k = 0..K, for choose
        j = np.arange(K)
        # a row that accepted n of k drafts reached position i < k iff n >= i, and accepted it iff n >= i + 1:
        # _new[k][n], [K+1, 2K], is its row of counts (taken per row: one numpy call, not a comparison per row)
        thresholds = np.concatenate([j, j + 1])
        offered = [np.concatenate([j < k, j < k]) for k in range(K + 1)]
        self._new = [((np.arange(K + 1)[:, None] >= thresholds) & o).astype(np.float64) for o in offered]
        # per k, each count's decay per observation raised to the powers 0 .. MAX_QUEUED, [MAX_QUEUED + 1, 2K]
        powers = np.arange(MAX_QUEUED + 1)[:, None]
        self._decay = [np.tile(np.where(j < k, DECAY, IDLE_DECAY), 2) ** powers for k in range(K + 1)]
        self._slot_decay = [np.where(o, SLOT_DECAY, 1.0) ** powers for o in offered]
        # a row offered d < k drafts (_fold_offered): its count row _new[d][a], [(K+1) * (K+1), 2K], and its slot's
        # decay, [K+1, 2K]
        self._new_by_offered = np.concatenate(self._new)
        self._slot_decay_by_offered = np.stack([d[1] for d in self._slot_decay])
        self._pseudo: np.ndarray | None = None
        # observations (slots, k, accepted, offered) and slot resets (slots, None, None, None) not folded in yet
        self._queued: list[tuple[np.ndarray, int | None, np.ndarray | None, np.ndarray | None]] = []
        self._decision: tuple[int, int, int] | None = None  # (bucket, rows, k) of the standing one
        self._decided = np.zeros(num_slots + 1, bool)  # the slots it was made for (a reset slot: no longer)
        self._since_decision = 0  # observations since it was made
        self._standing = REDECIDE_EVERY  # observations it stands for

    def set_step_times(self, times: dict[tuple[int, int], float]) -> None:
        """The measured step times (kept in measured_step_times); per bucket the policy ranks k by their closest fit
        non-decreasing in k, step_times (a step with more drafts does no less work, so a k timed cheaper than a
        smaller one was timed in noise)."""
        self.measured_step_times = dict(times)
        buckets = {b for b, _ in times}
        self._times = {b: nondecreasing([times[(b, k)] for k in self.choices]) for b in sorted(buckets)
                       if all((b, k) in times for k in self.choices)}

    @property
    def step_times(self) -> dict[tuple[int, int], float]:
        """(bucket, k) -> seconds, as choose ranks them."""
        return {(b, k): t for b, ts in self._times.items() for k, t in zip(self.choices, ts)}

    def reset_slots(self, slots: list[int]) -> None:
        if not slots:
            return
        self._queue((np.asarray(slots), None, None, None))  # cleared in order with the queued observations
        self._decided[slots] = False  # new requests: rows the standing decision did not weigh

    def observe(self, slots: np.ndarray, k: int, num_accepted: np.ndarray,
                num_offered: np.ndarray | None = None) -> None:
        self._queue((slots, k, num_accepted, num_offered))
        self._since_decision += 1

    def _queue(self, item: tuple) -> None:
        self._queued.append(item)
        if len(self._queued) >= MAX_QUEUED:  # nobody has asked for a while (a policy without step times)
            self._fold()

    def _fold(self) -> None:
        """The queued observations (and slot resets, k None) into the counts, in order; each run of observations
        with the same k over the same rows (a steady batch), every row offered all k drafts, in one go."""
        queued, i = self._queued, 0
        while i < len(queued):
            slots, k, num_accepted, num_offered = queued[i]
            j = i + 1
            if k is None:
                self.slot_counts[slots] = 0.0
            elif num_offered is not None:
                self._fold_offered(slots, k, num_accepted, num_offered)
            else:
                while (j < len(queued) and queued[j][1] == k and queued[j][3] is None
                       and len(queued[j][0]) == len(slots) and np.array_equal(queued[j][0], slots)):
                    j += 1
                self._fold_run(slots, k, [a for _, _, a, _ in queued[i:j]])
            i = j
        if queued:
            self._pseudo = None  # the shrinkage toward the new global rate, made when next needed
        queued.clear()

    def _fold_run(self, slots: np.ndarray, k: int, accepted: list[np.ndarray]) -> None:
        """G observations of these rows with k drafts (accepted: G arrays [rows], in order). A count that decays by
        f an observation ends at count * f^G + sum_g new_g * f^(G-1-g): a dozen numpy calls for the run, where
        one at a time took nine per observation (each 1.5-6 us on arrays this small)."""
        G = len(accepted)
        self.counts *= self._decay[k][G]
        if not k or not len(slots):
            return
        new, own = self._new[k], self.slot_counts.take(slots, axis=0)  # take: 1.4 us against 5.8 for [slots]
        own *= self._slot_decay[k][G]
        if G == 1:  # the rows changed since the last observation (requests came or went): four calls, not twelve
            self.counts += np.bincount(accepted[0], minlength=self.max_k + 1) @ new
            own += new.take(accepted[0], axis=0)  # [rows, 2K]
        else:
            acc = np.stack(accepted)  # [G, rows]
            n = self.max_k + 1
            per_step = np.bincount((acc + np.arange(0, G * n, n)[:, None]).ravel(), minlength=G * n)  # [G * n]
            self.counts += ((per_step.reshape(G, n) @ new) * self._decay[k][G - 1::-1]).sum(axis=0)
            own += np.einsum("grd,gd->rd", new.take(acc, axis=0), self._slot_decay[k][G - 1::-1])
        self.slot_counts[slots] = own

    def _fold_offered(self, slots: np.ndarray, k: int, accepted: np.ndarray, offered: np.ndarray) -> None:
        """One observation whose rows were offered different numbers of drafts: a row offered d reached only
        positions below d, and its slot's counts of the positions past d neither grow nor decay. The global counts
        decay by the step's k, as in _fold_run."""
        self.counts *= self._decay[k][1]
        if not k or not len(slots):
            return
        n = self.max_k + 1
        index = offered * n + accepted  # the row of _new[d][a] in _new_by_offered
        self.counts += np.bincount(index, minlength=n * n) @ self._new_by_offered
        own = self.slot_counts.take(slots, axis=0)
        own *= self._slot_decay_by_offered.take(offered, axis=0)
        own += self._new_by_offered.take(index, axis=0)
        self.slot_counts[slots] = own

    def _shrinkage(self) -> np.ndarray:
        """[2K]: the pseudo-counts behind each slot's own (SLOT_WEIGHT observations of the global rate, itself
        shrunk toward PRIOR), in slot_counts' layout."""
        if self._pseudo is None:
            reached, accepted = self.counts[:self.max_k], self.counts[self.max_k:]
            rate = (accepted + PRIOR_WEIGHT * PRIOR) / (reached + PRIOR_WEIGHT)  # [K]
            self._pseudo = SLOT_WEIGHT * np.concatenate([np.ones_like(rate), rate])
        return self._pseudo

    def acceptance(self, slots: np.ndarray) -> np.ndarray:
        """a[r, i]: the estimated conditional acceptance of draft position i for each row's slot."""
        self._fold()
        own = self.slot_counts.take(slots, axis=0)
        own += self._shrinkage()
        return own[:, self.max_k:] / own[:, :self.max_k]

    def expected_tokens(self, slots: np.ndarray) -> list[float]:
        """[K + 1]: the tokens a step with k = 0..K is expected to emit, summed over the rows."""
        a = self.acceptance(slots)
        reach, total = np.ones(len(slots)), [float(len(slots))]  # reach[r]: prod_{i<=j} a_r[i], j = 0, 1, ...
        for j in range(self.max_k):
            reach *= a[:, j]
            total.append(total[-1] + float(reach.sum()))
        return total

    def choose(self, num_rows: int, bucket: int, slots: np.ndarray) -> int:
        times = self._times.get(bucket)
        if times is None:  # not measured (a policy set up without warm-up): speculate fully
            return self.max_k
        d = self._decision
        if d is not None and d[0] == bucket and self._since_decision < self._standing:
            kept = int(np.count_nonzero(self._decided.take(slots)))  # rows it weighed that are still here
            if (num_rows - kept) + (d[1] - kept) <= max(1, d[1] // CHANGED_ROWS):
                return d[2]
        # the K + 1 candidates ranked in Python: cheaper than numpy calls on arrays this small
        rates = [e / t for e, t in zip(self.expected_tokens(slots), times)]
        best = max(rates)
        k = next(k for k, r in enumerate(rates) if r >= best * (1 - 1e-3))  # the smallest k within 0.1 %
        self._decided[:] = False
        self._decided[slots] = True
        confirmed = d is not None and d[0] == bucket and d[2] == k
        self._standing = min(2 * self._standing, MAX_STANDING) if confirmed else REDECIDE_EVERY
        self._decision, self._since_decision = (bucket, num_rows, k), 0
        return k


def nondecreasing(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to values in least squares (pool adjacent violators: each run that
    decreases is replaced by its mean)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def make_policy(spec, num_slots: int) -> SpecPolicy:
    """The policy a SpeculativeConfig asks for (None: no head, k = 0 always)."""
    if spec is None:
        return SpecPolicy(0)
    if spec.dynamic:
        return DynamicPolicy(spec.num_speculative_tokens, num_slots)
    if spec.num_speculative_tokens_per_batch_size:
        return TablePolicy(spec.num_speculative_tokens, spec.num_speculative_tokens_per_batch_size)
    return SpecPolicy(spec.num_speculative_tokens)
