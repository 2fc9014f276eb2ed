/**
 * Groups a dispatcher's per-operation database work into batches without making a lone operation wait.
 *
 * Up to `openings` batches (two by default; a worker's batchers ask `batchOpenings`) are in their opening phase
 * (`open`) at once, each on its own connection; items added while all of them are busy queue and form the next
 * batch (at most `max` of them) as soon as one phase ends. With one operation in flight, a batch of one opens at
 * once; with many, each round trip serves every operation that became ready meanwhile (the group-commit pattern). A
 * second opening keeps a burst from queueing behind one round trip after another: with one, an operation that
 * arrives just after a batch opened waits for that whole round trip before its own starts. An item is in one batch
 * at a time, so the batches in flight hold disjoint items. `open` settles every item it was given; if it throws
 * instead, every item of the batch is rejected with that error (settling an item twice is a no-op).
 */
import { isConnectionError, isRetryable, isTransient } from '../db/index.js';
import { backoffMs, sleep, type RetryPolicy } from '../core/retry.js';

/** Batches of one batcher in their opening phase at once, at most. */
export const BATCH_OPENINGS = 2;

/**
 * The openings a worker's batchers may use with `inFlight` of its `concurrency` slots taken: two while at most
 * half are, one above. A second opening shortens a burst's wait but splits the batches it shares out; when most
 * slots are taken the worker is near saturation, where each round trip serving more operations is worth more
 * than the wait it saves (measured: docs/benchmarks.md).
 */
export function batchOpenings(inFlight: number, concurrency: number): number {
  return inFlight * 2 <= concurrency ? BATCH_OPENINGS : 1;
}

export class Batcher<T extends Settle<never>> {
  readonly #max: number;
  readonly #openings: () => number;
  readonly #open: (items: T[]) => Promise<void>;
  #queue: T[] = [];
  /** Batches in their opening phase now. */
  #busy = 0;

  /** `openings`: how many batches may be in their opening phase, asked each time one could open. */
  constructor(max: number, open: (items: T[]) => Promise<void>, openings: number | (() => number) = BATCH_OPENINGS) {
    this.#max = Math.max(1, max);
    this.#openings = typeof openings === 'number' ? () => openings : openings;
    this.#open = open;
  }

  add(item: T): void {
    this.#queue.push(item);
    this.#next();
  }

  /** Opens what the openings allow now: for a caller whose answer to `openings` may have grown (a slot freed). */
  poke(): void {
    this.#next();
  }

  /** The openings allowed now: at least one, whatever `openings` answers (a throw or a non-number counts as one). */
  #limit(): number {
    let n: number;
    try {
      n = this.#openings();
    } catch {
      return 1;
    }
    return Number.isFinite(n) ? Math.max(1, Math.floor(n)) : 1;
  }

  #next(): void {
    while (this.#queue.length > 0 && this.#busy < this.#limit()) {
      const items = this.#queue.splice(0, this.#max);
      this.#busy += 1;
      void Promise.resolve()
        .then(() => this.#open(items))
        .catch((err: unknown) => {
          for (const item of items) item.reject(err);
        })
        .finally(() => {
          this.#busy -= 1;
          this.#next();
        });
    }
  }
}

/** A promise with its settle functions, for items that a batch settles. */
export interface Settle<R = void> {
  resolve: (value: R) => void;
  reject: (reason: unknown) => void;
}

/** Adds `item` to `batcher` and returns the promise its batch settles. */
export function submit<I, R = void>(batcher: Batcher<I & Settle<R>>, item: I): Promise<R> {
  return new Promise<R>((resolve, reject) => batcher.add({ ...item, resolve, reject }));
}

/**
 * A whole batch statement that failed on a lost connection, a serialization failure or a deadlock is run again a
 * few times (100 ms, doubling to 800 ms): it is idempotent per claim and nothing of the batch has been sent yet.
 * The policy narrows `isTransient`: a full disk, a timeout or an exhausted server rejects the items at once, and
 * their claims are released (the release itself retried until written) rather than held by the batch while their
 * authorizations age. Each batch runs it with the worker's halt signal ({@link batchRetryPolicy}).
 */
export const BATCH_RETRY_POLICY: RetryPolicy = {
  tries: 5,
  baseDelayMs: 100,
  maxDelayMs: 800,
  retryOn: (err) => isTransient(err) && (isConnectionError(err) || isRetryable(err)),
};

/**
 * {@link BATCH_RETRY_POLICY} ended by `halt`: once a stop's deadline has passed, no batch statement starts again
 * (nor a first time), and the batch's items are rejected with the signal's reason (`WorkerHalted`). Nothing of
 * such a batch has been sent; its claims stay executing for the reconciler, as every claim a halted worker holds.
 */
export function batchRetryPolicy(halt: AbortSignal): RetryPolicy {
  return { ...BATCH_RETRY_POLICY, signal: halt };
}

/** A row another session holds is tried again after 20 ms, doubling to this cap, while its claim holds. */
const BUSY_RETRY_MAX_MS = 1_000;

/**
 * An item whose row another session holds (a reviewer, a revocation in progress, a migration): it goes into
 * a later batch after a short wait, 20 ms doubling to 1 s, as long as its claim holds (each try reads the
 * claim again; a lost one ends as `claim_lost`) and the worker runs (`halt`; the item is then rejected with the
 * signal's reason). Its authorization ages meanwhile, and a decision that grew too old is refused as stale,
 * never sent.
 */
export function retryBusy<T extends Settle<never> & { busyRetries?: number }>(
  batcher: Batcher<T>,
  item: T,
  halt: AbortSignal,
): void {
  item.busyRetries = (item.busyRetries ?? 0) + 1;
  sleep(backoffMs({ baseDelayMs: 20, maxDelayMs: BUSY_RETRY_MAX_MS }, item.busyRetries), halt).then(
    () => batcher.add(item),
    (err: unknown) => item.reject(err),
  );
}
