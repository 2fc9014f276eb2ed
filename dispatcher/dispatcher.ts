/**
 * One dispatcher worker: claims only as many operations as it has free slots and carries each through
 * route check -> fresh authorization -> evidence -> final check under the row lock -> one provider call ->
 * fenced outcome.
 *
 * Loop states (graphile-worker style):
 *   idle      - not started, or stopped; `start()` (again) makes it running
 *   running   - claims when it has free slots: woken by NOTIFY, a finished slot, or the poll timer; one claim
 *               statement in flight at a time, for `free slots` (capped at batchSize) operations
 *   stopping  - no more claims; in-flight operations finish (up to the deadline) and record their outcomes,
 *               then writes still owed are abandoned to the reconciler and the heartbeat marks it stopped
 *
 * Every claim it holds is listed in its heartbeat until its last write has landed. A claim it cannot finish
 * and never sent (a transient database failure at evidence or at the dispatch batch) is released back to
 * pending; an outcome it cannot write after the provider was called is retried until it lands or the worker
 * stops (dispatcher/persist.ts). An `executing` row is never re-claimed because of its age: a worker that dies,
 * stops, or drops a claim from its listing leaves it for the reconciler.
 */
import { hostname } from 'node:os';
import type { Agent } from 'undici';
import type { Config, ToolRoute } from '../core/config.js';
import {
  bindQueries,
  databaseErrorCode,
  isConnectionError,
  isTransient,
  prepared,
  isRetryable,
  sqlState,
  SQLSTATE,
  type Pool,
  type PoolClient,
} from '../core/db.js';
import { ActionLedgerError, asActionLedgerError, isActionLedgerError, type ErrorCode } from '../core/errors.js';
import { canonicalJson, sha256Hex, type JsonValue } from '../core/json.js';
import { RepeatedFailureLog, type Logger } from '../core/log.js';
import type { Secret } from '../core/secret.js';
import { Batcher, submit, type Settle } from './batcher.js';
import { authorizationRequest, checkWindows, fetchAuthorization, type AuthorizationDecision } from './authorize.js';
import type { CrashPoints } from './crash-points.js';
import { callProvider, classify, type Outcome } from './executor.js';
import { gate, runGated } from './gate-scope.js';
import type { DispatchMetrics } from './metrics.js';
import { pause, untilWritten, WorkerHalted } from './persist.js';
import type { DispatchProfile } from './profile.js';
import { dispatcherQueries } from './queries.js';
import type { ClaimedOperation, DispatchStage } from './types.js';
import type { ProviderContact } from '../ledger/index.js';

export interface DispatcherOptions {
  config: Config;
  pool: Pool;
  log: Logger;
  metrics: DispatchMetrics;
  profile: DispatchProfile;
  /** Makes a new mTLS agent; each start takes one for the authorizer and one for providers, and stop closes them. */
  agent: () => Agent;
  /** Provider credentials by tool name, resolved from the environment at start. */
  credentials: ReadonlyMap<string, Secret>;
  crash: CrashPoints;
  workerId: string;
  concurrency: number;
  batchSize: number;
  pollIntervalMs: number;
  heartbeatIntervalMs: number;
}

/** How long a released operation waits in the outbox before it can be claimed again. */
const RELEASE_BACKOFF_MS = 1_000;
/** A row another session holds is tried again after 20 ms, doubling to this cap, while its claim holds. */
const BUSY_RETRY_MAX_MS = 1_000;

export class Dispatcher {
  readonly #o: DispatcherOptions;
  readonly #q: Readonly<typeof dispatcherQueries>;
  /** The per-batch statements, prepared once per connection. */
  readonly #prepared: Record<
    'evidenceRecordBatch' | 'operationLockForDispatchBatch' | 'operationFinalCheckBatch' | 'operationCompleteBatch',
    { name: string; text: string }
  >;
  readonly #inFlight = new Set<Promise<void>>();
  /** Claim tokens this worker holds: claimed and not yet finished, released, or given up. The heartbeat lists them. */
  readonly #held = new Set<string>();
  readonly #channel: string;
  readonly #gatedCall: typeof callProvider;
  #state: 'idle' | 'running' | 'stopping' = 'idle';
  /** start() and stop() run one after the other, each after the previous one has finished. */
  #lifecycle: Promise<void> = Promise.resolve();
  /** Aborted when a stop's deadline has passed (or the stop found nothing in flight): owed writes give up. */
  #halt = new AbortController();
  #agents: { authorizer: Agent; provider: Agent } | undefined;
  #claiming = false;
  #wakeAgain = false;
  #listener: PoolClient | undefined;
  #poll: NodeJS.Timeout | undefined;
  #heartbeat: NodeJS.Timeout | undefined;
  readonly #evidence: Batcher<EvidenceItem>;
  readonly #dispatches: Batcher<DispatchItem>;
  readonly #claimFailures: RepeatedFailureLog;
  readonly #heartbeatFailures: RepeatedFailureLog;
  readonly #writeFailures: RepeatedFailureLog;

