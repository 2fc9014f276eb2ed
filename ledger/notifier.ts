/**
 * Wakes the dispatchers after reservations commit, without a NOTIFY inside every reservation.
 *
 * PostgreSQL takes a global lock at commit for a transaction that has queued a NOTIFY, which serialised
 * concurrent reservations (measured: 16 in flight were no faster than one). Reservations made in our
 * own statement call {@link OutboxNotifier.poke} after they commit; the first poke sends at once, later ones
 * within the interval collapse into one trailing NOTIFY, so every commit is followed by a wake-up within
 * `intervalMs`. A dispatcher in this process is woken directly on every poke (core/local-wake.ts), without
 * the NOTIFY's round trip, and when it takes the wake-up (it has a slot free for the operation) the poke sends no
 * NOTIFY at all: it would wake every other dispatcher for an operation this one claims at once. Dispatchers also
 * poll, so a lost NOTIFY delays work and never loses it.
 */
import type { Pool } from '../db/index.js';
import { databaseKey, notifyOtherProcesses, wakeLocal } from '../core/local-wake.js';

export class OutboxNotifier {
  readonly #pool: Pool;
  readonly #channel: string;
  readonly #database: string;
  readonly #intervalMs: number;
  #timer: NodeJS.Timeout | undefined;
  #trailing = false;
  #stopped = false;

  constructor(pool: Pool, channel: string, intervalMs = 10) {
    this.#pool = pool;
    this.#channel = channel;
    this.#database = databaseKey(pool);
    this.#intervalMs = intervalMs;
  }

  /**
   * After a commit that made work claimable: operation `operationId` (a reservation), or, without one, any number
   * of operations (a kill switch lifted), which always sends the NOTIFY.
   */
  poke(operationId?: string): void {
    if (this.#stopped) return;
    // A dispatcher in this process claims at once; when none has a slot free for this operation, the others
    // hear the NOTIFY below.
    if (wakeLocal(this.#channel, this.#database, operationId)) return;
    if (this.#timer !== undefined) {
      this.#trailing = true;
      return;
    }
    this.#send();
    this.#timer = setTimeout(() => this.#tick(), this.#intervalMs);
    this.#timer.unref();
  }

  /** The interval is over: the trailing NOTIFY, for the pokes since the last one that no local dispatcher took. */
  #tick(): void {
    this.#timer = undefined;
    if (!this.#trailing || this.#stopped) return;
    this.#trailing = false;
    this.#send();
    this.#timer = setTimeout(() => this.#tick(), this.#intervalMs);
    this.#timer.unref();
  }

  #send(): void {
    notifyOtherProcesses(this.#pool, this.#channel);
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}

/** The NOTIFY channel of a schema's outbox. */
export function outboxChannel(schema: string): string {
  return `${schema}_outbox`;
}
