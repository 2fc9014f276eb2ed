/**
 * `reserve`: turns "do this side effect" into one immutable, durable operation.
 */
import { randomUUID } from 'node:crypto';
import { checkTenantCluster } from '../config/index.js';
import type { Config, ToolRoute } from '../config/index.js';
import { bindQueries, prepared, SQLSTATE, sqlState, type Pool, type Queryable } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import { canonicalArguments, sha256Hex } from '../core/json.js';
import { identifierProblem } from '../core/identifier.js';
import { activeTraceContext, inSpan, SpanKind, tracingOn, type Attributes } from '../core/tracing.js';
import { TRUSTED_CONTEXT_FIELDS, type OperationStatus, type TrustedContext } from '../core/types.js';
import type { EffectKeyer } from './effect-key.js';
import { ledgerStatus, showOperation, type HistoryRow, type LedgerStatus } from './inspect.js';
import { OutboxNotifier, outboxChannel } from './notifier.js';
import { ledgerQueries } from './queries.js';

export interface Reservation {
  ok: true;
  operation_id: string;
  effect_key: string;
  created: boolean;
  status: OperationStatus;
  provider_receipt: string | null;
}

export interface ReserveOptions {
  /**
   * The caller's own client, inside its own transaction: the ledger and outbox rows then commit or roll back
   * with the caller's business write, and the dispatcher wake-up is delivered by PostgreSQL on that commit.
   */
  client?: Queryable;
  /** Who is reserving, for the history row. Defaults to the principal. */
  actor?: string;
  /**
   * With `client`: `false` leaves out the NOTIFY that PostgreSQL would deliver on the caller's commit, and the
   * caller calls {@link Ledger.wake} once it has committed. PostgreSQL serializes the commits of transactions
   * that NOTIFY (one lock, held through the commit's flush), so a caller committing many reservations
   * concurrently wakes the dispatchers itself. Default `true`.
   */
  notifyOnCommit?: boolean;
  /**
   * With `client` and `notifyOnCommit: false`, a connection of this library's own pool (the gate's): the
   * reservation is the named statement, planned once per connection, as on the pool. A connection that lost it
   * (26000) or cannot run its plan (0A000) fails the statement as PostgreSQL reported it, which aborts the
   * caller's transaction: the caller rolls back and tries again without `named` (the gate does, gate/gate.ts).
   */
  named?: boolean;
}

/** One reservation's inputs, checked and derived, before its statement runs. */
interface Attempt {
  ctx: TrustedContext;
  tool: string;
  route: ToolRoute;
  canonical: string;
  argsSha256: string;
  operationId: string;
  effectKey: string;
  actor: string;
  db: Queryable;
}

/** What the ledger holds for one reserved workflow step: its identity, binding and current state. */
export type ReservedStep = {
  operation_id: string;
  effect_key: string;
  status: OperationStatus;
  tool_name: string;
  tenant_id: string;
  canonical_args_sha256: string;
  provider_id: string;
  provider_endpoint: string;
  idempotency_header: string;
  current_approval_id: string;
  current_policy_version: string;
  provider_receipt: string | null;
};

/**
 * Checks the trusted context and returns it with every field NFC-normalized (core/identifier.ts), so two
 * spellings of one name are one identity. Throws `invalid_context` naming the first bad field in the message
 * and `details.field` (with its problem), and every bad field in `details.fields`.
 */
export function checkTrustedContext(ctx: unknown): TrustedContext {
  if (ctx === null || typeof ctx !== 'object')
    throw new ActionLedgerError('invalid_context', 'trusted context must be an object');
  const bad: string[] = [];
  let first: { field: string; problem: string } | undefined;
  const out: Record<string, string> = {};
  for (const field of TRUSTED_CONTEXT_FIELDS) {
    const v = (ctx as Record<string, unknown>)[field];
    const problem = v === undefined ? 'is missing' : identifierProblem(v);
    if (problem === null) out[field] = (v as string).normalize('NFC');
    else {
      bad.push(field);
      first ??= { field, problem };
    }
  }
  if (first !== undefined) {
    throw new ActionLedgerError('invalid_context', `trusted context field ${first.field} ${first.problem}`, {
      details: { field: first.field, problem: first.problem, fields: bad },
    });
  }
  return out as unknown as TrustedContext;
}

