/**
 * The dispatch batch: one round trip records the authorization evidence of its operations (a statement of its own
 * transaction, committed and flushed), then opens a transaction that takes their row locks and runs the final
 * check; the batch sends the checked ones in parallel and writes their outcomes before it commits. A revocation
 * or a new kill switch that committed before the check stops the send; engaging a kill switch waits for the row
 * locks of the operations it covers that are executing, so it is never in force while one of them is sent. A batch holds one provider's
 * operations only (each provider has its own batcher): a batch commits when its slowest request returns, so a
 * provider that hangs holds its own batch-mates' outcomes and locks until its timeout, never another provider's.
 *
 * States of one batch:
 *   queued     - its items wait while the provider's batcher has all its openings busy (two batches in
 *                their opening phase, each on its own connection, or one when most of the worker's slots are
 *                taken; dispatcher/batcher.ts)
 *   opening    - written together (`#open`): the evidence statement, BEGIN, the row locks (of the rows with
 *                evidence that no other session holds), the final check and savepoint `outcomes`; a lost
 *                connection or a conflict rolls back and retries from the start (`BATCH_RETRY_POLICY`: the
 *                evidence insert is idempotent per claim). An item whose evidence was refused is settled at once
 *                (`claim_lost`, or review at stage `evidence`); one whose row another session held goes into a
 *                later batch. The opening ends here and another batch may open
 *   sending    - [after_evidence_commit, reached once per locked item] the checked operations' requests are out
 *   writing    - their outcomes in one statement, written with the COMMIT under one Sync (db/db.ts
 *                `queryThenCommit`); if it fails, the COMMIT does not run, and each outcome is written on its own
 *                from the savepoint, under the same locks (transient failures retried); COMMIT
 *   settled    - every item resolved or rejected; an outcome the commit did not carry is written again after
 *                it, fenced on the claim (dispatcher/completer.ts)
 */
import {
  CommitFailed,
  inOneWrite,
  isConnectionError,
  isTransient,
  queryThenCommit,
  type PoolClient,
} from '../db/index.js';
import { retry, type RetryPolicy } from '../core/retry.js';
import { Batcher, batchRetryPolicy, retryBusy, submit } from './batcher.js';
import { providerContact, reviewReason, type Completer } from './completer.js';
import type { DispatchContext } from './context.js';
import { callProvider, classify, type Outcome } from './executor.js';
import { guardExternalWrite, withExternalWrites } from '../transport/index.js';
import { evidenceValues, evidenceVerdict, type EvidenceRow, type EvidenceVerdict } from './evidence.js';
import type { DispatchItem, FinalCheck } from './types.js';
import { sampledTraceIdOf } from '../core/tracing.js';

/** One outcome written on its own under the batch's locks: 40 ms, doubling to 320 ms, five tries in all. */
const OUTCOME_RETRY_POLICY: RetryPolicy = {
  tries: 5,
  baseDelayMs: 40,
  maxDelayMs: 320,
  // A lost connection is not retried here: the locks went with it (the outcome is written after the batch).
  retryOn: (err) => isTransient(err) && !isConnectionError(err),
};

export class DispatchBatch {
  readonly #ctx: DispatchContext;
  readonly #completer: Completer;
  /** One batcher per provider id, made on first use (as many as the configured routes name). */
  readonly #batchers = new Map<string, Batcher<DispatchItem>>();
  readonly #gatedCall: typeof callProvider;

  constructor(ctx: DispatchContext, completer: Completer) {
    this.#ctx = ctx;
    this.#completer = completer;
    this.#gatedCall = guardExternalWrite(callProvider, () => ctx.o.metrics.ungated.inc());
  }

