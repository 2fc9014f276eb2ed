/**
 * The producer of one dispatcher worker: claims only as many operations as it has free slots, and hands each to
 * `work`. Its two helpers own the rest: the heartbeat (dispatcher/heartbeat.ts: the worker's row, beaten with the
 * claims this producer holds) and the wake sources (dispatcher/wake-sources.ts: NOTIFY, this process's
 * reservations, the poll, the due timer), which only call `wake()`. What is left here is the claim loop and the
 * slots: every flag below belongs to it.
 *
 * Loop states (graphile-worker style):
 *   idle      - not started, or closed; `start()` makes it running
 *   running   - claims when it has free slots: woken by NOTIFY, a reservation committed by this process
 *               (core/local-wake.ts), or the poll timer, and by a finished slot while work may be waiting
 *               (the last claim filled its limit and saw more waiting, or failed, or a wake-up came since it
 *               was sent); one claim statement in flight at a time, for `free slots` (capped at batchSize)
 *               operations; a heartbeat every interval, skipped while the previous one is still in flight
 *   draining  - no more claims, wake-ups (the LISTEN connection released) or heartbeats; the claim statement in
 *               flight lands (its operations run too), then the operations in flight finish, up to the deadline
 *   idle      - after `close()`: the heartbeat in flight landed, the claim connection closed
 *               (dispatcher/claim-session.ts), the worker marked stopped
 *
 * Every claim it holds is listed in its heartbeat until its work has settled (the last write landed, or given up).
 */
import * as diagnosticsChannel from 'node:diagnostics_channel';
import { prepared } from '../db/index.js';
import { notifyOtherProcesses } from '../core/local-wake.js';
import { RepeatedFailureLog } from '../core/log.js';
import { ClaimSession, openClaimConnection } from './claim-session.js';
import type { DispatchContext } from './context.js';
import { Heartbeat } from './heartbeat.js';
import type { ClaimedOperation } from './types.js';
import { tracingOn } from '../core/tracing.js';
import { WakeSources } from './wake-sources.js';

/**
 * Every claim a worker's producer made, with its answer or its failure (which may have come before any statement
 * was sent, as a failure to connect), published on the diagnostics channel
 * `actionledger:claim` (nothing is built when no one subscribes): for benchmarks and tests that time claims.
 */
export interface ClaimEvent {
  workerId: string;
  limit: number;
  rows: readonly ClaimedOperation[];
  /** Whether the producer counts on more work waiting (the claim filled its limit and saw more). */
  more?: boolean;
  /** Set when the claim failed (`rows` is then empty). */
  error?: unknown;
}

const claimChannel = diagnosticsChannel.channel('actionledger:claim');

/**
 * A row of the claim statement: a claimed operation, whether more was waiting, and how long until the earliest
 * row still in its backoff is available (dispatcher/queries.ts).
 */
type ClaimRow = ClaimedOperation & { more_waiting: boolean; next_in_ms: number | null };

export class Producer {
  readonly #ctx: DispatchContext;
  readonly #work: (op: ClaimedOperation) => Promise<void>;
  readonly #freed: () => void;
  readonly #heartbeat: Heartbeat;
  readonly #wakes: WakeSources;
  readonly #inFlight = new Set<Promise<void>>();
  /** Claim tokens this worker holds: claimed and not yet finished, released, or given up. The heartbeat lists them. */
  readonly #held = new Set<string>();
  #state: 'idle' | 'running' | 'draining' = 'idle';
  /** The claim loop, while it runs. */
  #claiming: Promise<void> | undefined;
  #wakeAgain = false;
  /**
   * Whether claimable work may be waiting: set by every wake-up from outside (NOTIFY, a local reservation, the
   * poll, a release's timer), by a claim that filled its limit and saw more waiting, and by a claim that failed;
   * cleared as a claim statement is sent. A finished operation claims again only while it is set, so an emptied
   * queue costs no claim per finished operation, even when every claim fills its limit. Work nothing announces
   * (a row another session held when the claim skipped it) waits for the poll.
   */
  #backlog = true;
  /**
   * Operations of this process this producer took (`#takeLocal`: no NOTIFY was sent for them) and has not yet
   * sent a claim statement for; each holds a slot.
   */
  #taken = new Set<string>();
  /** The limit of the claim statement in flight (0 when none): slots its rows may fill. */
  #claimLimit = 0;
  /** The last claim failed: local wake-ups are not taken, so their NOTIFY wakes the other processes. */
  #claimsFailing = false;
  /** The connection claims run on (dispatcher/claim-session.ts), opened by the first claim. */
  readonly #claims: ClaimSession<ClaimRow>;
  readonly #claimFailures: RepeatedFailureLog;

