/**
 * What the pipeline, proposals and approvals share: the context and argument checks, budgets (rate windows
 * and cap counters), the kill switch and role revocations, redaction and the audit writer, and the reservation
 * through the ledger in the gate's own transaction.
 */
import { Counter } from 'prom-client';
import type { Config, GateTool } from '../core/config.js';
import { bindQueries, sqlState, type Pool, type Queryable } from '../core/db.js';
import { ActionLedgerError, asActionLedgerError, type ErrorCode } from '../core/errors.js';
import { createLogger, RepeatedFailureLog, type Logger } from '../core/log.js';
import type { Metrics } from '../core/metrics.js';
import { canonicalArguments, sha256Hex, type JsonObject } from '../core/json.js';
import { IDENTITY_ARGUMENT_NAMES } from '../core/types.js';
import type { Ledger, Reservation } from '../ledger/index.js';
import { gateQueries } from './queries.js';
import {
  GATE_CONTEXT_FIELDS,
  type BoundResource,
  type BusinessValidator,
  type GateContext,
  type GateRefusal,
  type ResourceResolver,
} from './types.js';

const MAX_CONTEXT_FIELD = 256;
export const REDACTED = '[redacted]';

export interface GateDeps {
  config: Config;
  pool: Pool;
  ledger: Ledger;
  validators?: Readonly<Record<string, BusinessValidator>>;
  resolvers?: Readonly<Record<string, ResourceResolver>>;
  /** The authorization service never runs business validators, so it need not register them. */
  withoutValidators?: boolean;
  /**
   * The operator CLI has no resolvers: approving a tool that binds resources is then refused with
   * `config_invalid` (before the vote is recorded) instead of refusing to start.
   */
  withoutResolvers?: boolean;
  /** Where lost audit rows and database failures are logged; default: warnings and errors to stderr. */
  log?: Logger;
  /** Counts lost audit rows (`actionledger_audit_lost_total`); without it they are counted unexposed. */
  metrics?: Pick<Metrics, 'auditLost'>;
}

export interface AuditEntry {
  action:
    | 'call'
    | 'confirm'
    | 'cancel'
    | 'execute'
    | 'approve'
    | 'reject'
    | 'expire'
    | 'invalidate'
    | 'authorize'
    | 'kill_switch'
    | 'role';
  outcome: string;
  context?: Partial<GateContext> | undefined;
  tool?: string | null;
  subjectId?: string | null;
  /** Written redacted per the tool's configuration; null when the tool is unknown (no redaction policy). */
  args?: unknown;
  detail?: Record<string, unknown>;
  durationMs?: number;
}

/** A refusal thrown inside the pipeline's transaction: it rolls back, then becomes the structured result. */
export class Refused extends Error {
  constructor(readonly refusal: GateRefusal) {
    super(refusal.message);
  }
}

export function refuse(
  error: ErrorCode,
  message: string,
  extra: Omit<GateRefusal, 'ok' | 'error' | 'message'> = {},
): Refused {
  return new Refused({ ok: false, error, message, ...extra });
}

export interface CheckedArgs {
  args: JsonObject;
  canonical: string;
  sha256: string;
}

export interface Value {
  amount: string;
  currency: string;
}

export class GateCore {
  readonly config: Config;
  readonly pool: Pool;
  readonly ledger: Ledger;
  readonly q: Readonly<typeof gateQueries>;
  readonly validators: Readonly<Record<string, BusinessValidator>>;
  readonly resolvers: Readonly<Record<string, ResourceResolver>>;
  readonly log: Logger;
  readonly #auditLost: Counter<'action'>;
  readonly #databaseFailures: RepeatedFailureLog;

