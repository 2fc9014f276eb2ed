/**
 * The one writer of the audit log (`gate_audit`): every gate decision, every authorization and every review
 * action. It fails closed:
 *
 *   {@link AuditWriter.decision} -> in the decision's own transaction; a row that cannot be written throws
 *                                   `audit_unavailable` and the decision rolls back (nothing is taken unaudited)
 *   {@link AuditWriter.after}    -> after a decision that recorded nothing else (a refusal, an authorization,
 *                                   a review action): the row, else a fallback row without arguments, else an
 *                                   error log line and `actionledger_audit_lost_total{action}`; returns whether a
 *                                   row was written, so a caller about to allow something refuses instead
 *   {@link AuditWriter.grouped}  -> as `after`, for rows nothing waits on before answering (the HTTP API's
 *                                   request rows): rows arriving while a write is in flight go together in the
 *                                   next one (one INSERT, one commit), so a busy API does not pay a commit per
 *                                   row; a group the database refuses is written row by row as `after` does
 *
 * Arguments are redacted at write time per the tool's configuration and every text is made storable
 * (gate/redaction.ts).
 */
import { Counter } from 'prom-client';
import type { Config } from '../config/index.js';
import { bindQueries, sqlState, type Pool, type Queryable } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import { createLogger, type Logger } from '../core/log.js';
import type { Metrics } from '../core/metrics.js';
import { MAX_CONTEXT_FIELD } from './checks.js';
import { gateQueries } from './queries.js';
import { auditArguments, safeDetail, safeText } from './redaction.js';
import type { GateContext } from './types.js';

/** The most rows one grouped write inserts. */
const MAX_GROUP = 256;
/** `auditInsert`'s columns, in its parameter order ({@link AuditWriter} builds one array per column). */
const AUDIT_COLUMNS = [
  'action',
  'outcome',
  'tenant_id',
  'principal_id',
  'role',
  'account_id',
  'conversation_id',
  'turn_id',
  'trace_id',
  'tool_name',
  'subject_id',
  'arguments',
  'detail',
  'duration_ms',
] as const;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

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
    | 'role'
    | 'principal'
    | 'token'
    | 'api'
    | 'notification'
    | `review:${string}`;
  outcome: string;
  context?: Partial<GateContext> | undefined;
  tool?: string | null;
  subjectId?: string | null;
  /**
   * The operation the row is about (a review action): the tenant and the tool the entry does not give are
   * read from it. Ignored unless it is a UUID; an operation that does not exist leaves them null.
   */
  operationId?: string | null;
  /** Written redacted per the tool's configuration; null when the tool is unknown (no redaction policy). */
  args?: unknown;
  detail?: Record<string, unknown>;
  durationMs?: number;
}

export interface AuditWriterOptions {
  config: Config;
  pool: Pool;
  /** Where lost rows are logged; default: warnings and errors to stderr. */
  log?: Logger | undefined;
  /** Counts lost rows (`actionledger_audit_lost_total`); without it they are counted unexposed. */
  metrics?: Pick<Metrics, 'auditLost'> | undefined;
}

export class AuditWriter {
  readonly #config: Config;
  readonly #pool: Pool;
  readonly #q: Readonly<typeof gateQueries>;
  readonly #log: Logger;
  readonly #lost: Counter<'action'>;
  /** Rows for {@link grouped}'s next write, and the writes in flight (null when none). */
  readonly #waiting: { entry: AuditEntry; params: unknown[]; resolve: (written: boolean) => void }[] = [];
  #writing: Promise<void> | null = null;

  constructor(options: AuditWriterOptions) {
    this.#config = options.config;
    this.#pool = options.pool;
    this.#q = bindQueries(gateQueries, options.config.schemaQuoted);
    this.#log = options.log ?? createLogger({ level: 'warn', name: 'actionledger-gate', destination: process.stderr });
    this.#lost =
      options.metrics?.auditLost ??
      new Counter({ name: 'actionledger_audit_lost_total', help: 'unexposed', labelNames: ['action'], registers: [] });
  }