  /**
   * `work` carries one claimed operation to its end; it must never reject (the slot is freed when it settles).
   * `freed` is told each time a slot frees (the batchers may then open a second batch: `batchOpenings`);
   * `beaten` after each heartbeat the database took (it is reachable).
   */
  constructor(
    ctx: DispatchContext,
    work: (op: ClaimedOperation) => Promise<void>,
    freed: () => void = () => undefined,
    beaten: () => void = () => undefined,
  ) {
    this.#ctx = ctx;
    this.#work = work;
    this.#freed = freed;
    this.#heartbeat = new Heartbeat(ctx, () => this.#held, beaten);
    this.#wakes = new WakeSources(
      ctx,
      () => this.wake(),
      (id) => this.#takeLocal(id),
    );
    this.#claimFailures = new RepeatedFailureLog(ctx.o.log, 'claim failed; retrying on the next wake-up');
    this.#claims = new ClaimSession(
      () => openClaimConnection(ctx.o.pool),
      prepared(ctx.q.outboxClaimBatch),
      () =>
        ctx.o.log.warn(
          'the claim connection does not have its planner settings (a pooler dropped or refused them); claims run unnamed on it',
        ),
    );
  }

  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** How many claims this worker holds (listed in its heartbeat). */
  get held(): number {
    return this.#held.size;
  }

  /** Registers the worker (live, no claims listed). Throws the raw database failure. */
  register(): Promise<void> {
    return this.#heartbeat.register();
  }

  /** Starts the heartbeat and the wake sources, and claims at once. */
  async start(): Promise<void> {
    this.#state = 'running';
    this.#heartbeat.start();
    await this.#wakes.start();
    this.wake();
  }

  /**
   * Stops claiming and heartbeats, then waits for the claim statement in flight and every operation in flight,
   * for at most `deadlineMs`. Resolves true when all of them finished in time.
   */
  async drain(deadlineMs: number): Promise<boolean> {
    this.#state = 'draining';
    this.#wakes.stop();
    // Reservations it took and will not claim now: the other dispatchers are told.
    if (this.#taken.size > 0) this.#announce();
    const stoppedBeating = this.#heartbeat.stop();
    const drained = (async () => {
      await this.#claiming;
      await Promise.all([...this.#inFlight]);
      return true;
    })();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((r) => {
      timer = setTimeout(() => r(false), deadlineMs);
    });
    const clean = await Promise.race([drained, timeout]);
    clearTimeout(timer);
    await stoppedBeating;
    return clean;
  }

  /**
   * Releases the LISTEN connection, closes the claim connection (now, or as soon as a claim still in flight
   * settles, never waiting for it), waits for the heartbeat in flight, and marks the worker stopped. Never throws.
   */
  async close(): Promise<void> {
    this.#state = 'idle';
    this.#wakes.stop();
    this.#claims.close();
    await this.#heartbeat.stop();
    await this.#heartbeat.markStopped();
  }

  /** Asks the producer to claim if it has free slots; safe to call any time, from anywhere. */
  wake(): void {
    this.#backlog = true;
    this.#kick();
  }

  /**
   * Sends the NOTIFY the ledger left out for operations this producer took and may not claim (its claim came
   * back full of other work, failed, or it is stopping): the other processes' dispatchers claim them instead.
   * Its mark as payload: this process's dispatchers were woken already.
   */
  #announce(): void {
    this.#taken.clear();
    notifyOtherProcesses(this.#ctx.o.pool, this.#wakes.channel);
  }

  /**
   * Work this process committed (core/local-wake.ts): wakes the producer, and returns true when it takes
   * `operationId`, so that the ledger sends no NOTIFY for it: the producer is running, its claims succeed, and it
   * has a slot that neither its operations in flight, nor the claim in flight, nor an operation it took earlier
   * may fill. Its next claim statement sees the operation (committed before this call); if older work fills that
   * claim first, the operation goes to the next claim or is announced (`#claim`).
   */
  #takeLocal(operationId?: string): boolean {
    const { o } = this.#ctx;
    const room = o.concurrency - this.#inFlight.size - this.#claimLimit - this.#taken.size;
    const take = operationId !== undefined && this.#state === 'running' && !this.#claimsFailing && room > 0;
    if (take) this.#taken.add(operationId);
    this.wake();
    return take;
  }

  /** Claims now if no claim is in flight, or once more after the one in flight. */
  #kick(): void {
    if (this.#state !== 'running') return;
    if (this.#claiming !== undefined) {
      this.#wakeAgain = true;
      return;
    }
    this.#claiming = this.#claim().finally(() => {
      this.#claiming = undefined;
      // A wake-up between the loop's last check and now (another operation's finish in the same tick).
      if (this.#wakeAgain) this.#kick();
    });
  }

  async #claim(): Promise<void> {
    const { o } = this.#ctx;
    let limit = 0;
    try {
      for (;;) {
        this.#wakeAgain = false;
        const free = o.concurrency - this.#inFlight.size;
        if (free <= 0 || this.#state !== 'running') break;
        limit = Math.min(free, o.batchSize);
        // A wake-up while the statement runs sets it again (and `#wakeAgain`): what committed after the
        // statement's snapshot is claimed by the next one.
        this.#backlog = false;
        // The operations taken so far committed before this statement's snapshot: it claims them, unless older
        // work fills its limit first.
        const taken = this.#taken;
        this.#taken = new Set();
        this.#claimLimit = limit;
        const sentAt = tracingOn() ? Date.now() : 0;
        const rows = await this.#claims
          .claim([limit, o.workerId])
          .catch((err: unknown) => {
            for (const id of taken) this.#taken.add(id);
            throw err;
          })
          .finally(() => {
            this.#claimLimit = 0;
          });
        this.#claimsFailing = false;
        for (const op of rows) {
          taken.delete(op.operation_id);
          // Taken while this claim was out, and committed before its snapshot: claimed already.
          this.#taken.delete(op.operation_id);
        }
        // Left out of a full claim (older work came first): the next claim takes them while slots remain; with
        // none left, or the producer draining, the other dispatchers are told. Left out of a claim that was not
        // full, another session had them already.
        if (taken.size > 0 && rows.length === limit) {
          for (const id of taken) this.#taken.add(id);
          if (limit >= o.concurrency - this.#inFlight.size || this.#state !== 'running') this.#announce();
        }
        // More may be waiting after a claim that filled its limit and whose snapshot held more than it took, or
        // that left out operations this process took; after one that did not fill its limit, nothing it could
        // see. What committed after its snapshot sends a wake-up of its own.
        const more = rows.length === limit && (rows[0]?.more_waiting !== false || this.#taken.size > 0);
        const ops = rows.map(({ more_waiting: _more, next_in_ms: _next, ...op }): ClaimedOperation => op);
        if (claimChannel.hasSubscribers)
          claimChannel.publish({ workerId: o.workerId, limit, rows: ops, more } satisfies ClaimEvent);
        if (more) this.#backlog = true;
        this.#claimFailures.ok();
        if (rows.length > 0) {
          o.metrics.claims.inc(rows.length);
          o.metrics.claimBatches.inc();
        }
        const claimedAt = performance.now();
        const answeredAt = sentAt === 0 ? 0 : Date.now();
        for (const op of ops)
          this.#track(
            sentAt === 0
              ? { ...op, claimed_at_ms: claimedAt }
              : { ...op, claimed_at_ms: claimedAt, claim_sent_at: sentAt, claim_answered_at: answeredAt },
          );
        const nextInMs = rows[0]?.next_in_ms;
        if (typeof nextInMs === 'number' && Number.isFinite(nextInMs) && this.#state === 'running')
          this.#wakes.wakeIn(nextInMs);
        if (!more && !this.#wakeAgain) break;
      }
    } catch (err) {
      if (claimChannel.hasSubscribers)
        claimChannel.publish({ workerId: o.workerId, limit, rows: [], error: err } satisfies ClaimEvent);
      this.#backlog = true;
      this.#claimsFailing = true;
      this.#claimFailures.fail(err);
      if (this.#taken.size > 0) this.#announce();
    }
  }

  /** Holds one claimed operation's slot and listing until its work settles. */
  #track(op: ClaimedOperation): void {
    this.#ctx.o.metrics.inFlight.inc();
    this.#held.add(op.claim_token);
    const p = this.#work(op).finally(() => {
      this.#held.delete(op.claim_token);
      this.#inFlight.delete(p);
      this.#ctx.o.metrics.inFlight.dec();
      this.#freed();
      if (this.#backlog) this.#kick();
    });
    this.#inFlight.add(p);
  }
}
