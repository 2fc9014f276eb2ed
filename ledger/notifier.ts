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
import type { Pool } from '../core/db.js';
import { localWakeId, wakeLocal } from '../core/local-wake.js';

export class OutboxNotifier {
  readonly #pool: Pool;
  readonly #channel: string;
  readonly #intervalMs: number;
  #timer: NodeJS.Timeout | undefined;
  #trailing = false;
  #stopped = false;

  constructor(pool: Pool, channel: string, intervalMs = 10) {
    this.#pool = pool;
    this.#channel = channel;
    this.#intervalMs = intervalMs;
  }

  /**
   * After a commit that made work claimable: `one` operation (a reservation), or `many` (a kill switch lifted),
   * which always sends the NOTIFY: a dispatcher of this process that takes the wake-up has a slot for one.
   */
  poke(work: 'one' | 'many' = 'one'): void {
    if (this.#stopped) return;
    // A dispatcher in this process claims at once; when it has no slot free for this operation, the others
    // hear the NOTIFY below.
    if (wakeLocal(this.#channel) && work === 'one') return;
    if (this.#timer !== undefined) {
      this.#trailing = true;
      return;
    }
    this.#send();
    this.#timer = setTimeout(() => this.#tick(), this.#intervalMs);
    this.#timer.unref();
  }

  #tick(): void {
    this.#timer = undefined;
    if (this.#trailing) {
      this.#trailing = false;
      this.poke();
    }
  }

  #send(): void {
    // Best effort by design: the dispatchers' poll interval covers a NOTIFY that never arrives.
    this.#pool.query('SELECT pg_notify($1, $2)', [this.#channel, localWakeId]).catch(() => undefined);
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