/** The reservation span's attributes: the database conventions' names for its one INSERT, and the tool. */
function reserveAttributes(tool: string): Attributes {
  return {
    'db.system.name': 'postgresql',
    'db.operation.name': 'INSERT',
    'db.collection.name': 'operations',
    'db.query.summary': 'INSERT operations',
    'actionledger.tool': tool,
  };
}

export class Ledger {
  readonly #config: Config;
  readonly #pool: Pool;
  readonly #keyer: EffectKeyer;
  readonly #notifier: OutboxNotifier;
  readonly #channel: string;
  readonly #q: Readonly<typeof ledgerQueries>;
  /** The reservation statement, named: each pool connection plans it once (inserts keyed on the step, any table size). */
  readonly #insertPrepared: { name: string; text: string };

  constructor(config: Config, pool: Pool, keyer: EffectKeyer) {
    this.#config = config;
    this.#pool = pool;
    this.#keyer = keyer;
    this.#channel = outboxChannel(config.schema);
    this.#notifier = new OutboxNotifier(pool, this.#channel);
    this.#q = bindQueries(ledgerQueries, config.schemaQuoted);
    this.#insertPrepared = prepared(this.#q.ledgerInsertReservation);
  }

  get keyer(): EffectKeyer {
    return this.#keyer;
  }

  /** Resolves the server-owned route of `tool` for `tenant`; throws `route_not_approved`. */
  resolveRoute(tool: string, tenant: string): ToolRoute {
    const route = this.#config.tools.get(tool);
    if (route === undefined || !route.allowedTenants.has(tenant)) {
      // One message for both: a caller must not learn which tools exist for other tenants.
      throw new ActionLedgerError(
        'route_not_approved',
        `tool ${JSON.stringify(tool)} has no approved route for this tenant`,
      );
    }
    return route;
  }

  /**
   * Reserves the operation for the trusted context's workflow step.
   *
   * Guarantees: one operation and one outbox row per (tenant, principal, task, step), however many callers race;
   * the same step again returns the same operation id, effect key and current status with `created: false`;
   * a pending operation reserved again with a new approval id or policy version records them. Nothing is
   * written when it throws: the operation, its history row and its outbox row are one statement.
   *
   * Throws `invalid_context`, `route_not_approved`, `invalid_arguments`, `operation_conflict` (same step,
   * different tool / arguments / provider / endpoint), and for a database failure its code with the
   * SQLSTATE in `details.sqlstate` (`database_unavailable`, `storage_full`, `statement_timeout`, ...; see
   * docs/errors.md). With the caller's `client`, a database failure is rethrown as PostgreSQL reported it: the
   * caller's transaction is failed anyway, and the caller decides (retry a serialization failure, roll back
   * to a savepoint) from the SQLSTATE.
   */
  reserve(context: TrustedContext, tool: string, args: unknown, options: ReserveOptions = {}): Promise<Reservation> {
    // Off, the reservation itself and nothing more (no span, no closure).
    if (!tracingOn()) return this.#reserve(context, tool, args, options);
    return inSpan(
      'reserve',
      SpanKind.CLIENT,
      () => reserveAttributes(tool),
      async (span) => {
        const r = await this.#reserve(context, tool, args, options);
        span?.setAttributes({ 'actionledger.operation_id': r.operation_id, 'actionledger.created': r.created });
        return r;
      },
    );
  }

  async #reserve(context: TrustedContext, tool: string, args: unknown, options: ReserveOptions): Promise<Reservation> {
    const attempt = this.#prepare(context, tool, args, options);
    try {
      return (await this.#insert(attempt, options)) ?? (await this.#replay(attempt));
    } catch (err) {
      if (err instanceof ActionLedgerError || options.client !== undefined) throw err;
      throw asActionLedgerError(err);
    }
  }