  constructor(options: DispatcherOptions) {
    this.#o = options;
    this.#q = bindQueries(dispatcherQueries, options.config.schemaQuoted);
    this.#prepared = {
      evidenceRecordBatch: prepared(this.#q.evidenceRecordBatch),
      operationLockForDispatchBatch: prepared(this.#q.operationLockForDispatchBatch),
      operationFinalCheckBatch: prepared(this.#q.operationFinalCheckBatch),
      operationCompleteBatch: prepared(this.#q.operationCompleteBatch),
    };
    this.#channel = `${options.config.schema}_outbox`;
    this.#gatedCall = gate(callProvider, () => options.metrics.ungated.inc());
    this.#evidence = new Batcher(options.batchSize, (items) => this.#recordEvidenceBatch(items));
    this.#dispatches = new Batcher(options.batchSize, (items) => this.#openDispatchBatch(items));
    this.#claimFailures = new RepeatedFailureLog(options.log, 'claim failed; retrying on the next wake-up');
    this.#heartbeatFailures = new RepeatedFailureLog(options.log, 'heartbeat failed');
    this.#writeFailures = new RepeatedFailureLog(options.log, 'a write this worker owes failed; retrying it');
    this.#agents = { authorizer: options.agent(), provider: options.agent() };
  }

  get inFlight(): number {
    return this.#inFlight.size;
  }

  /**
   * Registers the worker and starts claiming. Resolves once it is running; a no-op when it already runs. After
   * `stop()` it starts again (with new agents and a new heartbeat). Waits for a start or stop in progress
   * first. Throws the database failure's code (`database_unavailable`, `storage_full`, ...) when the worker
   * cannot be registered; it is then not running, and `start()` may be called again.
   */
  start(): Promise<void> {
    const started = this.#lifecycle.then(() => this.#start());
    this.#lifecycle = started.catch(() => undefined);
    return started;
  }

  /**
   * Stops claiming, lets in-flight operations finish until `deadlineMs`, then gives up the writes still owed
   * (their claims go to the reconciler) and marks the worker stopped. Safe before `start()` and safe to repeat;
   * every call, concurrent ones included, resolves only once the worker has fully stopped. Never throws.
   */
  stop(deadlineMs = 15_000): Promise<void> {
    const stopped = this.#lifecycle.then(() => this.#stop(deadlineMs));
    this.#lifecycle = stopped.catch(() => undefined);
    return stopped;
  }

  async #start(): Promise<void> {
    if (this.#state === 'running') return;
    this.#halt = new AbortController();
    // The constructor's, or kept from a stop whose deadline passed (operations of that run may still use them);
    // a clean stop closed them.
    this.#agents ??= { authorizer: this.#o.agent(), provider: this.#o.agent() };
    this.#state = 'running';
    try {
      await this.#o.pool.query(this.#q.workerUpsert, [this.#o.workerId, process.pid, hostname()]);
    } catch (err) {
      this.#state = 'idle';
      await this.#closeAgents();
      throw asActionLedgerError(err);
    }
    this.#heartbeat = setInterval(() => this.#beat(), this.#o.heartbeatIntervalMs);
    await this.#listen();
    this.#poll = setInterval(() => this.wake(), this.#o.pollIntervalMs);
    this.wake();
  }

  async #stop(deadlineMs: number): Promise<void> {
    if (this.#state !== 'running') return;
    this.#state = 'stopping';
    clearInterval(this.#poll);
    clearInterval(this.#heartbeat);
    const drained = Promise.all([...this.#inFlight]).then(() => true);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((r) => {
      timer = setTimeout(() => r(false), deadlineMs);
    });
    const clean = await Promise.race([drained, timeout]);
    clearTimeout(timer);
    this.#halt.abort();
    if (!clean)
      this.#o.log.warn(
        { in_flight: this.#inFlight.size, claims: this.#held.size },
        'stop deadline passed with operations in flight; they stay executing for the reconciler',
      );
    const listener = this.#listener;
    this.#listener = undefined;
    listener?.release();
    await this.#o.pool
      .query(this.#q.workerStopped, [this.#o.workerId])
      .catch((err: unknown) =>
        this.#o.log.warn(
          { err },
          'could not mark the worker stopped; the reconciler takes its claims once its heartbeat is stale',
        ),
      );
    // Idle keep-alive connections only: in-flight work has drained or the deadline passed.
    if (clean) await this.#closeAgents();
    this.#state = 'idle';
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

  /** One heartbeat, listing the claims this worker holds now. */
  #beat(): void {
    this.#o.pool.query(this.#q.workerHeartbeat, [this.#o.workerId, [...this.#held]]).then(
      () => this.#heartbeatFailures.ok(),
      (err: unknown) => this.#heartbeatFailures.fail(err),
    );
  }

  async #listen(): Promise<void> {
    try {
      const client = await this.#o.pool.connect();
      client.on('notification', () => this.wake());
      client.on('error', (err) => {
        // Released already by stop() (or by an earlier error): nothing to give back.
        if (this.#listener !== client) return;
        this.#o.log.warn({ err }, 'LISTEN connection lost; polling until it is back');
        this.#listener = undefined;
        client.release(err);
        if (this.#state === 'running') setTimeout(() => void this.#listen(), 1000).unref();
      });
      await client.query(`LISTEN "${this.#channel}"`);
      if (this.#state !== 'running') {
        client.release();
        return;
      }
      this.#listener = client;
    } catch (err) {
      this.#o.log.warn({ err }, 'LISTEN failed; polling');
      if (this.#state === 'running') setTimeout(() => void this.#listen(), 1000).unref();
    }
  }

  /** Asks the producer to claim if it has free slots; safe to call any time, from anywhere. */
  wake(): void {
    if (this.#state !== 'running') return;
    if (this.#claiming) {
      this.#wakeAgain = true;
      return;
    }
    void this.#claim();
  }

  async #claim(): Promise<void> {
    this.#claiming = true;
    try {
      for (;;) {
        this.#wakeAgain = false;
        const free = this.#o.concurrency - this.#inFlight.size;
        if (free <= 0 || this.#state !== 'running') break;
        const limit = Math.min(free, this.#o.batchSize);
        const { rows } = await this.#o.pool.query<ClaimedOperation>(this.#q.outboxClaimBatch, [
          limit,
          this.#o.workerId,
        ]);
        this.#claimFailures.ok();
        if (rows.length > 0) {
          this.#o.metrics.claims.inc(rows.length);
          this.#o.metrics.claimBatches.inc();
        }
        for (const op of rows) this.#track(op);
        if (rows.length < limit && !this.#wakeAgain) break;
      }
    } catch (err) {
      this.#claimFailures.fail(err);
    } finally {
      this.#claiming = false;
    }
  }

  #track(op: ClaimedOperation): void {
    this.#o.metrics.inFlight.inc();
    this.#held.add(op.claim_token);
    const progress = { sent: false };
    const p = this.#process(op, progress)
      .catch((err: unknown) => this.#recover(op, progress.sent, err))
      .catch((err: unknown) => {
        if (err instanceof WorkerHalted) {
          this.#o.log.warn(
            { operation_id: op.operation_id, sent: progress.sent },
            'worker stopped with a write owed; the operation stays executing for the reconciler',
          );
          return;
        }
        this.#o.log.error(
          { err, operation_id: op.operation_id, sent: progress.sent },
          'could not record the failure; the claim is no longer listed, so the reconciler takes it',
        );
      })
      .finally(() => {
        this.#held.delete(op.claim_token);
        this.#inFlight.delete(p);
        this.#o.metrics.inFlight.dec();
        this.wake();
      });
    this.#inFlight.add(p);
  }

  /**
   * A claim the normal path could not finish. Never sent and the failure transient (a full disk, a lost
   * connection, a timeout): released back to pending (`released:<code>`), to be claimed again. Possibly sent:
   * `unknown`, for the reconciler's readback (the provider may have the effect, so it is never released). Not
   * sent but unexpected (a bug): `needs_review` (`internal:<code>`; a reviewed retry is safe). Each write is
   * retried while the worker runs; if it cannot be made, the claim leaves the heartbeat listing and the
   * reconciler takes it.
   */
  async #recover(op: ClaimedOperation, sent: boolean, err: unknown): Promise<void> {
    if (err instanceof WorkerHalted) throw err;
    if (!sent && isTransient(err)) return this.#release(op, err);
    const code =
      sqlState(err) ?? (isActionLedgerError(err) ? err.code : isConnectionError(err) ? 'connection_lost' : 'error');
    this.#o.log.error({ err, operation_id: op.operation_id, sent }, 'dispatch failed unexpectedly');
    const wrote = sent
      ? await this.#complete(
          op,
          'unknown',
          null,
          { internal_error: code },
          null,
          `provider_outcome_unknown:internal:${code}`,
          'maybe_called',
        )
      : await this.#complete(
          op,
          'needs_review',
          null,
          { stage: 'internal', code },
          `internal:${code}`,
          `predispatch_refused:internal:${code}`,
          'not_called',
        );
    this.#o.metrics.outcomes.inc({
      tool: op.tool_name,
      provider: op.provider_id,
      outcome: wrote ? (sent ? 'unknown' : 'needs_review') : 'lost',
    });
  }

