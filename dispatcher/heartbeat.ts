/**
 * The worker's row in the workers table and its heartbeat: registered live at start, stamped every interval
 * with the claims the worker holds (the reconciler treats a claim as orphaned once its worker stops listing it,
 * stops beating for `orphan_after_ms`, or is marked stopped), and marked stopped at the end.
 *
 * One beat at a time: a beat due while the previous one is still in flight (a slow or saturated pool) is skipped.
 * Its state is its own: the interval, the beat in flight and the failure log.
 */
import { hostname } from 'node:os';
import { isConnectionError, type PoolClient } from '../db/index.js';
import { RepeatedFailureLog } from '../core/log.js';
import type { DispatchContext } from './context.js';

export class Heartbeat {
  readonly #ctx: DispatchContext;
  /** The claim tokens to list: read when each beat has its connection. */
  readonly #held: () => Iterable<string>;
  /** Told after each beat the database took while beating (it is reachable). */
  readonly #beaten: () => void;
  readonly #failures: RepeatedFailureLog;
  #timer: NodeJS.Timeout | undefined;
  /** The beat in flight, if any. */
  #beating: Promise<void> | undefined;

  constructor(ctx: DispatchContext, held: () => Iterable<string>, beaten: () => void) {
    this.#ctx = ctx;
    this.#held = held;
    this.#beaten = beaten;
    this.#failures = new RepeatedFailureLog(ctx.o.log, 'heartbeat failed');
  }

  /** Registers the worker (live, no claims listed). Throws the raw database failure. */
  async register(): Promise<void> {
    const { o, q } = this.#ctx;
    await o.pool.query(q.workerUpsert, [o.workerId, process.pid, hostname()]);
  }

  /** Beats every interval from now on. */
  start(): void {
    this.#timer ??= setInterval(() => this.#beat(), this.#ctx.o.heartbeatIntervalMs);
  }

  /** No more beats; the beat in flight lands. */
  async stop(): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#beating;
  }

  /** Marks the worker stopped, so the reconciler takes its claims at once; a failure is logged, never thrown. */
  async markStopped(): Promise<void> {
    const { o, q } = this.#ctx;
    await o.pool
      .query(q.workerStopped, [o.workerId])
      .catch((err: unknown) =>
        o.log.warn(
          { err },
          'could not mark the worker stopped; the reconciler takes its claims once its heartbeat is stale',
        ),
      );
  }

  #beat(): void {
    if (this.#beating !== undefined) return;
    this.#beating = this.#beatOnce().finally(() => {
      this.#beating = undefined;
    });
  }

  /**
   * Takes the connection first and only then copies the list of held claims: a claim taken while the beat waited
   * for a connection is in the list it stamps `claims_listed_at` with, never left out of it.
   */
  async #beatOnce(): Promise<void> {
    const { o, q } = this.#ctx;
    let client: PoolClient | undefined;
    let lost: Error | undefined;
    const onError = (err: Error): void => {
      lost = err;
    };
    try {
      client = await o.pool.connect();
      client.on('error', onError);
      await client.query(q.workerHeartbeat, [o.workerId, [...this.#held()]]);
      this.#failures.ok();
      if (this.#timer !== undefined) this.#beaten();
    } catch (err) {
      if (isConnectionError(err)) lost ??= err as Error;
      this.#failures.fail(err);
    } finally {
      client?.off('error', onError);
      client?.release(lost);
    }
  }
}
