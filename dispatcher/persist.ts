/**
 * Writes a dispatcher worker owes and keeps trying while it lives: an outcome after the provider was called, a
 * release of a claim it never sent, a refusal. A database that is full, restarting or overloaded must not turn
 * a claim the worker still holds into one nobody resolves, so a transient failure (core/sqlstate.ts
 * `isTransient`) is retried with a bounded backoff for as long as the worker runs, never a fixed number of
 * times; anything else is thrown to the caller at once.
 */
import { isTransient } from '../core/db.js';
import type { RepeatedFailureLog } from '../core/log.js';

/** Thrown out of a wait or a retry loop when the worker stops: what it held goes to the reconciler. */
export class WorkerHalted extends Error {
  constructor() {
    super('the dispatcher stopped');
    this.name = 'WorkerHalted';
  }
}

/** First retry after 100 ms, doubling to this cap: a freed disk is noticed within 5 s. */
export const OWED_WRITE_MAX_BACKOFF_MS = 5_000;

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
  for (let attempt = 0; ; attempt++) {
    if (halt.aborted) throw new WorkerHalted();
    try {
      const result = await write();
      failures.ok(fields);
      return result;
    } catch (err) {
      if (!isTransient(err)) throw err;
      failures.fail(err, fields);
    }
    await pause(Math.min(OWED_WRITE_MAX_BACKOFF_MS, 100 * 2 ** attempt), halt);
  }
}

/** Resolves after `ms`, or rejects with {@link WorkerHalted} when `halt` aborts first. */
export function pause(ms: number, halt: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (halt.aborted) {
      reject(new WorkerHalted());
      return;
    }
    const onHalt = (): void => {
      clearTimeout(timer);
      reject(new WorkerHalted());
    };
    const timer = setTimeout(() => {
      halt.removeEventListener('abort', onHalt);
      resolve();
    }, ms);
    halt.addEventListener('abort', onHalt, { once: true });
  });
}
