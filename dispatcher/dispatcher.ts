/**
 * One dispatcher worker, composed River style: the producer (dispatcher/producer.ts) claims only as many
 * operations as it has free slots and hands each to the pipeline (dispatcher/pipeline.ts), which carries it
 * through route check -> fresh authorization -> dispatch batch (dispatcher/dispatch-batch.ts: evidence, locks,
 * final check, one provider call, savepoint writes) -> fenced outcome; the completer (dispatcher/completer.ts)
 * writes what ends a claim outside the batch.
 *
 * Lifecycle states:
 *   idle      - not started, or stopped; `start()` (again) makes it running
 *   running   - the producer claims, the pipelines run
 *   stopping  - no more claims; in-flight operations finish (up to the deadline) and record their outcomes,
 *               then writes still owed are abandoned to the reconciler and the worker is marked stopped
 * `start()` and `stop()` run one after the other, each after the previous call has finished: a stop called while
 * another drains resolves only after it, once the worker is idle.
 *
 * Every claim it holds is listed in its heartbeat until its last write has landed. A claim it cannot finish
 * and never sent (a transient database failure at evidence or at the dispatch batch) is released back to
 * pending; an outcome it cannot write after the provider was called is retried until it lands or the worker
 * stops (dispatcher/persist.ts). An `executing` row is never re-claimed because of its age: a worker that dies,
 * stops, or drops a claim from its listing leaves it for the reconciler.
 */
import type { Agent } from 'undici';
import { bindQueries, prepared, warmPool } from '../db/index.js';
import { asActionLedgerError } from '../core/errors.js';
import { RepeatedFailureLog } from '../core/log.js';
import { BATCH_OPENINGS, batchOpenings } from './batcher.js';
import { Completer } from './completer.js';
import type { DispatchContext, DispatcherOptions } from './context.js';
import { DispatchBatch } from './dispatch-batch.js';
import { WorkerHalted } from './persist.js';
import { Service } from '../core/service.js';
import { Pipeline } from './pipeline.js';
import { Producer } from './producer.js';
import { dispatcherQueries } from './queries.js';

export type { DispatcherOptions } from './context.js';

/**
 * Connections a dispatcher worker's pool keeps open (`createPool`'s `min`), and opens when the worker starts:
 * the LISTEN connection, the openings of two providers' dispatch batchers (each opening records its batch's
 * evidence and takes its locks on one connection), and a quarter of the slots for dispatch batches out at their
 * provider. The benchmark's dispatcher pool, opening connections on demand, held 7 after a saturated run at
 * concurrency 8, and 9 to 12 at 32 (saturated, and after bursts at half the peak; measured with the evidence
 * in batches of its own, before c2b8a47). A connection opened during a burst costs the operation waiting for it tens of
 * milliseconds. The claim connection is outside the pool.
 */
export function dispatcherPoolFloor(concurrency: number): number {
  return 1 + 2 * BATCH_OPENINGS + Math.ceil(concurrency / 4);
}

/**
 * The least time between two attempts to open the pool's floor again after it lost connections: a server that
 * refuses connections (too many clients) is not asked again at every heartbeat.
 */
export const FLOOR_REOPEN_INTERVAL_MS = 10_000;

export class Dispatcher extends Service<[deadlineMs?: number]> {
  readonly #o: DispatcherOptions;
  readonly #producer: Producer;
  /** Registered and claiming: what a stop has to drain (a start that failed to register left nothing). */
  #claiming = false;
  /** Aborted when a stop's deadline has passed (or the stop found nothing in flight): owed writes give up. */
  #halt = new AbortController();
  #agents: { authorizer: Agent; provider: Agent } | undefined;
  /** The floor being opened again (at most one attempt at a time), and when the next may start. */
  #reopening: Promise<unknown> | undefined;
  #nextReopenAt = 0;