  constructor(deps: GateDeps) {
    this.log = deps.log ?? createLogger({ level: 'warn', name: 'actionledger-gate', destination: process.stderr });
    this.#auditLost =
      deps.metrics?.auditLost ??
      new Counter({ name: 'actionledger_audit_lost_total', help: 'unexposed', labelNames: ['action'], registers: [] });
    this.#databaseFailures = new RepeatedFailureLog(
      this.log,
      'gate decision failed on the database; refused with its code',
    );
    this.config = deps.config;
    this.pool = deps.pool;
    this.ledger = deps.ledger;
    this.q = bindQueries(gateQueries, deps.config.schemaQuoted);
    this.validators = deps.validators ?? {};
    this.resolvers = deps.resolvers ?? {};
    const problems: string[] = [];
    for (const tool of deps.config.gate.tools.values()) {
      if (deps.withoutValidators !== true && tool.validator !== null && this.validators[tool.validator] === undefined)
        problems.push(`/gate/tools/${tool.name}/validator names ${tool.validator}, which is not registered`);
      for (const r of tool.resources)
        if (deps.withoutResolvers !== true && this.resolvers[r.type] === undefined)
          problems.push(`/gate/tools/${tool.name}/resources: no resolver registered for type ${r.type}`);
    }
    if (problems.length > 0)
      throw new ActionLedgerError('config_invalid', `gate registry is incomplete:\n  - ${problems.join('\n  - ')}`, {
        details: { problems },
      });
  }

  tool(name: string): GateTool | undefined {
    return this.config.gate.tools.get(name);
  }

  /** Permission from the role table (default deny), the tenant's route, and the revocation list. */
  async permitted(db: Queryable, tool: GateTool, tenant: string, principal: string, role: string): Promise<boolean> {
    if (!tool.roles.has(role)) return false;
    const route = this.config.tools.get(tool.name);
    if (route === undefined || !route.allowedTenants.has(tenant)) return false;
    return (await db.query(this.q.roleRevoked, [tenant, principal, role])).rowCount === 0;
  }

  async killSwitch(
    db: Queryable,
    tenant: string,
    tool: string,
  ): Promise<{ tenant_id: string; tool_name: string; reason: string } | null> {
    const { rows } = await db.query<{ tenant_id: string; tool_name: string; reason: string }>(
      this.q.killSwitchEngaged,
      [tenant, tool],
    );
    return rows[0] ?? null;
  }

  /** Takes one call from the principal's window; throws `rate_limited` with `retry_after_s` when spent. */
  async takeRate(db: Queryable, tool: GateTool, ctx: GateContext): Promise<void> {
    if (tool.rate === null) return;
    const { rows } = await db.query(this.q.rateWindowIncrement, [
      ctx.tenant_id,
      ctx.principal_id,
      tool.name,
      tool.rate.windowS,
      tool.rate.limit,
    ]);
    if (rows.length > 0) return;
    const after = await db.query<{ retry_after_s: number }>(this.q.rateWindowRetryAfter, [tool.rate.windowS]);
    const retry = after.rows[0]?.retry_after_s ?? tool.rate.windowS;
    throw refuse(
      'rate_limited',
      `rate limit of ${tool.rate.limit} calls per ${tool.rate.windowS} s reached for ${tool.name}; try again in ${retry} s`,
      {
        retry_after_s: retry,
        details: { limit: tool.rate.limit, window_s: tool.rate.windowS },
      },
    );
  }

  /** Schema (ajv strict), identity fields, then plain-JSON bounds; throws `invalid_arguments` naming the violation. */
  checkArguments(tool: GateTool, args: unknown): CheckedArgs {
    // Bounds first: the walk below (and ajv) must never meet nesting deeper than the argument bound.
    const tooDeep = depthExceeds(args, this.config.argumentBounds.maxDepth);
    if (tooDeep !== null)
      throw refuse(
        'invalid_arguments',
        `arguments nest deeper than the bound of ${this.config.argumentBounds.maxDepth} at ${tooDeep}`,
        { details: { path: tooDeep, problem: 'nest deeper than the bound' } },
      );
    const identity = findIdentityField(args, '$');
    if (identity !== null) {
      throw refuse(
        'invalid_arguments',
        `argument ${identity} names an identity; authority comes from the session, not from arguments`,
        { details: { path: identity } },
      );
    }
    if (!tool.validate(args)) {
      const errors = (tool.validate.errors ?? []).map((e) => {
        const at = e.instancePath === '' ? '(arguments)' : e.instancePath;
        const extra =
          e.keyword === 'additionalProperties'
            ? ` (${String((e.params as { additionalProperty: string }).additionalProperty)})`
            : '';
        return `${at} ${e.message ?? 'is invalid'}${extra}`;
      });
      throw refuse('invalid_arguments', `arguments do not match the ${tool.name} schema: ${errors.join('; ')}`, {
        details: { violations: errors },
      });
    }
    let canonical: string;
    try {
      canonical = canonicalArguments(args, this.config.argumentBounds);
    } catch (err) {
      if (err instanceof ActionLedgerError)
        throw refuse('invalid_arguments', err.message, err.details === undefined ? {} : { details: err.details });
      throw err;
    }
    return { args: JSON.parse(canonical) as JsonObject, canonical, sha256: sha256Hex(canonical) };
  }

  async validateBusiness(db: Queryable, tool: GateTool, ctx: GateContext, args: JsonObject): Promise<void> {
    if (tool.validator === null) return;
    const validator = this.validators[tool.validator];
    if (validator === undefined)
      throw new ActionLedgerError('config_invalid', `validator ${tool.validator} is not registered`);
    const verdict = await validator({
      context: Object.freeze({ ...ctx }),
      tool: tool.name,
      args: Object.freeze({ ...args }),
      db,
    });
    if (!verdict.ok) throw refuse(verdict.error, verdict.message);
  }

  valueOf(tool: GateTool, args: JsonObject): Value | null {
    if (tool.value === null) return null;
    const amount = args[tool.value.argument];
    if (typeof amount !== 'number' || !Number.isFinite(amount) || amount < 0) {
      throw refuse('invalid_arguments', `argument ${tool.value.argument} must be a non-negative number`, {
        details: { path: `$.${tool.value.argument}` },
      });
    }
    const currency = tool.value.currency ?? args[tool.value.currencyArgument ?? ''];
    if (typeof currency !== 'string' || currency === '')
      throw refuse('invalid_arguments', `argument ${tool.value.currencyArgument ?? 'currency'} must name a currency`);
    // Caps and the approval threshold are amounts in ONE currency: a value in another one is refused, never
    // counted in a bucket of its own (that doubled every cap for a caller alternating two currencies).
    const limits = tool.value.limitsCurrency;
    if (limits === null && tool.value.valueCapped) {
      throw refuse(
        'config_invalid',
        `${tool.name} has value caps or an approval threshold but no value.limits_currency; its calls are refused until the operator declares one`,
      );
    }
    if (limits !== null && currency !== limits) {
      throw refuse(
        'invalid_arguments',
        `${tool.name} accepts values in ${limits} only: its value caps and approval threshold are in ${limits}`,
        {
          details: { path: `$.${tool.value.currencyArgument ?? tool.value.argument}`, currency: limits },
        },
      );
    }
    return { amount: String(amount), currency };
  }

  /**
   * Reserves one unit (and the value) on every configured cap, each by one conditional upsert; throws
   * `limit_exceeded` naming the cap. Inside the caller's transaction: a later refusal rolls all of it back.
   */
  async reserveCaps(db: Queryable, tool: GateTool, ctx: GateContext, value: Value | null): Promise<string[]> {
    const caps: [string, string, { maxCount: number | null; maxValue: number | null } | null][] = [
      ['principal_day', ctx.principal_id, tool.limits.perPrincipalDay],
      ['account_day', ctx.account_id, tool.limits.perAccountDay],
      ['conversation', ctx.conversation_id, tool.limits.perConversation],
    ];
    const ids: string[] = [];
    for (const [scope, key, cap] of caps) {
      if (cap === null) continue;
      const { rows } = await db.query<{ counter_id: string }>(this.q.counterReserve, [
        ctx.tenant_id,
        tool.name,
        scope,
        key,
        // One counter per cap, whatever the call's currency: the caps' currency, or '-' for a count-only tool.
        tool.value?.limitsCurrency ?? '-',
        value?.amount ?? '0',
        cap.maxCount,
        value === null ? null : cap.maxValue === null ? null : String(cap.maxValue),
      ]);
      const row = rows[0];
      if (row === undefined) {
        throw refuse('limit_exceeded', `the ${scope.replace('_', ' per ')} cap for ${tool.name} would be exceeded`, {
          details: {
            scope,
            max_count: cap.maxCount,
            max_value: cap.maxValue,
            currency: tool.value?.limitsCurrency ?? null,
          },
        });
      }
      ids.push(row.counter_id);
    }
    return ids;
  }

  async hold(
    db: Queryable,
    counters: string[],
    value: Value | null,
    subject: { proposal?: string; approval?: string; operation?: string },
  ): Promise<void> {
    if (counters.length === 0) return;
    await db.query(this.q.holdInsert, [
      counters,
      value?.amount ?? '0',
      subject.proposal ?? null,
      subject.approval ?? null,
      subject.operation ?? null,
    ]);
  }

  async resolveResources(
    db: Queryable,
    tool: GateTool,
    tenant: string,
    args: JsonObject,
  ): Promise<BoundResource[] | null> {
    const out: BoundResource[] = [];
    for (const r of tool.resources) {
      const id = args[r.idArgument];
      const resolver = this.resolvers[r.type];
      if (resolver === undefined) throw new ActionLedgerError('config_invalid', `no resolver for ${r.type}`);
      const version =
        typeof id === 'string' || typeof id === 'number'
          ? await resolver({ tenant_id: tenant, id: String(id), db })
          : null;
      if (version === null) return null;
      out.push({ type: r.type, id: String(id), version: String(version) });
    }
    return out;
  }

  /**
   * Reserves the operation through the ledger on the gate's client (one transaction with the budgets and the
   * audit row), records the gate's view of it, and moves the subject's holds to it. A replayed step
   * (`created: false`) gives back what this call took: the effect exists once, so it is counted once.
   */
  async reserve(
    db: Queryable,
    ctx: { tenant_id: string; principal_id: string; task_id: string; workflow_step_id: string; role: string },
    tool: string,
    args: JsonObject,
    approval: { kind: 'auto' | 'proposal' | 'approval'; id: string; policyVersion: string },
    taken: { counters: string[]; value: Value | null; subject?: { proposal?: string; approval?: string } },
  ): Promise<Reservation> {
    const r = await this.ledger
      .reserve(
        {
          tenant_id: ctx.tenant_id,
          principal_id: ctx.principal_id,
          task_id: ctx.task_id,
          workflow_step_id: ctx.workflow_step_id,
          approval_id: approval.id,
          policy_version: approval.policyVersion,
        },
        tool,
        args,
        { client: db, actor: `gate:${ctx.principal_id}` },
      )
      .catch((err: unknown) => {
        throw foreignConflict(err) ?? err;
      });
    await db.query(this.q.gateOperationInsert, [
      r.operation_id,
      ctx.tenant_id,
      ctx.principal_id,
      ctx.role,
      approval.kind,
    ]);
    const subject = taken.subject;
    if (r.created) {
      if (subject !== undefined)
        await db.query(this.q.holdTransfer, [subject.proposal ?? null, subject.approval ?? null, r.operation_id]);
      else await this.hold(db, taken.counters, taken.value, { operation: r.operation_id });
    } else if (subject !== undefined) {
      await db.query(this.q.holdRelease, [
        subject.approval !== undefined ? 'approval' : 'proposal',
        subject.approval ?? subject.proposal,
        'replayed_step',
      ]);
    } else if (taken.counters.length > 0) {
      await db.query(this.q.counterGiveBack, [taken.counters, taken.value?.amount ?? '0']);
    }
    return r;
  }

  /**
   * The copy of a call's arguments the audit log keeps: every key the tool lists in `redact` replaced by
   * "[redacted]" at any depth (objects inside arrays too). Null for an unknown tool (no redaction policy).
   * Arguments that are not plain JSON jsonb can store (U+0000, lone surrogates, cycles, class instances,
   * non-finite numbers, nesting past the argument depth bound, over the size bound) are not copied at all:
   * `omitted` says why, and the row carries that marker instead.
   */
  auditArguments(tool: GateTool | undefined, args: unknown): { value: unknown; omitted?: string } {
    if (tool === undefined || args === undefined) return { value: null };
    try {
      const value = auditCopy(args, tool.redact, 1, this.config.argumentBounds.maxDepth, new Set());
      if (Buffer.byteLength(JSON.stringify(value), 'utf8') > this.config.argumentBounds.maxBytes)
        return { value: null, omitted: 'too_large' };
      return { value };
    } catch (err) {
      if (err instanceof Unstorable) return { value: null, omitted: err.message };
      return { value: null, omitted: 'not_json' };
    }
  }

  /**
   * Writes one audit row; arguments are redacted here, at write time, per the tool's configuration, and
   * every text is made storable (see {@link auditArguments}, {@link safeText}). Throws when the database
   * refuses the row: inside a transaction that fails the decision (it is not taken unaudited).
   */
  async audit(db: Queryable, e: AuditEntry): Promise<void> {
    const c = e.context ?? {};
    const toolName = typeof e.tool === 'string' ? e.tool : null;
    const copy =
      e.args === undefined
        ? { value: null }
        : this.auditArguments(toolName === null ? undefined : this.tool(toolName), e.args);
    const detail = copy.omitted === undefined ? (e.detail ?? {}) : { ...e.detail, arguments_omitted: copy.omitted };
    await db.query(this.q.auditInsert, [
      safeText(e.action),
      safeText(e.outcome),
      str(c.tenant_id),
      str(c.principal_id),
      str(c.role),
      str(c.account_id),
      str(c.conversation_id),
      str(c.turn_id),
      str(c.trace_id),
      toolName === null ? null : safeText(toolName.slice(0, MAX_CONTEXT_FIELD)),
      e.subjectId === undefined || e.subjectId === null
        ? null
        : safeText(String(e.subjectId).slice(0, MAX_CONTEXT_FIELD)),
      copy.value === null ? null : JSON.stringify(copy.value),
      JSON.stringify(safeDetail(detail, 0)),
      e.durationMs ?? null,
    ]);
  }

  /**
   * Writes the audit row of a decision in the decision's own transaction. Throws `audit_unavailable` (with
   * the SQLSTATE and the database code in details) when the row cannot be written: the transaction then
   * rolls back, so nothing the decision would have recorded is kept and nothing is allowed unaudited.
   */
  async auditDecision(db: Queryable, e: AuditEntry): Promise<void> {
    try {
      await this.audit(db, e);
    } catch (err) {
      const coded = asActionLedgerError(err);
      throw new ActionLedgerError(
        'audit_unavailable',
        'the decision could not be written to the audit log, so it was refused; nothing was done',
        {
          cause: err,
          details: { ...(coded.details ?? {}), database: coded.code },
        },
      );
    }
  }

  /**
   * The audit write after a decision that could not be audited in its own transaction (a refusal rolled it
   * back), or of a decision that records nothing else (an authorization). Never drops the row silently: when
   * the full row is refused it writes a fallback row (no arguments, `audit_fallback` in detail); when even that
   * fails (the disk is full, the database is down) it logs the decision at error level with the SQLSTATE and
   * counts it in `actionledger_audit_lost_total{action}`. Never throws. Returns whether a row was written: a
   * caller about to allow something must refuse instead when it was not.
   */
  async auditAfter(e: AuditEntry): Promise<boolean> {
    const failed = await this.tryAudit(e);
    if (failed === null) return true;
    this.#auditLost.inc({ action: e.action });
    const c = e.context ?? {};
    // The log line is then the only record of the decision: it carries what the row would have (no arguments).
    this.log.error(
      {
        action: e.action,
        outcome: e.outcome,
        tenant_id: c.tenant_id,
        principal_id: c.principal_id,
        tool: e.tool ?? null,
        subject_id: e.subjectId ?? null,
        code: asActionLedgerError(failed.fallback).code,
        sqlstate: sqlState(failed.fallback) ?? null,
        first_sqlstate: sqlState(failed.full) ?? null,
      },
      'gate audit row lost',
    );
    return false;
  }

  /**
   * Writes the row on the pool, or its fallback row (no arguments, `audit_fallback` in detail) when the full
   * row is refused. Null when one was written, else both errors; logs nothing (see {@link auditAfter}).
   */
  async tryAudit(e: AuditEntry): Promise<{ full: unknown; fallback: unknown } | null> {
    try {
      await this.audit(this.pool, e);
      return null;
    } catch (full) {
      try {
        await this.audit(this.pool, {
          action: e.action,
          outcome: e.outcome,
          context: e.context,
          tool: e.tool,
          subjectId: e.subjectId,
          detail: { audit_fallback: true, error: errorCode(full) },
        });
        return null;
      } catch (fallback) {
        return { full, fallback };
      }
    }
  }

  /**
   * The coded refusal a failed decision answers with; a database failure is logged with its SQLSTATE (once
   * per interval per code: an agent retrying against a full disk would otherwise write a line per call).
   */
  failed(err: unknown, fields: Record<string, unknown>): ActionLedgerError {
    const coded = asActionLedgerError(err);
    if (coded.code === 'internal')
      this.log.error({ ...fields, err }, 'gate decision failed unexpectedly; refused as internal');
    else if (DATABASE_CODES.has(coded.code))
      this.#databaseFailures.fail(err, {
        ...fields,
        error_code: coded.code,
        sqlstate: coded.details?.sqlstate ?? null,
      });
    return coded;
  }
}

