/**
 * The reconciler: resolves what the dispatcher could not know. It works on `unknown` operations whose next
 * check is due and on orphaned `executing` ones (their worker stopped heartbeating, stopped, or is unknown:
 * the claim's age alone never decides, and a live worker's claims are never touched). An orphaned claim with
 * no authorization evidence under it never sent its request: it goes back to the queue (`released:worker_lost`,
 * counted against the tool's release limit) without a readback.
 *
 * Each candidate is handled in its own transaction that locks the row (SKIP LOCKED: a dispatcher inside its
 * provider call holds that lock, so does another pass), reads the provider back by effect key, and writes
 * the result fenced on the state and claim it locked. A late-finishing worker's outcome write is fenced on
 * the same claim, so exactly one of the two changes the row.
 *
 *   applied (receipt)         -> succeeded
 *   no effect (authoritative) -> needs_review  no_effect_confirmed   (a reviewed retry may re-dispatch), once a
 *                                request sent is past the provider's time to answer (twice the provider timeout
 *                                after the operation entered unknown); before: unknown, checked again then
 *   applied with other bytes  -> needs_review  readback_mismatch
 *   no readback contract      -> needs_review  no_readback_contract
 *   anything else             -> unknown, next check after a backoff; after max_attempts -> needs_review
 *                                reconcile_attempts_exhausted, with every check in the detail
 */
import type { Agent } from 'undici';
import type { Config } from '../config/index.js';
import { bindQueries, type Pool, type PoolClient } from '../db/index.js';
import type { JsonValue } from '../core/json.js';
import type { Logger } from '../core/log.js';
import type { Secret } from '../core/secret.js';
import type { ProviderContact } from '../ledger/index.js';
import type { CrashPoints } from '../core/crash-points.js';
import { withExternalWrites } from '../transport/index.js';
import type { DispatchProfile } from '../protocol/index.js';
import type { ReconcileMetrics } from './metrics.js';
import { reconcilerQueries } from './queries.js';
import { readback, readbackUrl, type Readback } from './readback.js';
import { errorType, failSpan, linkedSpan, SpanKind, withSpan, type Span } from '../core/tracing.js';
import { backoffMs, releaseDelayMs } from '../core/retry.js';

/** Added to twice the provider timeout when waiting out a request that may still be inside the provider. */
const IN_FLIGHT_MARGIN_MS = 1_000;

export interface ReconcilerOptions {
  config: Config;
  pool: Pool;
  log: Logger;
  metrics: ReconcileMetrics;
  profile: DispatchProfile;
  agent: Agent;
  credentials: ReadonlyMap<string, Secret>;
  /** Who the history rows name, e.g. `reconciler:host:pid`. */
  actor: string;
  /** Fault-injection crash points (armed only by environment; see core/crash-points.ts). */
  crash?: CrashPoints;
  /** Review policies (reconciler/review-policy.ts), run at the end of every pass inside the pass lock. */
  reviewPolicies?: { run(signal?: AbortSignal): Promise<{ retried: number }> };
}

export interface ReconcileSummary {
  /** False when another pass held the lock: nothing was examined. */
  ran: boolean;
  examined: number;
  succeeded: number;
  still_unknown: number;
  escalated: number;
  /** Orphaned claims that never sent their request, given back to the queue. */
  released: number;
  /** Candidates that changed or were locked by someone else before this pass got to them. */
  skipped: number;
  /** Readbacks that got no answer or a failing one. */
  provider_errors: number;
  /** Operations whose reconciliation failed unexpectedly (logged with their ids; retried after a backoff). */
  errors: number;
  /** Operations in review a review policy sent back to pending (reconciler/review-policy.ts). */
  policy_retried: number;
}

