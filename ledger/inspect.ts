/** Read-only views of the ledger: counts by state, the oldest waiting operation, one operation's history. */
import { bindQueries, type Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { OPERATION_STATUSES, type OperationStatus } from '../core/types.js';
import { traceIdOf } from '../core/tracing.js';
import { ledgerQueries } from './queries.js';

export interface LedgerStatus {
  by_status: Record<OperationStatus, number>;
  outbox_depth: number;
  oldest_pending_age_s: number | null;
}

type Q = Readonly<typeof ledgerQueries>;

export async function ledgerStatus(db: Queryable, q: Q): Promise<LedgerStatus> {
  const [counts, outbox] = await Promise.all([
    db.query<{ status: OperationStatus; n: string }>(q.ledgerCountByStatus),
    db.query<{ oldest_s: number | null; depth: string }>(q.outboxOldestPending),
  ]);
  const by = Object.fromEntries(OPERATION_STATUSES.map((s) => [s, 0])) as Record<OperationStatus, number>;
  for (const r of counts.rows) by[r.status] = Number(r.n);
  const o = outbox.rows[0];
  return { by_status: by, outbox_depth: Number(o?.depth ?? 0), oldest_pending_age_s: o?.oldest_s ?? null };
}

export interface HistoryRow {
  id: string;
  from_status: OperationStatus | null;
  to_status: OperationStatus;
  at: Date;
  actor: string;
  reason: string;
  detail: unknown;
}

/** One operation and its history; throws `not_found`. */
export async function showOperation(
  db: Queryable,
  q: Q,
  operationId: string,
): Promise<{ operation: Record<string, unknown>; history: HistoryRow[] }> {
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(operationId)) {
    throw new ActionLedgerError('not_found', 'no such operation');
  }
  const op = await db.query<Record<string, unknown>>(q.ledgerSelectOperation, [operationId]);
  const row = op.rows[0];
  if (row === undefined) throw new ActionLedgerError('not_found', 'no such operation');
  // The trace it was reserved under, by its id (what a tracing backend searches for); null when none was stored.
  const { trace_context: stored, ...fields } = row;
  const operation = { ...fields, trace_id: traceIdOf(typeof stored === 'string' ? stored : null) };
  const history = await db.query<HistoryRow>(q.historySelectByOperation, [operationId]);
  return { operation, history: history.rows };
}

/**
 * The ledger's read-only views on their own: no effect-key secrets, no outbox listener, nothing written. What
 * the read-only commands (`status`, `show`) open, so a role with SELECT alone can run them.
 */
export class LedgerView {
  readonly #db: Queryable;
  readonly #q: Q;

  constructor(db: Queryable, schemaQuoted: string) {
    this.#db = db;
    this.#q = bindQueries(ledgerQueries, schemaQuoted);
  }

  status(): Promise<LedgerStatus> {
    return ledgerStatus(this.#db, this.#q);
  }

  show(operationId: string): Promise<{ operation: Record<string, unknown>; history: HistoryRow[] }> {
    return showOperation(this.#db, this.#q, operationId);
  }
}
