"""The served model: the TTFT, TPOT and throughput a user measures when an engine serves a layout under load.

The cost model prices steps (topoplan.plan.cost.ReplicaSteps; the ReplicaSteps protocol below is all this
module needs of it): a decode step of some sequences, with prompt tokens in the same step, or a prefill
alone. A server under load runs a stream of such steps whose makeup depends on how its scheduler batches
(topoplan.engines.scheduling): this module turns the step times into the steady state of C requests in
flight per replica, each of `prompt` tokens generating `gen` (a closed loop, as `vllm bench serve
--max-concurrency C` drives it: all C start together, a finished request is replaced at once). An engine
whose prefill steps run alone (SGLang) keeps such a loop in waves and TTFT is the mean over a wave; else a
prompt lands during a running step and waits for its end. Every formula is in docs/planner.md, section 4
(served model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from topoplan.engines.scheduling import Budget, Scheduler


class ReplicaSteps(Protocol):
    """Step times of one replica (topoplan.plan.cost.ReplicaSteps prices them)."""

    def step_ms(self, decodes: float, prefill_tokens: float = 0.0) -> float:
        """A step of `decodes` sequences' next tokens and `prefill_tokens` prompt tokens."""

    def prefill_ms(self, prompts: float) -> float:
        """`prompts` prompts prefilled alone."""


@dataclass(frozen=True)
class Served:
    """One replica's steady state at `concurrency` requests in flight; times in ms."""

    concurrency: int
    ttft_ms: float  # a request's wait for its first token: its prefill steps (and, over budget, the queue)
    tpot_ms: float  # time per output token after the first, as benchmark_serving reports it
    request_ms: float  # ttft + (gen - 1) x tpot
    output_tokens_per_s: float  # concurrency x gen / request_ms (Little's law)
    requests_per_s: float
    budget_bound: bool = False  # the prompts need more tokens a step than the engine's budget: they queue


@dataclass(frozen=True)
class ServedCost:
    """A layout's served figures: one replica's, and the delivered totals over its DP replicas, per GPU of
    the machine (GPUs the layout leaves idle count: they deliver nothing)."""

    replica: Served
    replicas: int
    machine_gpus: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.replica.output_tokens_per_s * self.replicas

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        return self.output_tokens_per_s / self.machine_gpus

    @property
    def requests_per_s(self) -> float:
        return self.replica.requests_per_s * self.replicas


def _finish(concurrency: int, gen: int, ttft: float, tpot: float, bound: bool = False) -> Served:
    request = ttft + (gen - 1) * tpot
    return Served(concurrency, ttft, tpot, request, concurrency * gen / request * 1e3, concurrency / request * 1e3,
                  bound)


def static(steps: ReplicaSteps, prompt: int, gen: int, c: int) -> Served:
    """One batch at a time: the c prompts prefilled together, then c sequences decoded to the end."""
    return _finish(c, gen, steps.prefill_ms(c), steps.step_ms(c))


def mixed(steps: ReplicaSteps, budget: Budget, prompt: int, gen: int, c: int, ttft_factor: float = 1.0) -> Served:
    """Chunked prefill in the decode steps. A request spends k steps on its prompt (chunks of the budget the
    others' decodes leave) and gen - 1 decoding, so lam = c / (k + gen - 1) prompts start a step. Within
    budget, a step carrying prompt tokens carries x = max(prompt / k, lam x prompt) of them, a share
    f = lam' x prompt / x of steps carries the other requests' (lam' = (c - 1) / (k + gen - 1)), and
    TPOT = f x step(d, x) + (1 - f) x step(d); TTFT = r + k x step(d', x), r the rest of the step in flight
    when the prompt lands, E[T^2] / 2 E[T] over that mix of steps (0 at c = 1: the engine is idle). Over budget
    (lam x (prompt + gen - 1) > budget) every step is full: lam = budget / (prompt + gen - 1), d = lam x (gen - 1)
    decodes, TPOT = step(d, budget - d), and a request waits c / lam - (gen - 1) steps for its first token.
    `ttft_factor` multiplies the TTFT so found: an empirical correction where a profile's measured TTFT exceeds
    every modelled mechanism (TtftFactor)."""
    tokens, others, k = budget.max_batched_tokens or math.inf, c - 1, 1
    for _ in range(2):  # k from the room the decodes leave, the decodes from k: settled in two rounds
        span = k + gen - 1
        room = max(tokens - others * (gen - 1) / span, 1.0)
        k = max(1, math.ceil(prompt / room))
    span = k + gen - 1
    lam, decodes, beside = c / span, 1 + others * (gen - 1) / span, others * (gen - 1) / span
    if lam * (prompt + gen - 1) > tokens:
        lam = tokens / (prompt + gen - 1)
        decodes = lam * (gen - 1)
        tpot = steps.step_ms(decodes, tokens - decodes)
        return _finish(c, gen, max(c / lam - (gen - 1), k) * tpot * ttft_factor, tpot, bound=True)
    chunk = min(room, max(prompt / k, lam * prompt))
    share = min(1.0, others / span * prompt / chunk)
    carrying, plain = steps.step_ms(decodes, chunk), steps.step_ms(decodes)
    tpot = share * carrying + (1 - share) * plain
    # the step in flight when the prompt arrives: its mean rest is E[T^2] / 2 E[T] over the steps' mix
    rest = (share * carrying**2 + (1 - share) * plain**2) / (2 * tpot) if others else 0.0
    return _finish(c, gen, (rest + k * steps.step_ms(beside, chunk)) * ttft_factor, tpot)


