/**
 * Writes a dispatcher worker owes and keeps trying while it lives: an outcome after the provider was called, a
 * release of a claim it never sent, a refusal. A database that is full, restarting or overloaded must not turn
 * a claim the worker still holds into one nobody resolves, so a transient failure (core/sqlstate.ts
 * `isTransient`) is retried with a bounded backoff for as long as the worker runs, never a fixed number of
 * times; anything else is thrown to the caller at once.
 */
import type { RepeatedFailureLog } from '../core/log.js';
import { retry, type RetryPolicy } from '../core/retry.js';

/**
 * Thrown out of a wait or a retry loop when the worker stops: what it held goes to the reconciler. The worker's
 * halt signal is aborted with one as its reason, so `retry` and `sleep` reject with it.
 */
export class WorkerHalted extends Error {
  constructor() {
    super('the dispatcher stopped');
    this.name = 'WorkerHalted';
  }
}

/** First retry after 100 ms, doubling to this cap: a freed disk is noticed within 5 s. */
export const OWED_WRITE_MAX_BACKOFF_MS = 5_000;

/** An owed write: every transient failure, for as long as the worker runs. */
export const OWED_WRITE_POLICY: Omit<RetryPolicy, 'signal' | 'onRetry'> = {
  tries: Infinity,
  baseDelayMs: 100,
  maxDelayMs: OWED_WRITE_MAX_BACKOFF_MS,
};

/**
 * Runs `write` until it resolves. A transient failure is counted on `failures` (one log line per interval
 * and code) and retried after a backoff; a non-transient one is thrown. Throws {@link WorkerHalted} as soon as
 * `halt` aborts, between attempts or during a backoff (never interrupting a statement in flight).
 */
export async function untilWritten<T>(
  write: () => Promise<T>,
  halt: AbortSignal,
  failures: RepeatedFailureLog,
  fields: Record<string, unknown>,
): Promise<T> {
  const result = await retry(write, {
    ...OWED_WRITE_POLICY,
    signal: halt,
    onRetry: (err) => failures.fail(err, fields),
  });
  failures.ok(fields);
  return result;
}