  constructor(options: DispatcherOptions) {
    super();
    this.#o = options;
    const q = bindQueries(dispatcherQueries, options.config.schemaQuoted);
    const ctx: DispatchContext = {
      o: options,
      q,
      prepared: {
        evidenceRecordBatch: prepared(q.evidenceRecordBatch),
        operationLockForDispatchBatch: prepared(q.operationLockForDispatchBatch),
        operationFinalCheckBatch: prepared(q.operationFinalCheckBatch),
        operationCompleteBatch: prepared(q.operationCompleteBatch),
      },
      halt: () => this.#halt.signal,
      openings: () => batchOpenings(this.#producer.inFlight, options.concurrency),
      wake: () => this.#producer.wake(),
      agent: (kind) => this.#agent(kind),
      writeFailures: new RepeatedFailureLog(options.log, 'a write this worker owes failed; retrying it'),
    };
    const completer = new Completer(ctx);
    const dispatches = new DispatchBatch(ctx, completer);
    const pipeline = new Pipeline(ctx, dispatches, completer);
    this.#producer = new Producer(
      ctx,
      (op) => pipeline.run(op),
      () => dispatches.poke(),
      () => this.#keepFloor(),
    );
    this.#agents = { authorizer: options.agent(), provider: options.agent() };
  }

  /** This worker's id: its row in the workers table, and the `claimed_by` of what it claims. */
  get workerId(): string {
    return this.#o.workerId;
  }

  get inFlight(): number {
    return this.#producer.inFlight;
  }

  /** Asks the producer to claim if it has free slots; safe to call any time, from anywhere. */
  wake(): void {
    this.#producer.wake();
  }

  /**
   * Registers the worker and starts claiming (the start/stop life is core/service.ts's: after a stop it starts
   * again, with new agents and a new heartbeat). Throws the database failure's code (`database_unavailable`,
   * `storage_full`, ...) when the worker cannot be registered; it is then not running, and may be started again.
   */
  protected async onStart(): Promise<void> {
    this.#halt = new AbortController();
    // The constructor's, or kept from a stop whose deadline passed (operations of that run may still use them);
    // a clean stop closed them.
    this.#agents ??= { authorizer: this.#o.agent(), provider: this.#o.agent() };
    try {
      await this.#producer.register();
    } catch (err) {
      await this.#closeAgents();
      throw asActionLedgerError(err);
    }
    this.#claiming = true;
    // Best effort: a connection that does not open now is opened on demand.
    await warmPool(this.#o.pool, dispatcherPoolFloor(this.#o.concurrency));
    await this.#producer.start();
  }

  /**
   * Stops claiming, lets in-flight operations finish until `deadlineMs` (default 15 s), then gives up the writes
   * still owed (their claims go to the reconciler) and marks the worker stopped; resolves once it has fully
   * stopped (drained or past its deadline, the LISTEN and heartbeat connections released, marked stopped).
   * Never throws.
   */
  protected async onStop(deadlineMs = 15_000): Promise<void> {
    if (!this.#claiming) return;
    this.#claiming = false;
    const clean = await this.#producer.drain(deadlineMs);
    this.#halt.abort(new WorkerHalted());
    if (!clean)
      this.#o.log.warn(
        { in_flight: this.#producer.inFlight, claims: this.#producer.held },
        'stop deadline passed with operations in flight; they stay executing for the reconciler',
      );
    await this.#producer.close();
    await this.#reopening;
    // Idle keep-alive connections only: in-flight work has drained or the deadline passed.
    if (clean) await this.#closeAgents();
  }

  /**
   * After a heartbeat the database took: a pool that lost connections (a server restart, a failover, connections
   * terminated) has them opened again, up to the floor it keeps (its `min`, at most `dispatcherPoolFloor`). pg-pool
   * opens connections only on demand, so without this the first operations after an outage would each wait for
   * a connect. Never while callers wait for a client, never twice at once, and at most every
   * `FLOOR_REOPEN_INTERVAL_MS`.
   */
  #keepFloor(): void {
    const pool = this.#o.pool;
    const floor = Math.min((pool.options as { min?: number }).min ?? 0, dispatcherPoolFloor(this.#o.concurrency));
    if (!this.running || this.#reopening !== undefined || pool.totalCount >= floor) return;
    if (pool.waitingCount > 0 || Date.now() < this.#nextReopenAt) return;
    this.#nextReopenAt = Date.now() + FLOOR_REOPEN_INTERVAL_MS;
    this.#reopening = warmPool(pool, floor).finally(() => {
      this.#reopening = undefined;
    });
  }

  async #closeAgents(): Promise<void> {
    const agents = this.#agents;
    this.#agents = undefined;
    if (agents !== undefined)
      await Promise.all([agents.authorizer.close(), agents.provider.close()]).catch(() => undefined);
  }

  /** The agents of the current run; an operation still in flight from an earlier run uses the new ones. */
  #agent(kind: 'authorizer' | 'provider'): Agent {
    if (this.#agents === undefined) throw new WorkerHalted();
    return this.#agents[kind];
  }
}