/**
 * Operation identity is (principal, task, step), without the tenant, so a caller of another tenant can hit a
 * step some tenant already reserved. The ledger's conflict then names that operation and what changed (an
 * oracle on the other tenant's arguments): "not yours" must say nothing about it. Returns the one fixed
 * refusal for such a conflict (no id, no changed list, the same whatever was guessed), or null.
 */
export function foreignConflict(err: unknown): Refused | null {
  if (!(err instanceof ActionLedgerError) || err.code !== 'operation_conflict') return null;
  const changed = (err.details as { changed?: unknown } | undefined)?.changed;
  if (!Array.isArray(changed) || !changed.includes('tenant')) return null;
  return refuse('operation_conflict', 'this workflow step cannot be reserved by you; use another workflow_step_id');
}

/** The codes of a decision that failed on the database (see {@link GateCore.failed}). */
const DATABASE_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'database_unavailable',
  'storage_full',
  'statement_timeout',
  'database_overloaded',
  'database_conflict',
  'database_read_only',
  'database_error',
  'audit_unavailable',
]);

class Unstorable extends Error {}

function auditCopy(
  value: unknown,
  redact: ReadonlySet<string>,
  depth: number,
  maxDepth: number,
  seen: Set<object>,
): unknown {
  switch (typeof value) {
    case 'string':
      if (!value.isWellFormed() || value.includes('\u0000')) throw new Unstorable('unstorable_text');
      return value;
    case 'number':
      if (!Number.isFinite(value)) throw new Unstorable('not_json');
      return value;
    case 'boolean':
      return value;
    case 'object':
      break;
    default:
      throw new Unstorable('not_json');
  }
  if (value === null) return null;
  if (depth > maxDepth) throw new Unstorable('too_deep');
  if (seen.has(value)) throw new Unstorable('not_json');
  seen.add(value);
  let out: unknown;
  if (Array.isArray(value)) {
    const arr: unknown[] = [];
    for (let i = 0; i < value.length; i++) arr.push(auditCopy(value[i], redact, depth + 1, maxDepth, seen));
    out = arr;
  } else {
    const proto = Object.getPrototypeOf(value) as unknown;
    if (proto !== Object.prototype && proto !== null) throw new Unstorable('not_json');
    const obj: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (!k.isWellFormed() || k.includes('\u0000')) throw new Unstorable('unstorable_text');
      if (k === '__proto__') throw new Unstorable('not_json');
      obj[k] = redact.has(k) ? REDACTED : auditCopy(v, redact, depth + 1, maxDepth, seen);
    }
    out = obj;
  }
  seen.delete(value);
  return out;
}