  /** Gives a never-sent claim back to the queue (see {@link dispatcherQueries.operationRelease}). */
  async #release(op: ClaimedOperation, err: unknown): Promise<void> {
    const code = databaseErrorCode(err) ?? 'database_error';
    const sqlstate = sqlState(err) ?? null;
    const detail = {
      sqlstate,
      code,
      sent: false,
      provider_called: false,
      attempt: op.attempt,
      claim_token: op.claim_token,
      available_in_ms: RELEASE_BACKOFF_MS,
    };
    const n = await untilWritten(
      async () =>
        (
          await this.#o.pool.query<{ n: number }>(this.#q.operationRelease, [
            op.operation_id,
            op.claim_token,
            this.#o.workerId,
            `released:${code}`,
            RELEASE_BACKOFF_MS,
            JSON.stringify(detail),
          ])
        ).rows[0]?.n ?? 0,
      this.#halt.signal,
      this.#writeFailures,
      { operation_id: op.operation_id, write: 'release' },
    );
    this.#o.metrics.outcomes.inc({
      tool: op.tool_name,
      provider: op.provider_id,
      outcome: n === 1 ? 'released' : 'lost',
    });
    this.#o.log.warn(
      { operation_id: op.operation_id, code, sqlstate, released: n === 1 },
      'claim released after a database failure; the provider was not called',
    );
  }

  async #process(op: ClaimedOperation, progress: { sent: boolean }): Promise<void> {
    const { crash } = this.#o;
    crash.reach('after_claim');
    const route = this.#o.config.tools.get(op.tool_name);
    if (
      route === undefined ||
      route.providerId !== op.provider_id ||
      route.endpoint !== op.provider_endpoint ||
      route.idempotencyHeader !== op.idempotency_header ||
      !route.allowedTenants.has(op.tenant_id)
    ) {
      return this.#refuse(op, 'route', 'route_changed');
    }
    if (sha256Hex(canonicalJson(op.arguments_json as JsonValue)) !== op.canonical_args_sha256)
      return this.#refuse(op, 'arguments', 'args_hash_mismatch');
    const credential = route.credentialEnv === null ? null : (this.#o.credentials.get(op.tool_name) ?? null);
    if (route.credentialEnv !== null && credential === null)
      return this.#refuse(op, 'credential', 'credential_missing');

    let decision: AuthorizationDecision;
    const endAuth = this.#o.metrics.authorizationSeconds.startTimer();
    try {
      decision = await fetchAuthorization(this.#agent('authorizer'), this.#o.profile, authorizationRequest(op));
      this.#o.metrics.authorizations.inc({ result: 'allow' });
    } catch (err) {
      if (err instanceof WorkerHalted) throw err;
      const code = isActionLedgerError(err) ? err.code : 'authorization_unavailable';
      this.#o.metrics.authorizations.inc({ result: code });
      return this.#refuse(op, 'authorization', code, err);
    } finally {
      endAuth();
    }
    crash.reach('after_authorization_request');

    try {
      await submit(this.#evidence, { op, decision });
    } catch (err) {
      if (isActionLedgerError(err, 'claim_lost')) return this.#lost(op, 'evidence');
      if (isActionLedgerError(err)) return this.#refuse(op, 'evidence', err.code, err);
      throw err;
    }
    crash.reach('after_evidence_commit');
    await submit(this.#dispatches, { op, route, credential, progress });
  }

  /**
   * Records a batch of decisions in one statement, each judged by the database clock and only while its claim
   * is current. A lost connection or a serialization failure retries the whole batch a few times: the insert
   * is idempotent per claim, so a statement that landed without its reply is harmless to repeat. Any other
   * failure rejects the batch's items (a transient one then releases their claims: nothing was sent). An
   * operation whose row another session holds goes into a later batch (see {@link Dispatcher.#retryBusy}).
   */
  async #recordEvidenceBatch(items: EvidenceItem[]): Promise<void> {
    this.#o.metrics.batchOperations.observe({ stage: 'evidence' }, items.length);
    for (let attempt = 1; ; attempt++) {
      try {
        const { refused, busy } = await this.#recordEvidenceOnce(items);
        for (const item of items) {
          const err = refused.get(item);
          if (busy.has(item)) this.#retryBusy(this.#evidence, item);
          else if (err === undefined) item.resolve();
          else item.reject(err);
        }
        return;
      } catch (err) {
        if (!(isConnectionError(err) || isRetryable(err)) || attempt >= 5) throw err;
        await sleep(50 * 2 ** attempt);
      }
    }
  }

  async #recordEvidenceOnce(
    items: EvidenceItem[],
  ): Promise<{ refused: Map<EvidenceItem, ActionLedgerError>; busy: Set<EvidenceItem> }> {
    const { profile } = this.#o;
    const { rows } = await this.#o.pool.query<{
      db_now: Date;
      operation_id: string;
      locked: boolean;
      current_approval_id: string;
      current_policy_version: string;
      recorded: boolean;
    }>({
      ...this.#prepared.evidenceRecordBatch,
      values: [
        items.map((i) => i.op.operation_id),
        items.map((i) => i.op.claim_token),
        items.map((i) => i.op.attempt),
        items.map((i) => i.op.current_approval_id),
        items.map((i) => i.op.current_policy_version),
        items.map((i) => i.op.canonical_args_sha256),
        items.map((i) => i.decision.decisionSha256),
        items.map((i) => i.decision.authorizedAt.toISOString()),
        items.map((i) => i.decision.expiresAt.toISOString()),
        profile.maximumAuthorizationTtlMs,
        profile.maximumAuthorizationAgeMs,
        profile.maximumClockSkewMs,
      ],
    });
    const current = new Map(rows.map((r) => [r.operation_id, r]));
    const refused = new Map<EvidenceItem, ActionLedgerError>();
    const busy = new Set<EvidenceItem>();
    for (const item of items) {
      const { op, decision: d } = item;
      const row = current.get(op.operation_id);
      if (row === undefined) {
        refused.set(item, new ActionLedgerError('claim_lost', 'claim is no longer current'));
      } else if (!row.locked) {
        busy.add(item);
      } else if (
        row.current_approval_id !== op.current_approval_id ||
        row.current_policy_version !== op.current_policy_version
      ) {
        refused.set(
          item,
          new ActionLedgerError(
            'authorization_stale',
            'approval or policy version changed after the decision was requested',
          ),
        );
      } else {
        // The statement applied the windows; this names the rule that failed. Either refusing is enough: a
        // decision the two disagree on is refused too (evidence recorded or not, nothing is sent).
        try {
          checkWindows(d.authorizedAt, d.expiresAt, row.db_now, profile);
          if (!row.recorded)
            refused.set(
              item,
              new ActionLedgerError(
                'authorization_stale',
                'decision is outside the profile windows by the database clock',
              ),
            );
        } catch (err) {
          if (!isActionLedgerError(err)) throw err;
          refused.set(item, err);
        }
      }
    }
    return { refused, busy };
  }

  /**
   * An item whose row another session holds (a reviewer, a revocation in progress, a migration): it goes into
   * a later batch after a short wait, 20 ms doubling to 1 s, as long as its claim holds (each try reads the
   * claim again; a lost one ends as `claim_lost`) and the worker runs. Its authorization ages meanwhile, and a
   * decision that grew too old is refused as stale, never sent.
   */
  #retryBusy<T extends EvidenceItem | DispatchItem>(batcher: Batcher<T>, item: T): void {
    item.busyRetries = (item.busyRetries ?? 0) + 1;
    pause(Math.min(BUSY_RETRY_MAX_MS, 10 * 2 ** item.busyRetries), this.#halt.signal).then(
      () => batcher.add(item),
      (err: unknown) => item.reject(err),
    );
  }

  /**
   * Opens a dispatch batch: one transaction takes the row locks of its operations that no other session holds
   * (the others go into a later batch), then (a second statement) the final check over the locked ones. Once
   * the locks are held the next batch may open, and this one sends its requests in parallel and writes all
   * their outcomes before it commits: a revocation either committed before the check (nothing is sent) or
   * waits for the outcome. A lost connection, deadlock or serialization failure here retries from the start;
   * any other failure rejects the items, none of which has been sent.
   */
  async #openDispatchBatch(items: DispatchItem[]): Promise<void> {
    this.#o.metrics.batchOperations.observe({ stage: 'dispatch' }, items.length);
    const maxAgeMs = this.#o.profile.maximumAuthorizationAgeMs + this.#o.profile.maximumClockSkewMs;
    for (let attempt = 1; ; attempt++) {
      let held: HeldConnection | undefined;
      try {
        held = holdConnection(await this.#o.pool.connect());
        const { client } = held;
        await client.query('BEGIN');
        const { rows: claimed } = await client.query<{ operation_id: string; locked: boolean }>({
          ...this.#prepared.operationLockForDispatchBatch,
          values: [items.map((i) => i.op.operation_id), items.map((i) => i.op.claim_token)],
        });
        const state = new Map(claimed.map((r) => [r.operation_id, r.locked]));
        const locked = items.filter((i) => state.get(i.op.operation_id) === true);
        let checks = new Map<string, FinalCheck>();
        if (locked.length > 0) {
          const { rows } = await client.query<{
            operation_id: string;
            fresh: boolean;
            young: boolean;
            killed: boolean;
          }>({
            ...this.#prepared.operationFinalCheckBatch,
            values: [locked.map((i) => i.op.operation_id), locked.map((i) => i.op.claim_token), maxAgeMs],
          });
          checks = new Map(
            rows.map((r) => [
              r.operation_id,
              r.killed ? 'tool_disabled' : r.fresh && r.young ? 'go' : 'authorization_stale',
            ]),
          );
        }
        // Only now, with nothing left to retry: an item is settled (or queued again) exactly once.
        for (const item of items) {
          const s = state.get(item.op.operation_id);
          if (s === false) this.#retryBusy(this.#dispatches, item);
          else if (s === undefined) void this.#settleUnchecked(item, undefined);
        }
        if (locked.length === 0) {
          await client.query('ROLLBACK').catch(() => undefined);
          held.release();
          return;
        }
        void this.#sendBatch(held, locked, checks);
        return;
      } catch (err) {
        if (held !== undefined) {
          await held.client.query('ROLLBACK').catch(() => undefined);
          held.release(isConnectionError(err) ? (err as Error) : undefined);
        }
        if (!(isConnectionError(err) || isRetryable(err)) || attempt >= 5) throw err;
        await sleep(50 * 2 ** attempt);
      }
    }
  }

  /**
   * Sends the batch's checked operations, writes their outcomes in the transaction that holds their locks, and
   * commits; then settles every item. An operation that failed the check is handled after the commit, as
   * before any send: its claim was lost, or it goes to review (`authorization_stale`, `tool_disabled`).
   */
  async #sendBatch(
    held: HeldConnection,
    items: DispatchItem[],
    checks: ReadonlyMap<string, FinalCheck>,
  ): Promise<void> {
    const go = items.filter((i) => checks.get(i.op.operation_id) === 'go');
    // The savepoint the outcome write may fall back to travels while the requests are out, not after them.
    const savepoint =
      go.length === 0 ? Promise.resolve() : held.client.query('SAVEPOINT outcomes').then(() => undefined);
    savepoint.catch(() => undefined); // awaited below; a failure there is the commit's failure
    const sends = await Promise.allSettled(go.map((i) => this.#send(i)));
    const written: Written[] = [];
    go.forEach((item, n) => {
      const s = sends[n]!;
      if (s.status === 'fulfilled') written.push({ item, outcome: s.value });
    });
    // Key order: the history and gate triggers these writes fire then touch shared rows in one order everywhere.
    written.sort((a, b) => (a.item.op.operation_id < b.item.op.operation_id ? -1 : 1));
    const unwritten = new Set<DispatchItem>();
    let committed = false;
    let broken: Error | undefined;
    try {
      await savepoint;
      if (written.length > 0) await this.#writeOutcomes(held.client, written, unwritten);
      await held.client.query('COMMIT');
      committed = true;
    } catch (err) {
      if (isConnectionError(err)) broken = err as Error;
      await held.client.query('ROLLBACK').catch(() => undefined);
      this.#o.log.warn({ err, operations: written.length }, 'outcome commit failed; writing each again');
    } finally {
      held.release(broken);
    }
    await Promise.all([
      ...written.map(({ item, outcome }) => this.#settleOutcome(item, outcome, committed && !unwritten.has(item))),
      ...go.map((item, n) =>
        sends[n]!.status === 'rejected' ? item.reject((sends[n] as PromiseRejectedResult).reason) : undefined,
      ),
      ...items.flatMap((item) => {
        const check = checks.get(item.op.operation_id);
        return check === 'go' ? [] : [this.#settleUnchecked(item, check)];
      }),
    ]);
  }

  /**
   * Writes a batch's outcomes inside the transaction that holds its locks, after its savepoint `outcomes`. If
   * the one statement fails (a deadlock, a timeout, one bad row), each outcome is written on its own under the
   * same locks, from the savepoint, retrying the transient failures: one operation's trouble never releases
   * its batch-mates' locks while their requests are out. An outcome still not written is left in
   * `unwritten`, for a fenced write after the commit. A lost connection throws: the locks went with it.
   */
  async #writeOutcomes(client: PoolClient, written: Written[], unwritten: Set<DispatchItem>): Promise<void> {
    try {
      await client.query({
        ...this.#prepared.operationCompleteBatch,
        values: [
          written.map((w) => w.item.op.operation_id),
          written.map((w) => w.item.op.claim_token),
          written.map((w) => w.outcome.status),
          written.map((w) => w.outcome.receipt),
          written.map((w) => JSON.stringify(w.outcome.result)),
          written.map((w) => reviewReason(w.outcome)),
          written.map((w) => w.outcome.reason),
          this.#o.workerId,
          written.map((w) => providerContact(w.outcome)),
        ],
      });
      return;
    } catch (err) {
      if (isConnectionError(err)) throw err;
      this.#o.log.warn(
        { err, operations: written.length },
        'batch outcome write failed; writing each under the same locks',
      );
      await client.query('ROLLBACK TO SAVEPOINT outcomes');
    }
    for (const { item, outcome } of written) {
      const { op } = item;
      await client.query('SAVEPOINT outcome');
      for (let attempt = 1; ; attempt++) {
        try {
          await client.query(this.#q.operationComplete, [
            op.operation_id,
            op.claim_token,
            outcome.status,
            outcome.receipt,
            JSON.stringify(outcome.result),
            reviewReason(outcome),
            this.#o.workerId,
            outcome.reason,
            providerContact(outcome),
          ]);
          break;
        } catch (err) {
          if (isConnectionError(err)) throw err;
          await client.query('ROLLBACK TO SAVEPOINT outcome');
          if (!(isRetryable(err) || sqlState(err) === SQLSTATE.queryCanceled) || attempt >= 5) {
            this.#o.log.warn(
              { err, operation_id: op.operation_id },
              'outcome write failed under the batch locks; writing it after the commit',
            );
            unwritten.add(item);
            break;
          }
          await sleep(20 * 2 ** attempt);
        }
      }
      await client.query('RELEASE SAVEPOINT outcome');
    }
  }

  /** One provider call under the gated scope, crash points around it; returns its classified outcome. */
  async #send({ op, route, credential, progress }: DispatchItem): Promise<Outcome> {
    const endProvider = this.#o.metrics.providerSeconds.startTimer({
      provider: op.provider_id,
    });
    const sent = {
      url: op.provider_endpoint,
      headerName: op.idempotency_header,
      headerValue: op.effect_key,
    };
    let http;
    progress.sent = true;
    try {
      http = await runGated(
        () =>
          this.#o.crash.reachWhenSent('after_provider_request_sent', sent, () =>
            this.#gatedCall(this.#agent('provider'), this.#o.profile, op, credential),
          ),
        op.operation_id,
      );
    } finally {
      endProvider();
    }
    this.#o.crash.reach('after_response_before_outcome');
    return classify(http, route);
  }

  async #settleOutcome(item: DispatchItem, outcome: Outcome, committed: boolean): Promise<void> {
    const { op } = item;
    try {
      // The batch's write failed, or its COMMIT's fate is unknown: write again on another connection, fenced on
      // the claim (a no-op if it landed). If this throws, the row stays executing for the reconciler.
      if (!committed)
        await this.#complete(
          op,
          outcome.status,
          outcome.receipt,
          outcome.result,
          reviewReason(outcome),
          outcome.reason,
          providerContact(outcome),
        );
      this.#o.metrics.outcomes.inc({
        tool: op.tool_name,
        provider: op.provider_id,
        outcome: outcome.status,
      });
      this.#o.log.info(
        {
          operation_id: op.operation_id,
          tool: op.tool_name,
          tenant: op.tenant_id,
          outcome: outcome.status,
          code: outcome.code ?? undefined,
        },
        'dispatched',
      );
      this.#o.crash.reach('after_outcome_commit');
      item.resolve();
    } catch (err) {
      item.reject(err);
    }
  }

  /** An operation that failed the final check: a refusal code, or none when its row must be re-read to say why. */
  async #settleUnchecked(item: DispatchItem, check: Exclude<FinalCheck, 'go'> | undefined): Promise<void> {
    const { op } = item;
    try {
      if (check === undefined) {
        const { rows: now } = await this.#o.pool.query<{ status: string; claim_token: string }>(
          this.#q.operationSelectClaim,
          [op.operation_id],
        );
        if (now[0]?.status !== 'executing' || now[0]?.claim_token !== op.claim_token) {
          this.#lost(op, 'final_check');
          item.resolve();
          return;
        }
      }
      await this.#refuse(op, 'final_check', check ?? 'authorization_stale');
      item.resolve();
    } catch (err) {
      item.reject(err);
    }
  }

  async #refuse(op: ClaimedOperation, stage: DispatchStage, code: ErrorCode, err?: unknown): Promise<void> {
    this.#o.metrics.refusals.inc({ stage, code });
    const details = isActionLedgerError(err) && err.details !== undefined ? err.details : {};
    const wrote = await this.#complete(
      op,
      'needs_review',
      null,
      { stage, code, ...(details as Record<string, JsonValue>) },
      `${stage}:${code}`,
      `predispatch_refused:${stage}:${code}`,
      'not_called',
    );
    this.#o.log.warn(
      {
        operation_id: op.operation_id,
        tool: op.tool_name,
        tenant: op.tenant_id,
        stage,
        code,
        wrote,
      },
      'pre-dispatch refusal; provider not called',
    );
  }

  #lost(op: ClaimedOperation, stage: DispatchStage): void {
    this.#o.log.warn({ operation_id: op.operation_id, stage }, 'claim lost; nothing sent by this worker');
  }

  /**
   * A fenced outcome write; returns whether it changed the row (false: the claim was no longer current). A
   * transient failure is retried for as long as the worker runs (dispatcher/persist.ts): the claim stays listed
   * in the heartbeat meanwhile. Throws a non-transient failure, or `WorkerHalted` once the worker has stopped.
   */
  async #complete(
    op: ClaimedOperation,
    status: Outcome['status'],
    receipt: string | null,
    result: Record<string, JsonValue>,
    review: string | null,
    reason: string,
    contact: ProviderContact,
  ): Promise<boolean> {
    const n = await untilWritten(
      async () =>
        (
          await this.#o.pool.query<{ n: number }>(this.#q.operationComplete, [
            op.operation_id,
            op.claim_token,
            status,
            receipt,
            JSON.stringify(result),
            review,
            this.#o.workerId,
            reason,
            contact,
          ])
        ).rows[0]?.n ?? 0,
      this.#halt.signal,
      this.#writeFailures,
      { operation_id: op.operation_id, write: status },
    );
    return n === 1;
  }
}