  /** Dispatches one operation in the next batch; settles when its outcome is written (or handed on). */
  dispatch(item: Omit<DispatchItem, 'resolve' | 'reject'>): Promise<void> {
    return submit(this.#batcherFor(item.op.provider_id), item);
  }

  /** Opens a batch of what waits, for each provider, if the openings allowed grew (a slot of the worker freed). */
  poke(): void {
    for (const batcher of this.#batchers.values()) batcher.poke();
  }

  #batcherFor(providerId: string): Batcher<DispatchItem> {
    let batcher = this.#batchers.get(providerId);
    if (batcher === undefined) {
      batcher = new Batcher(this.#ctx.o.batchSize, (items) => this.#open(items), this.#ctx.openings);
      this.#batchers.set(providerId, batcher);
    }
    return batcher;
  }

  /**
   * Opens a dispatch batch, in one round trip on one connection: the evidence statement (its own transaction,
   * committed before what follows runs), then BEGIN, the row locks of the operations with evidence that no other
   * session holds, and (a separate statement) the final check, whose answer is kept for the locked ones. An item
   * whose evidence was refused is settled now, one whose row was held elsewhere goes into a later batch. Once the
   * opening has been answered another of the provider's batches may open (on its own connection, over other
   * operations), and this one sends its requests in parallel and writes all their outcomes before it commits. A
   * lost connection or a conflict here retries from the start; any other failure rejects the items, none of
   * which has been sent.
   */
  async #open(items: DispatchItem[]): Promise<void> {
    this.#ctx.o.metrics.batchOperations.observe({ stage: 'dispatch' }, items.length);
    const { held, evidence, state, checks } = await retry(
      () => this.#lockAndCheck(items),
      batchRetryPolicy(this.#ctx.halt()),
    );
    // Only now, with nothing left to retry: an item is settled (or queued again) exactly once. One this batch
    // locked but will not send (its evidence, recorded by an earlier try, was refused or found busy this time) is
    // settled once the batch has ended: its refusal write would wait for this batch's lock, and a retry find it
    // held by this batch.
    const locked: DispatchItem[] = [];
    const afterBatch: (() => void)[] = [];
    for (const item of items) {
      const verdict = evidence.get(item)!;
      const s = state.get(claimKey(item.op));
      const settle = (fn: () => void): void => {
        if (s === true) afterBatch.push(fn);
        else fn();
      };
      if (verdict !== 'busy' && verdict !== 'recorded')
        settle(() => void this.#completer.settleEvidence(item, verdict));
      else if (verdict === 'busy' || s === false)
        settle(() => retryBusy(this.#batcherFor(item.op.provider_id), item, this.#ctx.halt()));
      else if (s === undefined) void this.#completer.settleUnchecked(item, undefined);
      else locked.push(item);
    }
    if (locked.length === 0) {
      await held.client.query('ROLLBACK').catch(() => undefined);
      held.release();
      for (const fn of afterBatch) fn();
      return;
    }
    for (let i = 0; i < locked.length; i++) this.#ctx.o.crash.reach('after_evidence_commit');
    void this.#sendBatch(held, locked, checks, afterBatch);
  }

  /**
   * The evidence statement, BEGIN, the row locks, the final check and the savepoint, in one round trip: one try.
   * On a failure it rolls back and releases, then throws.
   */
  async #lockAndCheck(items: DispatchItem[]): Promise<{
    held: HeldConnection;
    evidence: Map<DispatchItem, EvidenceVerdict>;
    state: Map<string, boolean>;
    checks: Map<string, FinalCheck>;
  }> {
    const { o, prepared } = this.#ctx;
    const { profile } = o;
    const maxAgeMs = profile.maximumAuthorizationAgeMs + profile.maximumClockSkewMs;
    const ids = items.map((i) => i.op.operation_id);
    const tokens = items.map((i) => i.op.claim_token);
    let held: HeldConnection | undefined;
    try {
      held = holdConnection(await o.pool.connect());
      const { client } = held;
      // One round trip: the pool's connections pipeline (db/db.ts `createPool`). The server runs the five in
      // order: the evidence commits (and is flushed) before BEGIN, and the check's snapshot and clock are taken
      // once the locks are held. The check reads every item; the answer for a row this batch did not lock is
      // dropped. The savepoint is what a failed outcome write rolls back to.
      const sent = inOneWrite(client, () => {
        const recorded = client.query<EvidenceRow>({
          ...prepared.evidenceRecordBatch,
          values: evidenceValues(items, profile),
        });
        const begin = client.query('BEGIN');
        const lock = client.query<{ operation_id: string; claim_token: string; locked: boolean }>({
          ...prepared.operationLockForDispatchBatch,
          values: [ids, tokens],
        });
        const check = client.query<{
          operation_id: string;
          claim_token: string;
          fresh: boolean;
          young: boolean;
          killed: boolean;
          revoked: boolean;
        }>({ ...prepared.operationFinalCheckBatch, values: [ids, tokens, maxAgeMs] });
        const savepoint = client.query('SAVEPOINT outcomes');
        return [recorded, begin, lock, check, savepoint] as const;
      });
      const [recorded, , lock, check] = sent;
      // Every statement answered (so none is still in flight on a connection given back), then the first failure.
      const failed = (await Promise.allSettled(sent)).find((r) => r.status === 'rejected');
      if (failed !== undefined) throw failed.reason;
      // Every answer is keyed by operation and claim: two claims of one operation in a batch (the worker lost the
      // first to the reconciler and claimed it again) never read each other's rows.
      const rows = new Map((await recorded).rows.map((r) => [claimKey(r), r]));
      const evidence = new Map(items.map((i) => [i, evidenceVerdict(rows.get(claimKey(i.op)), i, profile)]));
      const state = new Map((await lock).rows.map((r) => [claimKey(r), r.locked]));
      const checks = new Map<string, FinalCheck>();
      for (const r of (await check).rows)
        if (state.get(claimKey(r)) === true)
          checks.set(
            claimKey(r),
            r.killed ? 'tool_disabled' : r.revoked ? 'role_revoked' : r.fresh && r.young ? 'go' : 'authorization_stale',
          );
      return { held, evidence, state, checks };
    } catch (err) {
      if (held !== undefined) {
        await held.client.query('ROLLBACK').catch(() => undefined);
        held.release(isConnectionError(err) ? (err as Error) : undefined);
      }
      throw err;
    }
  }

  /**
   * Sends the batch's checked operations, writes their outcomes in the transaction that holds their locks, and
   * commits; then runs `afterBatch` (what waited for the batch's end) and settles every item. An operation that
   * failed the check is handled after the commit, as before any send: its claim was lost, or it goes to review
   * (`authorization_stale`, `tool_disabled`, `role_revoked`).
   */
  async #sendBatch(
    held: HeldConnection,
    items: DispatchItem[],
    checks: ReadonlyMap<string, FinalCheck>,
    afterBatch: readonly (() => void)[],
  ): Promise<void> {
    const go = items.filter((i) => checks.get(claimKey(i.op)) === 'go');
    const sends = await Promise.allSettled(go.map((i) => this.#send(i)));
    const written: Written[] = [];
    // A request whose connection failed before any byte left (refused, TLS handshake failed) reached nobody:
    // released to the queue once this batch has committed (its row is locked by this batch until then).
    const unsent: Written[] = [];
    go.forEach((item, n) => {
      const s = sends[n]!;
      if (s.status === 'fulfilled')
        (s.value.code === 'provider_unreachable' ? unsent : written).push({ item, outcome: s.value });
    });
    // Key order: the history and gate triggers these writes fire then touch shared rows in one order everywhere.
    written.sort((a, b) => (a.item.op.operation_id < b.item.op.operation_id ? -1 : 1));
    const unwritten = new Set<DispatchItem>();
    let committed = false;
    let broken: Error | undefined;
    try {
      // The outcomes travel with the COMMIT when their statement succeeds; otherwise each was written under the
      // same locks, and the COMMIT follows.
      if (!(written.length > 0 && (await this.#writeOutcomes(held.client, written, unwritten))))
        await held.client.query('COMMIT');
      committed = true;
    } catch (err) {
      if (isConnectionError(err)) broken = err as Error;
      await held.client.query('ROLLBACK').catch(() => undefined);
      this.#ctx.o.log.warn({ err, operations: written.length }, 'outcome commit failed; writing each again');
    } finally {
      held.release(broken);
      for (const fn of afterBatch) fn();
    }
    const settled = [
      ...written.map(({ item, outcome }) =>
        this.#completer.settleOutcome(item, outcome, committed && !unwritten.has(item)),
      ),
      ...unsent.map(({ item, outcome }) => this.#completer.settleUnsent(item, outcome)),
    ];
    go.forEach((item, n) => {
      const send = sends[n]!;
      if (send.status === 'rejected') item.reject(send.reason);
    });
    await Promise.all([
      ...settled,
      ...items.flatMap((item) => {
        const check = checks.get(claimKey(item.op));
        return check === 'go' ? [] : [this.#completer.settleUnchecked(item, check)];
      }),
    ]);
  }

  /**
   * Writes a batch's outcomes inside the transaction that holds its locks, after its savepoint `outcomes`. If
   * the one statement fails (a deadlock, a timeout, one bad row), each outcome is written on its own under the
   * same locks, from the savepoint, retrying the transient failures: one operation's trouble never releases
   * its batch-mates' locks while their requests are out. An outcome still not written is left in
   * `unwritten`, for a fenced write after the commit. A lost connection throws: the locks went with it.
   * The one statement travels with the COMMIT (`queryThenCommit`): resolves true when it committed, false when
   * the caller still has to. A COMMIT that failed throws {@link CommitFailed}.
   */
  async #writeOutcomes(client: PoolClient, written: Written[], unwritten: Set<DispatchItem>): Promise<boolean> {
    const { o, q, prepared } = this.#ctx;
    try {
      await queryThenCommit(client, {
        ...prepared.operationCompleteBatch,
        values: [
          written.map((w) => w.item.op.operation_id),
          written.map((w) => w.item.op.claim_token),
          written.map((w) => w.outcome.status),
          written.map((w) => w.outcome.receipt),
          written.map((w) => JSON.stringify(w.outcome.result)),
          written.map((w) => reviewReason(w.outcome)),
          written.map((w) => w.outcome.reason),
          o.workerId,
          written.map((w) => providerContact(w.outcome)),
        ],
      });
      return true;
    } catch (err) {
      // The COMMIT failed (the transaction is over) or the connection was lost: the caller's to handle.
      if (isConnectionError(err) || err instanceof CommitFailed) throw err;
      o.log.warn({ err, operations: written.length }, 'batch outcome write failed; writing each under the same locks');
      await client.query('ROLLBACK TO SAVEPOINT outcomes');
    }
    for (const { item, outcome } of written) {
      const { op } = item;
      await client.query('SAVEPOINT outcome');
      const writeOnce = async (): Promise<void> => {
        try {
          await client.query(q.operationComplete, [
            op.operation_id,
            op.claim_token,
            outcome.status,
            outcome.receipt,
            JSON.stringify(outcome.result),
            reviewReason(outcome),
            o.workerId,
            outcome.reason,
            providerContact(outcome),
          ]);
        } catch (err) {
          if (isConnectionError(err)) throw err;
          // A failure to roll back is the batch's failure, never a reason to retry or to leave this one unwritten.
          await client.query('ROLLBACK TO SAVEPOINT outcome').catch((rollbackErr: unknown) => {
            throw new SavepointLost(rollbackErr);
          });
          throw err;
        }
      };
      try {
        await retry(writeOnce, OUTCOME_RETRY_POLICY);
      } catch (err) {
        if (err instanceof SavepointLost) throw err.cause;
        if (isConnectionError(err)) throw err;
        o.log.warn(
          { err, operation_id: op.operation_id },
          'outcome write failed under the batch locks; writing it after the commit',
        );
        unwritten.add(item);
      }
      await client.query('RELEASE SAVEPOINT outcome');
    }
    return false;
  }

  /** One provider call under the gated scope, crash points around it; returns its classified outcome. */
  async #send({ op, route, credential, progress }: DispatchItem): Promise<Outcome> {
    const { o } = this.#ctx;
    const endProvider = o.metrics.providerSeconds.startTimer({
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
      http = await withExternalWrites(
        () =>
          o.crash.reachWhenSent('after_provider_request_sent', sent, () =>
            this.#gatedCall(this.#ctx.agent('provider'), o.profile, op, credential),
          ),
        op.operation_id,
      );
    } finally {
      const seconds = endProvider();
      if (op.span !== undefined)
        o.metrics.providerExemplar({ provider: op.provider_id }, seconds, sampledTraceIdOf(op.span));
    }
    o.crash.reach('after_response_before_outcome');
    return classify(http, route);
  }
}

/** The key of an item (its operation) or of an answer row in a batch's answers: the operation and its claim. */
function claimKey(row: { operation_id: string; claim_token: string }): string {
  return `${row.operation_id}/${row.claim_token}`;
}

interface Written {
  item: DispatchItem;
  outcome: Outcome;
}

/** The savepoint could not be rolled back to: carries that failure out of the retry unchanged. */
class SavepointLost extends Error {
  constructor(cause: unknown) {
    super('ROLLBACK TO SAVEPOINT outcome failed', { cause });
    this.name = 'SavepointLost';
  }
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