/** Text PostgreSQL stores: U+0000 and lone surrogates written as their JSON escapes (`\u0000`), else as is. */
export function safeText(v: string): string {
  return v.isWellFormed() && !v.includes('\u0000') ? v : JSON.stringify(v).slice(1, -1);
}

/** A detail object with every string made storable (our own shallow objects; deeper levels become text). */
function safeDetail(v: unknown, depth: number): unknown {
  if (typeof v === 'string') return safeText(v);
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v);
  if (v === null || typeof v === 'boolean') return v;
  if (typeof v !== 'object') return v === undefined ? null : safeText(String(v));
  if (depth >= 8) return '[too deep]';
  if (Array.isArray(v)) return v.map((x) => safeDetail(x, depth + 1));
  return Object.fromEntries(
    Object.entries(v as Record<string, unknown>).map(([k, x]) => [safeText(k), safeDetail(x, depth + 1)]),
  );
}

function errorCode(err: unknown): string {
  if (err instanceof ActionLedgerError) return err.code;
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : 'internal';
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? safeText(v.slice(0, MAX_CONTEXT_FIELD)) : null;
}

/**
 * The path of the first container nested deeper than `maxDepth` (the root object is depth 1), or null.
 * Iterative, so a hostile 100,000-deep value cannot overflow the stack; stops at the first hit, and never
 * revisits an object (cycles are refused later, by the canonical form).
 */