interface EvidenceItem extends Settle {
  op: ClaimedOperation;
  decision: AuthorizationDecision;
  /** How many times its row was found held by another session. */
  busyRetries?: number;
}

/** The final check's verdict on one operation of a dispatch batch. */
type FinalCheck = 'go' | 'authorization_stale' | 'tool_disabled';

interface Written {
  item: DispatchItem;
  outcome: Outcome;
}

/**
 * A pooled connection held across provider calls. Between statements it is idle in its transaction, where
 * pg reports a lost connection as an 'error' event and pg-pool listens only while the client is idle in the
 * pool: the listener keeps that from crashing the process, and the release discards the connection.
 */
interface HeldConnection {
  client: PoolClient;
  release(err?: Error): void;
}

function holdConnection(client: PoolClient): HeldConnection {
  let lost: Error | undefined;
  const onError = (err: Error): void => {
    lost = err;
  };
  client.on('error', onError);
  return {
    client,
    release(err) {
      client.off('error', onError);
      client.release(err ?? lost);
    },
  };
}

interface DispatchItem extends Settle {
  op: ClaimedOperation;
  route: ToolRoute;
  credential: Secret | null;
  progress: { sent: boolean };
  /** How many times its row was found held by another session. */
  busyRetries?: number;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function reviewReason(o: Outcome): string | null {
  return o.status === 'needs_review' ? o.reason : null;
}

/** Whether the request may have left: only a connection that failed before any byte was written says no. */
function providerContact(o: Outcome): ProviderContact {
  return o.code === 'provider_unreachable' ? 'not_called' : 'maybe_called';
}
