/**
 * The orphan watch: a dead worker's claims are reconciled within seconds, not at the next scheduled pass. Every
 * fleet runs one; whichever notices first runs the pass (the pass lock keeps it to one at a time, and every write
 * of the pass is fenced on the claim it read, as a scheduled pass's are).
 *
 * It notices three ways:
 *   - at start: one pass at once (a fleet that starts after a crash heals what the crash left);
 *   - every `reconciler.orphan_check_interval_ms`: one cheap statement asks whether any `executing` claim is
 *     orphaned (its worker stopped, vanished from the table, stopped heartbeating for `orphan_after_ms`, or no
 *     longer lists it), or any `unknown` operation's next check is due (a dead worker's claim waiting out the
 *     provider timeout before its readback can be trusted, a backoff that ended); if so, a pass;
 *   - `poke()`: a check now, called by the fleet's parent the moment one of its workers exits (it marks the
 *     worker stopped first, so the worker's claims are orphaned at once instead of after the heartbeat lapses).
 * A pass that found the lock held (another fleet's pass, the schedule's) leaves the orphans to that pass; the
 * next tick looks again while any remain.
 *
 * States: stopped -> running: idle <-> checking -> passing -> idle ... -> stopping (waits for the pass in
 * progress) -> stopped; the start/stop life is core/service.ts's.
 */
import type { Config } from '../config/index.js';
import { bindQueries, type Pool } from '../db/index.js';
import { RepeatedFailureLog, type Logger } from '../core/log.js';
import { Service } from '../core/service.js';
import { reconcilerQueries } from './queries.js';

export interface OrphanWatchOptions {
  config: Config;
  pool: Pool;
  log: Logger;
  /** One reconciliation pass (the fleet's: reconcile, then compensate, under the pass lock). */
  pass(): Promise<unknown>;
}

export class OrphanWatch extends Service {
  readonly #o: OrphanWatchOptions;
  readonly #q: Readonly<typeof reconcilerQueries>;
  readonly #failures: RepeatedFailureLog;
  #timer: NodeJS.Timeout | undefined;
  /** The check or pass in progress; a poke meanwhile asks for one more check after it. */
  #busy: Promise<void> | undefined;
  #again = false;

  constructor(options: OrphanWatchOptions) {
    super();
    this.#o = options;
    this.#q = bindQueries(reconcilerQueries, options.config.schemaQuoted);
    this.#failures = new RepeatedFailureLog(options.log, 'orphan watch: the check or its pass failed');
  }

  /** Runs a pass at once, then checks every interval (unless the interval is 0: then only the pass and pokes). */
  protected onStart(): Promise<void> {
    this.#kick(true);
    const every = this.#o.config.reconciler.orphanCheckIntervalMs;
    if (every > 0) {
      this.#timer = setInterval(() => this.#kick(false), every);
      this.#timer.unref();
    }
    return Promise.resolve();
  }

  /** Looks for orphaned claims now. Does nothing once stopped. */
  poke(): void {
    this.#kick(false);
  }

  /**
   * A worker process exited (its parent saw it): marks its dispatcher (by id) stopped, so its claims are orphaned
   * now, and looks for them. A failure to mark it is logged; its heartbeat's lapse orphans the claims later.
   */
  workerExited(workerId: string): void {
    if (!this.running) return;
    this.#o.pool.query(this.#q.workerExited, [workerId]).then(
      () => this.poke(),
      (err: unknown) => this.#failures.fail(err, { worker_id: workerId }),
    );
  }

  /** No more checks; waits for a check or pass in progress. */
  protected async onStop(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#again = false;
    await this.#busy;
  }

  #kick(force: boolean): void {
    if (!this.#live()) return;
    if (this.#busy !== undefined) {
      this.#again = true;
      return;
    }
    this.#busy = this.#round(force).finally(() => {
      this.#busy = undefined;
      if (this.#again && this.#live()) {
        this.#again = false;
        this.#kick(false);
      }
    });
  }

  /** One check (skipped when `force`), and a pass when it found orphans. Never rejects. */
  async #round(force: boolean): Promise<void> {
    try {
      if (!force) {
        const { rows } = await this.#o.pool.query<{ found: boolean }>(this.#q.orphansWaiting, [
          this.#o.config.reconciler.orphanAfterMs,
        ]);
        if (rows[0]?.found !== true) return this.#failures.ok();
      }
      if (!this.#live()) return;
      await this.#o.pass();
      this.#failures.ok();
    } catch (err) {
      this.#failures.fail(err);
    }
  }

  /** Running, or starting (the first pass is kicked from onStart); not once a stop was asked for. */
  #live(): boolean {
    return this.lifecycle === 'running' || this.lifecycle === 'starting';
  }
}