def separate(steps: ReplicaSteps, budget: Budget, prompt: int, gen: int, c: int) -> Served:
    """Prefill steps alone, the decodes waiting (prefill first). Requests that start together are prefilled
    together and so finish together: the closed loop runs in waves of c. A wave's prompts go n = budget // prompt
    (at least 1) to a prefill step, ceil(c / n) steps; the j-th step's prompts get their first token when it
    ends (TTFT_j = sum of the steps' prefill(m) so far), then all c decode gen - 1 steps together:
    request latency = the wave's prefills + (gen - 1) step(c), and TPOT the rest after each one's first token."""
    per = max(1, min(c, (budget.max_batched_tokens or math.inf) // prompt))
    full, rest = divmod(c, per)
    batches = [per] * full + ([rest] if rest else [])
    done, firsts = 0.0, 0.0
    ms = {m: steps.prefill_ms(m) for m in set(batches)}  # at most two sizes: full steps and the rest
    for m in batches:
        done += ms[m]
        firsts += m * done
    ttft, request = firsts / c, done + (gen - 1) * steps.step_ms(c)
    return _finish(c, gen, ttft, (request - ttft) / (gen - 1) if gen > 1 else 0.0)


@dataclass(frozen=True)
class ServedModel:
    """Serves layouts of one plan: the engine's scheduler and its budget on this GPU, the request shape and
    the machine's GPU count."""

    scheduler: Scheduler
    budget: Budget
    prompt: int
    gen: int
    machine_gpus: int

    def max_concurrency(self, memory_batch: int) -> int:
        """Requests in flight a replica can hold: its KV cache's sequences, capped by the engine's max_seqs."""
        return min(memory_batch, self.budget.max_seqs or memory_batch)

    def replica(self, steps: ReplicaSteps, concurrency: int) -> Served:
        mode, p, g = self.scheduler.mode, self.prompt, self.gen
        if mode == "mixed":
            factor = self.scheduler.ttft_factor
            return mixed(steps, self.budget, p, g, concurrency, factor.at(concurrency) if factor else 1.0)
        if mode == "separate":
            return separate(steps, self.budget, p, g, concurrency)
        return static(steps, p, g, concurrency)

    def serve(self, steps: ReplicaSteps, concurrency: int, replicas: int) -> ServedCost:
        """The layout's served figures at `concurrency` requests in flight per replica."""
        return ServedCost(self.replica(steps, concurrency), replicas, self.machine_gpus)


def largest_concurrency(ok: Callable[[int], bool], top: int) -> int:
    """The largest c in [1, top] with ok(c), where ok only turns false as c grows (served TTFT and TPOT only grow
    with the requests in flight); 0 when ok(1) is false. `top` itself is tried first: often nothing bounds it."""
    if top < 1 or not ok(1):
        return 0
    if ok(top):
        return top
    low, high = 1, top - 1  # ok(low) holds, ok(top) does not
    while low < high:
        mid = (low + high + 1) // 2
        if ok(mid):
            low = mid
        else:
            high = mid - 1
    return low