  /**
   * Writes one audit row; arguments are redacted here, at write time, per the tool's configuration, and
   * every text is made storable. Throws when the database refuses the row: inside a transaction that fails
   * the decision (it is not taken unaudited).
   */
  async write(db: Queryable, e: AuditEntry): Promise<void> {
    const params = this.params(e);
    if (typeof e.operationId === 'string' && UUID.test(e.operationId))
      await db.query(this.#q.auditInsertForOperation, [...params, e.operationId]);
    else await db.query(this.#q.auditInsert, params);
  }

  /**
   * The row's 14 parameters, in the column order of `auditInsert`: redacted, storable, bounded. For a statement
   * that writes the row with other rows of the same decision (gate/reservation.ts); its failure is then
   * {@link auditUnavailable}.
   */
  params(e: AuditEntry): unknown[] {
    const c = e.context ?? {};
    const toolName = typeof e.tool === 'string' ? e.tool : null;
    const copy =
      e.args === undefined
        ? { value: null }
        : auditArguments(
            toolName === null ? undefined : this.#config.gate.tools.get(toolName),
            e.args,
            this.#config.argumentBounds,
          );
    const detail = copy.omitted === undefined ? (e.detail ?? {}) : { ...e.detail, arguments_omitted: copy.omitted };
    return [
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
      JSON.stringify(safeDetail(detail)),
      e.durationMs ?? null,
    ];
  }

  /**
   * Writes the audit row of a decision in the decision's own transaction. Throws `audit_unavailable` (with
   * the SQLSTATE and the database code in details) when the row cannot be written: the transaction then
   * rolls back, so nothing the decision would have recorded is kept and nothing is allowed unaudited.
   */
  async decision(db: Queryable, e: AuditEntry): Promise<void> {
    try {
      await this.write(db, e);
    } catch (err) {
      throw auditUnavailable(err);
    }
  }

  /**
   * The audit write after a decision that could not be audited in its own transaction (a refusal rolled it
   * back), or of a decision that records nothing else (an authorization, a review action). Never drops the
   * row silently: when the full row is refused it writes a fallback row (no arguments, `audit_fallback` in
   * detail); when even that fails (the disk is full, the database is down) it logs the decision at error
   * level with the SQLSTATE and counts it in `actionledger_audit_lost_total{action}`. Never throws. Returns
   * whether a row was written: a caller about to allow something must refuse instead when it was not.
   */
  async after(e: AuditEntry): Promise<boolean> {
    const failed = await this.tryWrite(e);
    if (failed === null) return true;
    this.#lost.inc({ action: e.action });
    const c = e.context ?? {};
    // The log line is then the only record of the decision: it carries what the row would have (no arguments).
    this.#log.error(
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
   * {@link after} with group commit: the row joins the rows waiting for the next write, and the next write
   * (at once when none is in flight) inserts them all in one statement. Resolves when the row is written
   * (true) or, the group refused, when `after` has written or lost it; never throws. For rows about an
   * operation (`operationId`) it is `after`.
   */
  grouped(e: AuditEntry): Promise<boolean> {
    if (typeof e.operationId === 'string' && UUID.test(e.operationId)) return this.after(e);
    let params: unknown[];
    try {
      params = this.params(e);
    } catch {
      return this.after(e);
    }
    return new Promise<boolean>((resolve) => {
      this.#waiting.push({ entry: e, params, resolve });
      if (this.#writing === null) this.#writing = this.#writeGroups();
    });
  }

  /** Resolves once every row given to {@link grouped} so far is written or lost (before the pool closes). */
  async settled(): Promise<void> {
    while (this.#writing !== null) await this.#writing;
  }

  /** Writes the waiting rows, a group at a time, until none is left. */
  async #writeGroups(): Promise<void> {
    try {
      while (this.#waiting.length > 0) {
        const group = this.#waiting.splice(0, MAX_GROUP);
        try {
          const columns = AUDIT_COLUMNS.map((_, i) => group.map((g) => g.params[i]));
          await this.#pool.query(this.#q.auditInsertMany, columns);
          for (const g of group) g.resolve(true);
        } catch {
          // One bad row must not cost the others: each goes its own way, with its fallback row.
          for (const g of group) g.resolve(await this.after(g.entry));
        }
      }
    } finally {
      this.#writing = null;
    }
  }

  /**
   * Writes the row on the pool, or its fallback row (no arguments, `audit_fallback` in detail) when the full
   * row is refused. Null when one was written, else both errors; logs nothing (see {@link after}).
   */
  async tryWrite(e: AuditEntry): Promise<{ full: unknown; fallback: unknown } | null> {
    try {
      await this.write(this.#pool, e);
      return null;
    } catch (full) {
      try {
        await this.write(this.#pool, {
          action: e.action,
          outcome: e.outcome,
          context: e.context,
          tool: e.tool,
          subjectId: e.subjectId,
          operationId: e.operationId,
          detail: { audit_fallback: true, error: errorCode(full) },
        });
        return null;
      } catch (fallback) {
        return { full, fallback };
      }
    }
  }
}

/**
 * `audit_unavailable` for a decision whose audit row (or the statement writing it) failed, with the SQLSTATE and
 * the database's own code in details: the decision rolls back, nothing it would have recorded is kept.
 */
export function auditUnavailable(err: unknown): ActionLedgerError {
  const coded = asActionLedgerError(err);
  return new ActionLedgerError(
    'audit_unavailable',
    'the decision could not be written to the audit log, so it was refused; nothing was done',
    { cause: err, details: { ...(coded.details ?? {}), database: coded.code } },
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