function depthExceeds(root: unknown, maxDepth: number): string | null {
  const stack: [unknown, number, string][] = [[root, 1, '$']];
  const seen = new Set<object>();
  while (stack.length > 0) {
    const [value, depth, path] = stack.pop() as [unknown, number, string];
    if (value === null || typeof value !== 'object' || seen.has(value)) continue;
    if (depth > maxDepth) return path;
    seen.add(value);
    if (Array.isArray(value)) value.forEach((v, i) => stack.push([v, depth + 1, `${path}[${i}]`]));
    else
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) stack.push([v, depth + 1, `${path}.${k}`]);
  }
  return null;
}

function findIdentityField(value: unknown, path: string): string | null {
  if (value === null || typeof value !== 'object') return null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const hit = findIdentityField(value[i], `${path}[${i}]`);
      if (hit !== null) return hit;
    }
    return null;
  }
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if ((IDENTITY_ARGUMENT_NAMES as readonly string[]).includes(k)) return `${path}.${k}`;
    const hit = findIdentityField(v, `${path}.${k}`);
    if (hit !== null) return hit;
  }
  return null;
}

/** Checks the gate's trusted context; throws `invalid_context` naming every bad field. */
export function checkGateContext(ctx: unknown): GateContext {
  if (ctx === null || typeof ctx !== 'object') throw refuse('invalid_context', 'trusted context must be an object');
  const bad: string[] = [];
  const fields: string[] = [...GATE_CONTEXT_FIELDS];
  if ((ctx as Record<string, unknown>).plan_version !== undefined) fields.push('plan_version');
  for (const f of fields) {
    const v = (ctx as Record<string, unknown>)[f];
    if (
      typeof v !== 'string' ||
      v.length === 0 ||
      v.length > MAX_CONTEXT_FIELD ||
      !v.isWellFormed() ||
      /[\u0000-\u001f\u007f]/.test(v)
    )
      bad.push(f);
  }
  if (bad.length > 0)
    throw refuse('invalid_context', `trusted context fields missing or malformed: ${bad.join(', ')}`, {
      details: { fields: bad },
    });
  return ctx as GateContext;
}
