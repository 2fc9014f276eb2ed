/**
 * Everything that tells a worker's producer to claim, in one place, each source with its own timer or connection:
 *   - NOTIFY on `<schema>_outbox`, heard on a LISTEN connection of its own (lost: polling until it is back); a
 *     NOTIFY that carries this process's mark is skipped, since the process woke its listeners directly already;
 *   - reservations committed by this process (core/local-wake.ts), which the producer may take (`take`);
 *   - the poll, every `poll_interval_ms`, which covers any wake-up that was lost;
 *   - the due timer: the moment the earliest outbox row a claim saw in its backoff becomes available.
 * They call `wake()`; none of them claims or knows what the producer holds.
 */
import type { PoolClient } from '../db/index.js';
import { databaseKey, localWakeId, onLocalWake } from '../core/local-wake.js';
import type { DispatchContext } from './context.js';

/** The longest delay `setTimeout` keeps (2^31 - 1 ms, about 24.8 days). */
const MAX_TIMER_MS = 2_147_483_647;

export class WakeSources {
  readonly #ctx: DispatchContext;
  readonly #channel: string;
  readonly #wake: () => void;
  /** A reservation of this process: true when the producer takes it (core/local-wake.ts). */
  readonly #take: (operationId?: string) => boolean;
  #on = false;
  #listener: PoolClient | undefined;
  #poll: NodeJS.Timeout | undefined;
  /** The wake-up for the earliest outbox row a claim saw in its backoff, and when it fires. */
  #due: NodeJS.Timeout | undefined;
  #dueAt = 0;
  #unsubscribeLocal: (() => void) | undefined;

  constructor(ctx: DispatchContext, wake: () => void, take: (operationId?: string) => boolean) {
    this.#ctx = ctx;
    this.#channel = `${ctx.o.config.schema}_outbox`;
    this.#wake = wake;
    this.#take = take;
  }

  /** The outbox NOTIFY channel. */
  get channel(): string {
    return this.#channel;
  }

  /** Subscribes to this process's reservations, LISTENs (resolves once listening, or once it failed) and polls. */
  async start(): Promise<void> {
    this.#on = true;
    this.#unsubscribeLocal = onLocalWake(this.#channel, databaseKey(this.#ctx.o.pool), (id) => this.#take(id));
    await this.#listen();
    this.#poll = setInterval(() => this.#wake(), this.#ctx.o.pollIntervalMs);
  }

  /** No more wake-ups from any source (the LISTEN connection is released). Safe to repeat. */
  stop(): void {
    this.#on = false;
    this.#unsubscribeLocal?.();
    this.#unsubscribeLocal = undefined;
    clearInterval(this.#poll);
    this.#poll = undefined;
    clearTimeout(this.#due);
    this.#due = undefined;
    const listener = this.#listener;
    this.#listener = undefined;
    listener?.release();
  }

  /**
   * Wakes the producer in `ms`, when the earliest outbox row its claim saw in a backoff becomes available: nothing
   * else announces that moment when the worker that released the row has stopped or has no slot, and a claim that
   * saw nothing more waiting is not followed by another. One timer, for the earliest such moment; the claim it
   * starts reports the next if it takes work (a claim that takes nothing returns no row to report it in).
   */
  wakeIn(ms: number): void {
    if (!this.#on) return;
    const at = performance.now() + ms;
    if (this.#due !== undefined && this.#dueAt <= at) return;
    clearTimeout(this.#due);
    this.#dueAt = at;
    // A millisecond late at least: the claim it starts takes its clock after the row's available_at. Capped at
    // the longest delay a timer takes (Node would fire a longer one after 1 ms); the poll covers a row that far off.
    this.#due = setTimeout(
      () => {
        this.#due = undefined;
        this.#wake();
      },
      Math.min(Math.max(0, Math.ceil(ms)) + 1, MAX_TIMER_MS),
    );
    this.#due.unref();
  }

  async #listen(): Promise<void> {
    const { o } = this.#ctx;
    try {
      const client = await o.pool.connect();
      // A NOTIFY this process sent follows a wake-up its listeners had already (core/local-wake.ts).
      client.on('notification', (msg) => {
        if (msg.payload !== localWakeId) this.#wake();
      });
      client.on('error', (err) => {
        // Released already by stop() (or by an earlier error): nothing to give back.
        if (this.#listener !== client) return;
        o.log.warn({ err }, 'LISTEN connection lost; polling until it is back');
        this.#listener = undefined;
        client.release(err);
        if (this.#on) setTimeout(() => void this.#listen(), 1000).unref();
      });
      await client.query(`LISTEN "${this.#channel}"`);
      if (!this.#on) {
        client.release();
        return;
      }
      this.#listener = client;
    } catch (err) {
      o.log.warn({ err }, 'LISTEN failed; polling');
      if (this.#on) setTimeout(() => void this.#listen(), 1000).unref();
    }
  }
}