type Candidate = { operation_id: string; status: 'unknown' | 'executing'; claim_token: string | null };
type Locked = Candidate & {
  claimed_by: string | null;
  attempt: number;
  effect_key: string;
  tool_name: string;
  provider_id: string;
  tenant_id: string;
  canonical_args_sha256: string;
  reconcile_attempts: number;
  dispatch_releases: number;
  trace_context: string | null;
};

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #q: Readonly<typeof reconcilerQueries>;

  constructor(options: ReconcilerOptions) {
    this.#o = options;
    this.#q = bindQueries(reconcilerQueries, options.config.schemaQuoted);
  }

  /** The advisory-lock name: one pass per schema at a time, however many fleets and CronJobs run. */
  get lockName(): string {
    return `actionledger:${this.#o.config.schema}:reconcile`;
  }

  /**
   * One pass over every due candidate (up to batch_size of each kind). Holds the pass lock on a dedicated
   * connection; returns `ran: false` at once when another pass holds it. Throws `database_unavailable`-class
   * errors from pg when the database cannot be reached. Once `signal` is aborted (a schedule stopping past its
   * deadline) the pass takes no new candidate and skips `whileLocked`; rows already being handled finish.
   */
  async pass(whileLocked?: () => Promise<void>, signal?: AbortSignal): Promise<ReconcileSummary> {
    const summary: ReconcileSummary = {
      ran: false,
      examined: 0,
      succeeded: 0,
      still_unknown: 0,
      escalated: 0,
      released: 0,
      skipped: 0,
      provider_errors: 0,
      errors: 0,
      policy_retried: 0,
    };
    const lockClient = await this.#o.pool.connect();
    let broken: Error | undefined;
    try {
      const { rows } = await lockClient.query<{ locked: boolean }>(this.#q.passLock, [this.lockName]);
      if (rows[0]?.locked !== true) return summary;
      summary.ran = true;
      try {
        const r = this.#o.config.reconciler;
        const { rows: candidates } = await this.#o.pool.query<Candidate>(this.#q.candidates, [
          r.orphanAfterMs,
          r.batchSize,
        ]);
        let next = 0;
        const lane = async (): Promise<void> => {
          while (next < candidates.length && signal?.aborted !== true) {
            const c = candidates[next++] as Candidate;
            try {
              await this.#one(c, summary);
            } catch (err) {
              // One operation's failure must not stop the pass (or every later pass): count it, push its
              // next check back, and go on. A database that is down fails every row and the pass reports it.
              summary.errors++;
              this.#o.log.error(
                { err, operation_id: c.operation_id },
                'reconciling this operation failed; it is retried after a backoff',
              );
              await this.#o.pool
                .query(this.#q.deferAfterError, [
                  c.operation_id,
                  c.status,
                  c.claim_token,
                  this.#o.config.reconciler.backoffMaxMs,
                ])
                .catch(() => undefined);
            }
          }
        };
        await Promise.all(Array.from({ length: Math.min(r.concurrency, candidates.length) }, lane));
        // Review policies: reviewed retries a person authorized ahead of time, applied after the readbacks, so an
        // operation this pass found to have no effect is retried now, not a pass later (reconciler/review-policy.ts).
        if (signal?.aborted !== true && this.#o.reviewPolicies !== undefined)
          summary.policy_retried = (await this.#o.reviewPolicies.run(signal)).retried;
        if (signal?.aborted !== true) await whileLocked?.();
      } finally {
        await lockClient.query(this.#q.passUnlock, [this.lockName]);
      }
      return summary;
    } catch (err) {
      broken = err as Error;
      throw err;
    } finally {
      lockClient.release(broken);
    }
  }

  async #one(c: Candidate, summary: ReconcileSummary): Promise<void> {
    const client = await this.#o.pool.connect();
    let broken: Error | undefined;
    let span: Span | undefined;
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<Locked>(this.#q.lockCandidate, [
        this.#o.config.reconciler.orphanAfterMs,
        c.operation_id,
        c.status,
        c.claim_token,
      ]);
      const op = rows[0];
      if (op === undefined) {
        await client.query('ROLLBACK');
        summary.skipped++;
        return;
      }
      summary.examined++;
      // Its own trace (a pass is no part of the call's), linked to the operation's: the readback request is
      // this span's child.
      span = linkedSpan('reconcile operation', SpanKind.INTERNAL, [op.trace_context], () => ({
        'actionledger.operation_id': op.operation_id,
        'actionledger.tool': op.tool_name,
        'actionledger.tenant': op.tenant_id,
        'actionledger.from_status': op.status,
      }));
      if (op.status === 'executing' && op.claim_token !== null) {
        const released = await this.#releaseUnsent(client, op);
        if (released !== null) {
          await client.query('COMMIT');
          this.#o.crash?.reach('reconcile_after_commit');
          this.#o.metrics.transitions.inc({ from: op.status, to: released });
          if (released === 'pending') summary.released++;
          else summary.escalated++;
          this.#o.log.info(
            { operation_id: op.operation_id, tool: op.tool_name, tenant: op.tenant_id, from: op.status, to: released },
            'reconciled an orphaned claim that never sent its request',
          );
          return;
        }
      }
      const result = await withSpan(span, () => this.#readback(op));
      this.#o.metrics.checks.inc({
        provider: op.provider_id,
        outcome: result.contract === undefined ? result.outcome : 'no_contract',
      });
      this.#o.crash?.reach('reconcile_after_readback');
      const to = await this.#apply(client, op, result);
      await client.query('COMMIT');
      span?.setAttributes({ 'actionledger.to_status': to, 'actionledger.readback': result.outcome });
      this.#o.crash?.reach('reconcile_after_commit');
      if (to !== op.status) this.#o.metrics.transitions.inc({ from: op.status, to });
      if (to === 'succeeded') summary.succeeded++;
      else if (to === 'needs_review') summary.escalated++;
      else summary.still_unknown++;
      if (result.outcome === 'failing' || result.outcome === 'unreachable') summary.provider_errors++;
      this.#o.log.info(
        {
          operation_id: op.operation_id,
          tool: op.tool_name,
          tenant: op.tenant_id,
          from: op.status,
          to,
          readback: result.outcome,
        },
        'reconciled',
      );
    } catch (err) {
      broken = err as Error;
      failSpan(span, errorType(err));
      await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    } finally {
      span?.end();
      client.release(broken);
    }
  }

  /**
   * An orphaned claim with no evidence under it never sent a request and never will (see `evidenceExists`): it
   * goes back to the queue after the dispatcher's release backoff, counted, or to review (`worker:worker_lost`,
   * provider not called, so a reviewed retry is safe) once the operation has been released as often as its
   * tool's limit allows; an operation that kills every worker that takes it ends there. Returns the state it
   * moved to, or null when the claim has evidence (a request may have left: the caller reads the provider back).
   */
  async #releaseUnsent(client: PoolClient, op: Locked): Promise<'pending' | 'needs_review' | null> {
    const q = this.#q;
    const { rows } = await client.query<{ found: boolean }>(q.evidenceExists, [op.operation_id, op.claim_token]);
    if (rows[0]?.found !== false) return null;
    const d = this.#o.config.dispatcher;
    const limit = this.#o.config.tools.get(op.tool_name)?.releaseLimit ?? d.releaseLimit;
    const detail = {
      orphaned_from: op.claimed_by,
      claim_token: op.claim_token,
      sent: false,
      provider_called: false,
      evidence: false,
      releases: op.dispatch_releases + 1,
      release_limit: limit,
    };
    if (op.dispatch_releases >= limit) {
      const { rows: done } = await client.query<{ n: number }>(q.resolve, [
        op.operation_id,
        op.status,
        op.claim_token,
        'needs_review',
        null,
        'worker:worker_lost',
        this.#o.actor,
        'predispatch_refused:worker:worker_lost',
        JSON.stringify({ ...detail, releases: op.dispatch_releases }),
        'not_called',
      ]);
      return done[0]?.n === 1 ? 'needs_review' : null;
    }
    const delay = releaseDelayMs(op.dispatch_releases, d);
    const { rows: done } = await client.query<{ n: number }>(q.orphanRelease, [
      op.operation_id,
      op.claim_token,
      this.#o.actor,
      'released:worker_lost',
      delay,
      JSON.stringify({ ...detail, available_in_ms: delay }),
      true,
    ]);
    return done[0]?.n === 1 ? 'pending' : null;
  }

  /**
   * Milliseconds until a request the operation sent is past the provider's time to answer (see `inFlightLeft`):
   * twice the provider timeout and a second after it entered `unknown` (its history row is stamped when the
   * dispatch batch began, just before the send: the client gave up a timeout later, and the provider gets a
   * timeout more), or from now for an orphaned claim.
   */
  async #inFlightLeft(client: PoolClient, op: Locked): Promise<number> {
    const { rows } = await client.query<{ left_ms: number | null }>(this.#q.inFlightLeft, [
      op.operation_id,
      2 * this.#o.profile.providerHttpTimeoutMs + IN_FLIGHT_MARGIN_MS,
    ]);
    return Math.max(0, Math.ceil(rows[0]?.left_ms ?? 0));
  }

  async #readback(op: Locked): Promise<Readback & { contract?: 'none' | 'route_changed' }> {
    const route = this.#o.config.tools.get(op.tool_name);
    if (route === undefined || route.providerId !== op.provider_id) {
      return { outcome: 'no_effect', receipt: null, detail: { contract: 'route_changed' }, contract: 'route_changed' };
    }
    const url = readbackUrl(route, op.effect_key);
    if (url === null) return { outcome: 'no_effect', receipt: null, detail: { contract: 'none' }, contract: 'none' };
    const credential = route.credentialEnv === null ? null : (this.#o.credentials.get(route.tool) ?? null);
    if (route.credentialEnv !== null && credential === null)
      return { outcome: 'failing', receipt: null, detail: { problem: 'credential_missing' } };
    return withExternalWrites(
      () => readback(this.#o.agent, this.#o.profile, url, op, credential, route.readback?.urlTemplate),
      op.operation_id,
    );
  }

  /** Writes the check and the transition; returns the state the operation is in afterwards. */
  // eslint-disable-next-line max-lines-per-function -- one branch per readback outcome, each its transition and check row: kept together so the mapping reads as a table
  async #apply(
    client: PoolClient,
    op: Locked,
    r: Readback & { contract?: 'none' | 'route_changed' },
  ): Promise<Locked['status'] | 'succeeded' | 'needs_review'> {
    const q = this.#q;
    const actor = this.#o.actor;
    const checkOutcome = r.contract !== undefined ? 'no_contract' : r.outcome;
    const detail: Record<string, JsonValue> = {
      ...r.detail,
      ...(op.status === 'executing' ? { orphaned_from: op.claimed_by ?? null } : {}),
    };
    await client.query(q.checkInsert, [
      op.operation_id,
      op.attempt,
      op.status,
      checkOutcome,
      actor,
      JSON.stringify(detail),
    ]);
    const resolve = async (
      to: 'succeeded' | 'needs_review',
      review: string | null,
      reason: string,
      extra: Record<string, JsonValue> = {},
      contact: ProviderContact | null = null,
    ): Promise<Locked['status'] | typeof to> => {
      const { rows } = await client.query<{ n: number }>(q.resolve, [
        op.operation_id,
        op.status,
        op.claim_token,
        to,
        r.receipt,
        review,
        actor,
        reason,
        JSON.stringify({ ...detail, ...extra }),
        contact,
      ]);
      // Under the row lock the fence cannot miss; if it ever does, nothing changed and the pass reports that.
      return rows[0]?.n === 1 ? to : op.status;
    };
    if (r.contract !== undefined)
      return resolve(
        'needs_review',
        r.contract === 'none' ? 'no_readback_contract' : 'route_changed',
        `reconcile:${r.contract === 'none' ? 'no_readback_contract' : 'route_changed'}`,
      );
    switch (r.outcome) {
      case 'applied':
        return resolve('succeeded', null, 'readback_applied', { receipt: r.receipt });
      case 'no_effect': {
        // "No effect" is taken as proof only once a request that left is past the provider's time to answer: a
        // worker killed right after writing its request leaves it in flight, and a readback a moment later finds
        // nothing yet (and a review policy would then send it again). So it is trusted only twice the provider
        // timeout (and a second) after the operation entered `unknown`, or after the dead worker's claim was
        // found; until then the operation is `unknown`, checked again then, the attempt not counted.
        const left = await this.#inFlightLeft(client, op);
        if (left > 0) {
          await client.query(q.backoff, [
            op.operation_id,
            op.status,
            op.claim_token,
            left,
            actor,
            'reconcile:no_effect_unsettled',
            JSON.stringify({ ...detail, next_check_in_ms: left }),
            0,
          ]);
          return 'unknown';
        }
        return resolve(
          'needs_review',
          'no_effect_confirmed',
          'reconcile:no_effect_confirmed',
          {},
          'no_effect_confirmed',
        );
      }
      case 'mismatch':
        return resolve('needs_review', 'readback_mismatch', 'reconcile:readback_mismatch');
      default: {
        const cfg = this.#o.config.reconciler;
        const attempts = op.reconcile_attempts + 1;
        if (attempts >= cfg.maxAttempts) {
          const { rows: checks } = await client.query<Record<string, JsonValue>>(q.checksFor, [op.operation_id]);
          return resolve('needs_review', 'reconcile_attempts_exhausted', 'reconcile:reconcile_attempts_exhausted', {
            attempts,
            checks: checks.slice(-50) as JsonValue[],
          });
        }
        const delay = backoffMs({ baseDelayMs: cfg.backoffInitialMs, maxDelayMs: cfg.backoffMaxMs }, attempts);
        await client.query(q.backoff, [
          op.operation_id,
          op.status,
          op.claim_token,
          delay,
          actor,
          `reconcile:${r.outcome}`,
          JSON.stringify({ ...detail, attempts, next_check_in_ms: delay }),
          1,
        ]);
        return 'unknown';
      }
    }
  }
}
