/**
 * One retry loop for the whole code base: `retry(fn, policy)` runs `fn` again after a failure the policy calls
 * transient, waiting an exponentially growing, capped delay between attempts. What counts as transient is
 * core/sqlstate.ts `isTransient` unless a policy narrows it (never widens it with a second definition).
 */
import { isTransient } from './sqlstate.js';

export interface RetryPolicy extends Backoff {
  /** Attempts in all, the first included (at least 1); `Infinity` retries for as long as failures are transient. */
  tries: number;
  /** Which failures are worth another attempt; `isTransient` when absent. A failure it rejects is thrown at once. */
  retryOn?: (err: unknown) => boolean;
  /**
   * Ends the retries when aborted: checked before every attempt and during every wait (a call in flight is never
   * interrupted); `retry` then rejects with the signal's `reason`.
   */
  signal?: AbortSignal;
  /** Told about each failure that will be retried (attempt counts from 1), before the wait. */
  onRetry?: (err: unknown, attempt: number) => void;
}

/**
 * Runs `fn` (given the attempt number, from 1) until it resolves, and returns its result. Throws the failure of
 * the last attempt when it is not retryable or the tries are spent, or the signal's reason once it aborts.
 */
export async function retry<T>(fn: (attempt: number) => Promise<T>, policy: RetryPolicy): Promise<T> {
  const retryOn = policy.retryOn ?? isTransient;
  const tries = Math.max(1, policy.tries);
  for (let attempt = 1; ; attempt++) {
    policy.signal?.throwIfAborted();
    try {
      return await fn(attempt);
    } catch (err) {
      if (attempt >= tries || !retryOn(err)) throw err;
      policy.onRetry?.(err, attempt);
    }
    await sleep(backoffMs(policy, attempt), policy.signal);
  }
}

/** A doubling wait: every backoff in the code base is one of these, computed by {@link backoffMs}. */
export interface Backoff {
  /** The wait after the first failure; each later wait doubles it, up to `maxDelayMs`. */
  baseDelayMs: number;
  maxDelayMs: number;
  /**
   * The share of each wait (0 to 1) taken off at random, for waits that many callers start at once (the
   * operations one outage gave back to the queue do not all come back in the same instant); 0 or absent: none.
   */
  jitter?: number;
}

/**
 * The wait after failed attempt `attempt` (from 1): `baseDelayMs * 2^(attempt-1)`, at most `maxDelayMs`, less
 * up to `jitter` of it at random (`random` in [0, 1)); at least 1 ms once jittered.
 */
export function backoffMs(policy: Backoff, attempt: number, random: () => number = Math.random): number {
  const full = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** Math.min(Math.max(attempt, 1) - 1, 40));
  const jitter = policy.jitter ?? 0;
  return jitter === 0 ? full : Math.max(1, Math.round(full * (1 - jitter * random())));
}

/** `backoffMs` jittered into its upper half (from half the delay to all of it). */
export function jitteredBackoffMs(
  policy: Pick<Backoff, 'baseDelayMs' | 'maxDelayMs'>,
  attempt: number,
  random: () => number = Math.random,
): number {
  return backoffMs({ ...policy, jitter: 0.5 }, attempt, random);
}

/**
 * The wait before an operation released to the queue, never sent, may be claimed again: the dispatcher's
 * release backoff, doubling per earlier release of the operation (`releases`, from 0), capped, jittered.
 */
export function releaseDelayMs(
  releases: number,
  d: { releaseBackoffInitialMs: number; releaseBackoffMaxMs: number },
  random?: () => number,
): number {
  return jitteredBackoffMs(
    { baseDelayMs: d.releaseBackoffInitialMs, maxDelayMs: d.releaseBackoffMaxMs },
    releases + 1,
    random,
  );
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as `signal` aborts (at once if it has). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted === true) {
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- the abort's own reason is the documented rejection, whatever its type
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- the abort's own reason is the documented rejection, whatever its type
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