  /**
   * Reserves the operation when its workflow step was never reserved, as {@link reserve} does, in one
   * statement on the pool (its own commit; the dispatchers are woken). Returns null, writing and changing
   * nothing, when the step exists: the caller then decides how to replay it (with {@link reserve} in its own
   * transaction). Throws what {@link reserve} throws, a database failure as its coded error.
   */
  reserveIfNew(
    context: TrustedContext,
    tool: string,
    args: unknown,
    options: { actor?: string } = {},
  ): Promise<Reservation | null> {
    if (!tracingOn()) return this.#reserveIfNew(context, tool, args, options);
    return inSpan(
      'reserve',
      SpanKind.CLIENT,
      () => reserveAttributes(tool),
      async (span) => {
        const r = await this.#reserveIfNew(context, tool, args, options);
        if (r !== null)
          span?.setAttributes({ 'actionledger.operation_id': r.operation_id, 'actionledger.created': true });
        return r;
      },
    );
  }

  async #reserveIfNew(
    context: TrustedContext,
    tool: string,
    args: unknown,
    options: { actor?: string },
  ): Promise<Reservation | null> {
    const attempt = this.#prepare(context, tool, args, options);
    try {
      return await this.#insert(attempt, options);
    } catch (err) {
      throw asActionLedgerError(err);
    }
  }

  /** Everything a reservation needs before its statement: checks, route, canonical form, ids and key. */
  #prepare(context: TrustedContext, tool: string, args: unknown, options: ReserveOptions): Attempt {
    const ctx = checkTrustedContext(context);
    checkTenantCluster(this.#config, ctx.tenant_id);
    const route = this.resolveRoute(tool, ctx.tenant_id);
    const canonical = canonicalArguments(args, this.#config.argumentBounds);
    const operationId = randomUUID();
    return {
      ctx,
      tool,
      route,
      canonical,
      argsSha256: sha256Hex(canonical),
      operationId,
      effectKey: this.#keyer.derive(operationId),
      actor: options.actor ?? `principal:${ctx.principal_id}`,
      db: options.client ?? this.#pool,
    };
  }

  /**
   * The reservation on the library's pool: the named statement, or the same text unnamed when that connection's
   * session no longer holds it (reset by DISCARD ALL or DEALLOCATE, or moved by a pooler: 26000) or its cached plan
   * cannot run (a migration changed the type of a column it returns: 0A000). The failed try ran nothing, and the
   * statement is one autocommitted insert keyed on the step, so the second try is an ordinary reservation.
   */
  async #insertOnPool(params: unknown[]): Promise<{ rows: ReservedStep[] }> {
    try {
      return await this.#pool.query<ReservedStep>({ ...this.#insertPrepared, values: params });
    } catch (err) {
      const state = sqlState(err);
      if (state !== SQLSTATE.invalidStatementName && state !== SQLSTATE.featureNotSupported) throw err;
      return this.#pool.query<ReservedStep>(this.#q.ledgerInsertReservation, params);
    }
  }

  /** The reservation's one statement; null when the step was reserved before (nothing written). */
  async #insert(a: Attempt, options: ReserveOptions): Promise<Reservation | null> {
    const { ctx, route } = a;
    const params: unknown[] = [
      a.operationId,
      a.effectKey,
      this.#keyer.activeKeyId,
      ctx.principal_id,
      ctx.task_id,
      ctx.workflow_step_id,
      a.tool,
      ctx.tenant_id,
      route.providerId,
      route.endpoint,
      route.idempotencyHeader,
      a.argsSha256,
      a.canonical,
      ctx.approval_id,
      ctx.policy_version,
      a.actor,
      // The span this reservation runs in (the gate's, the API request's, or a library caller's), for the
      // dispatcher to continue; null with tracing off.
      activeTraceContext(),
    ];
    // A connection the caller passes gets the unnamed statement, unless it is one of the library's own pool
    // (`named`): the library names nothing in a session it was lent.
    const inserted =
      options.client === undefined
        ? await this.#insertOnPool(params)
        : options.notifyOnCommit === false
          ? await a.db.query<ReservedStep>(
              options.named === true
                ? { ...this.#insertPrepared, values: params }
                : { text: this.#q.ledgerInsertReservation, values: params },
            )
          : await a.db.query<ReservedStep>(this.#q.ledgerInsertReservationNotify, [...params, this.#channel]);
    const row = inserted.rows[0];
    if (row === undefined) return null;
    if (options.client === undefined) this.#notifier.poke(row.operation_id);
    return {
      ok: true,
      operation_id: row.operation_id,
      effect_key: row.effect_key,
      created: true,
      status: row.status,
      provider_receipt: null,
    };
  }

  async #replay(a: Attempt): Promise<Reservation> {
    const { db, ctx, tool, route, argsSha256, actor } = a;
    const row = await this.findStep(db, ctx);
    if (row === undefined) throw new Error('reservation conflicted but its row is not visible');
    const changed: string[] = [];
    if (row.tool_name !== tool) changed.push('tool');
    if (row.canonical_args_sha256 !== argsSha256) changed.push('arguments');
    if (row.provider_id !== route.providerId) changed.push('provider');
    if (row.provider_endpoint !== route.endpoint) changed.push('endpoint');
    if (row.idempotency_header !== route.idempotencyHeader) changed.push('idempotency_contract');
    if (changed.length > 0) {
      throw new ActionLedgerError(
        'operation_conflict',
        `this workflow step was reserved with a different ${changed.join(', ')}`,
        {
          details: { operation_id: row.operation_id, changed },
        },
      );
    }
    let status = row.status;
    if (
      status === 'pending' &&
      (row.current_approval_id !== ctx.approval_id || row.current_policy_version !== ctx.policy_version)
    ) {
      const upd = await db.query<{ status: OperationStatus }>(this.#q.ledgerUpdateAuthorizationContext, [
        row.operation_id,
        ctx.approval_id,
        ctx.policy_version,
        actor,
      ]);
      // Not updated: the operation left `pending` in between; report where it is now.
      status =
        upd.rows[0]?.status ??
        (await db.query<{ status: OperationStatus }>(this.#q.ledgerSelectStatus, [row.operation_id])).rows[0]?.status ??
        status;
    }
    return {
      ok: true,
      operation_id: row.operation_id,
      effect_key: row.effect_key,
      created: false,
      status,
      provider_receipt: row.provider_receipt,
    };
  }

  /**
   * The operation reserved for this workflow step of the tenant, whatever its tool, or undefined when the step
   * was never reserved there. Read through `db` (the caller's transaction, when it has one). Throws only what PostgreSQL
   * throws.
   */
  async findStep(
    db: Queryable,
    step: Pick<TrustedContext, 'tenant_id' | 'principal_id' | 'task_id' | 'workflow_step_id'>,
  ): Promise<ReservedStep | undefined> {
    const { rows } = await db.query<ReservedStep>(this.#q.ledgerSelectByIdentity, [
      step.tenant_id,
      step.principal_id,
      step.task_id,
      step.workflow_step_id,
    ]);
    return rows[0];
  }

  /** Operations counted by state, the outbox depth and the age of its oldest row. */
  async status(db: Queryable = this.#pool): Promise<LedgerStatus> {
    return ledgerStatus(db, this.#q);
  }

  /** One operation and its history, oldest first; throws `not_found` for an unknown or malformed id. */
  async show(
    operationId: string,
    db: Queryable = this.#pool,
  ): Promise<{ operation: Record<string, unknown>; history: HistoryRow[] }> {
    return showOperation(db, this.#q, operationId);
  }

  /**
   * Wakes the dispatchers (a NOTIFY on the pool, coalesced with others within the notifier's interval): for a
   * caller that reserved in its own transaction with `notifyOnCommit: false`, once it has committed. A wake-up
   * that never arrives only delays the claim to the dispatchers' next poll. With `operationId`, when the commit
   * made that one operation claimable: a dispatcher of this process with a slot for it then claims it and no
   * NOTIFY is sent (ledger/notifier.ts). Without (any number: several reservations in one transaction, a lifted
   * kill switch), the NOTIFY is always sent.
   */
  wake(operationId?: string): void {
    this.#notifier.poke(operationId);
  }

  stop(): void {
    this.#notifier.stop();
  }
}
