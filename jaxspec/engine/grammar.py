"""Structured outputs on the device: the automata of the running requests' constraints (structured_output.py) in one
pool of tables, and the pure functions the extended step walks them with.

A slot's grammar state is a pool state id (-1: no constraint). At verify position j the state is the slot's
committed one walked through the drafts before j, so the mask at every position is the one plain decoding would
apply there, and rejection sampling stays exact (a draft the automaton refuses has probability 0 and is rejected;
the states after it are never used). The commit walks the accepted tokens. Looking up a transition is a binary
search in the state's row of (token, next state) pairs: ceil(log2(V + 1)) gathers, on [B, T] states only; the
[B, T, V] mask is the state's allowed-token bits, unpacked where the pass over the vocabulary reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

NONE = -1  # no constraint (or a draft the automaton refused: nothing after it is ever emitted)


@partial(jax.tree_util.register_dataclass,
         data_fields=["allowed", "row_start", "row_len", "only_end", "tokens", "next"], meta_fields=[])
@dataclass
class GrammarTables:
    """The pool (engine/grammar_pool.py places each automaton at a state offset and a transition offset)."""
    allowed: jax.Array  # [P, ceil(V / 32)] uint32: bit t % 32 of word t // 32 is token t
    row_start: jax.Array  # [P] int32: a state's transitions are tokens[row_start:row_start + row_len]
    row_len: jax.Array  # [P] int32
    only_end: jax.Array  # [P] bool: only end tokens are allowed (min_tokens yields: the answer must end)
    tokens: jax.Array  # [E] int32, sorted within each state's row
    next: jax.Array  # [E] int32: pool state ids

    @classmethod
    def init(cls, max_states: int, max_transitions: int, vocab_size: int) -> "GrammarTables":
        P, E = max(max_states, 1), max(max_transitions, 1)
        return cls(allowed=jnp.zeros((P, (vocab_size + 31) // 32), jnp.uint32),
                   row_start=jnp.zeros((P,), jnp.int32), row_len=jnp.zeros((P,), jnp.int32),
                   only_end=jnp.zeros((P,), bool), tokens=jnp.zeros((E,), jnp.int32),
                   next=jnp.zeros((E,), jnp.int32))


def step(t: GrammarTables, state: jax.Array, token: jax.Array) -> jax.Array:
    """The state after `token` from `state` (broadcast int32 arrays); NONE where state is NONE or the token is not
    allowed there."""
    state, token = jnp.broadcast_arrays(state, token)
    s = jnp.clip(state, 0, t.row_len.shape[0] - 1)
    lo, hi = t.row_start[s], t.row_start[s] + t.row_len[s]  # search [lo, hi) for the first entry >= token
    end = hi
    last = t.tokens.shape[0] - 1
    for _ in range(max(1, math.ceil(math.log2(t.allowed.shape[1] * 32 + 1)))):
        mid = (lo + hi) // 2
        right = t.tokens[jnp.minimum(mid, last)] < token
        lo, hi = jnp.where((lo < hi) & right, mid + 1, lo), jnp.where((lo < hi) & ~right, mid, hi)
    at = jnp.minimum(lo, last)
    found = (state >= 0) & (lo < end) & (t.tokens[at] == token)
    return jnp.where(found, t.next[at], NONE)


def walk(t: GrammarTables, state: jax.Array, tokens: jax.Array) -> jax.Array:
    """The states before each of tokens [B, T] and after the last: [B, T + 1] from state [B]."""
    states = [state]
    for j in range(tokens.shape[1]):
        states.append(step(t, states[-1], tokens[:, j]))
    return jnp.stack(states, axis=1)


def allowed(t: GrammarTables, state: jax.Array, ids: jax.Array) -> jax.Array:
    """Whether token ids are allowed in states (broadcast); everything is where state is NONE."""
    state, ids = jnp.broadcast_arrays(state, ids)
    word = t.allowed[jnp.maximum(state, 0), ids // 32]
    return (state < 0) | ((word >> (ids % 32).astype(jnp.uint32)) & 1).astype(bool)


def allowed_rows(t: GrammarTables, state: jax.Array, vocab_size: int) -> jax.Array:
    """[..., V] bool: the allowed tokens of each state [...] (all where NONE), unpacked from its bits."""
    words = t.allowed[jnp.maximum(state, 0)]  # [..., W]
    bits = (words[..., :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1  # [..., W, 32]
    rows = bits.reshape(state.shape + (-1,))[..., :vocab_size].astype(bool)
    return rows | (state < 0)[..., None]


def only_end(t: GrammarTables, state: jax.Array) -> jax.Array:
    return (state >= 0) & t.only_end[jnp.maximum(state, 0)]


def place(t: GrammarTables, counts: jax.Array, allowed_rows_: jax.Array, row_start: jax.Array, row_len: jax.Array,
          only_end_: jax.Array, tokens: jax.Array, next_: jax.Array) -> GrammarTables:
    """Write one chunk of an automaton into the pool: counts [4] = (first pool state, states in the chunk, first
    pool transition, transitions in the chunk); the chunk's rows [C] and transitions [D] past those counts are
    padding (dropped). Ids are already the pool's."""
    P, E = t.row_len.shape[0], t.tokens.shape[0]
    i, j = jnp.arange(row_len.shape[0]), jnp.arange(tokens.shape[0])
    s = jnp.where(i < counts[1], counts[0] + i, P)
    e = jnp.where(j < counts[3], counts[2] + j, E)
    return GrammarTables(allowed=t.allowed.at[s].set(allowed_rows_, mode="drop"),
                         row_start=t.row_start.at[s].set(row_start, mode="drop"),
                         row_len=t.row_len.at[s].set(row_len, mode="drop"),
                         only_end=t.only_end.at[s].set(only_end_, mode="drop"),
                         tokens=t.tokens.at[e].set(tokens, mode="drop"), next=t.next.at[e].set(next_, mode="drop"))


@partial(jax.tree_util.register_dataclass, data_fields=["tables", "state"], meta_fields=[])
@dataclass
class GrammarState:
    """In step.SlotState: the pool and each slot's state (S + 1 rows; set at admission, walked at every commit of an
    extended step that has a constraint; read only for the rows whose slot state is their request's)."""
    tables: GrammarTables
    state: jax.Array  # [S+1] int32

    @classmethod
    def init(cls, num_slots: int, vocab_size: int, max_states: int, max_transitions: int) -> "GrammarState":
        return cls(GrammarTables.init(max_states, max_transitions, vocab_size),
                   jnp.full((num_slots + 1,), NONE, jnp.int32))


def row_states(g: GrammarState, slots: jax.Array, own: jax.Array) -> jax.Array:
    """[B]: the committed states of these slots' rows, NONE where the slot's state is not the row's (own False)."""
    return jnp.where(own, g.state[slots], NONE)


def commit_rows(g: GrammarState, slots: jax.Array, own: jax.Array, tokens: jax.Array,
                live: jax.Array) -> GrammarState:
    """The slots' states after the rows' live tokens [B, T] (live: a prefix of each row)."""
    states = walk(g.tables, row_states(g, slots, own), tokens)  # [B, T + 1]
    state = jnp.take_along_axis(states, jnp.sum(live, axis=1, dtype=jnp.int32)[:, None], axis=1)[:, 0]
    return GrammarState(g.tables, g.state.at[slots].set(state))
