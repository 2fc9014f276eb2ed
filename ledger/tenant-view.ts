/**
 * One tenant's operations, read-only: one operation with its history, and the list, newest first, keyset-paged
 * with an opaque cursor. Another tenant's operation is exactly as absent as an id that was never issued (and
 * a malformed id is absent too), so no answer tells a caller anything about a tenant it is not in.
 */
import { bindQueries, type Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { OPERATION_STATUSES, type OperationStatus } from '../core/types.js';
import type { HistoryRow } from './inspect.js';
import { ledgerQueries, ledgerTenantQueries } from './queries.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const UUID_ANY_CASE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The page sizes a list accepts, and the one it uses when none is asked for. */
export const OPERATION_PAGE = { min: 1, max: 200, default: 50 } as const;

/** One row of a list: where the operation is, not what it carries (its arguments and result are in `show`). */
export interface OperationSummary {
  operation_id: string;
  tenant_id: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  provider_id: string;
  status: OperationStatus;
  attempt: number;
  current_approval_id: string;
  current_policy_version: string;
  review_reason: string | null;
  created_at: Date;
  updated_at: Date;
}

/** What a list keeps (every field optional: absent is no filter). */
export interface OperationFilter {
  status?: OperationStatus | undefined;
  tool?: string | undefined;
  task_id?: string | undefined;
  principal_id?: string | undefined;
}

export interface OperationPage {
  operations: OperationSummary[];
  /** Pass it back as `cursor` for the next page; null on the last one. */
  next_cursor: string | null;
}

export interface TenantOperation {
  operation: Record<string, unknown>;
  history: HistoryRow[];
}

/** The records behind an operation's state: its authorization evidence and the reconciler's readbacks. */
export interface OperationRecords {
  evidence: {
    attempt: number;
    approval_id: string;
    policy_version: string;
    args_sha256: string;
    decision_sha256: string;
    authorized_at: Date;
    expires_at: Date;
    recorded_at: Date;
  }[];
  checks: { attempt: number; from_status: string; outcome: string; at: Date; actor: string; detail: unknown }[];
}

/** The cursor of the row a page ended at: base64url of its creation time (microseconds) and its id. */
function encodeCursor(us: string, operationId: string): string {
  return Buffer.from(`${us}:${operationId}`, 'utf8').toString('base64url');
}

/** The position a cursor names; throws `invalid_request` for anything this module did not write. */
function decodeCursor(cursor: string): { us: string; operationId: string } {
  const malformed = () =>
    new ActionLedgerError('invalid_request', 'cursor is malformed: pass back a next_cursor as it was given', {
      details: { field: 'cursor' },
    });
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(cursor)) throw malformed();
  const text = Buffer.from(cursor, 'base64url').toString('utf8');
  const m = /^(0|[1-9][0-9]{0,15}):(.+)$/.exec(text);
  if (m === null || !UUID.test(m[2] ?? '') || encodeCursor(m[1] ?? '', m[2] ?? '') !== cursor) throw malformed();
  return { us: m[1] ?? '', operationId: m[2] ?? '' };
}

/**
 * A cursor that starts a list just before `time`: the first page after it holds the operations reserved
 * before that instant (the highest possible id stands in for the row). Throws `invalid_request` for a time
 * before the epoch or an invalid date.
 */
export function operationCursorBefore(time: Date): string {
  const ms = time.getTime();
  if (!Number.isFinite(ms) || ms < 0)
    throw new ActionLedgerError('invalid_request', 'the time must be a valid time after 1970', {
      details: { field: 'before' },
    });
  return encodeCursor(String(ms * 1000), 'ffffffff-ffff-ffff-ffff-ffffffffffff');
}

type Row = OperationSummary & { cursor_us: string };

export class TenantLedgerView {
  readonly #db: Queryable;
  readonly #q: Readonly<typeof ledgerTenantQueries>;
  readonly #history: string;

  constructor(db: Queryable, schemaQuoted: string) {
    this.#db = db;
    this.#q = bindQueries(ledgerTenantQueries, schemaQuoted);
    this.#history = bindQueries(ledgerQueries, schemaQuoted).historySelectByOperation;
  }

  /** The operation of this tenant with its history, oldest first; throws `not_found` (the same for every miss). */
  async show(tenant: string, operationId: string): Promise<TenantOperation> {
    if (typeof operationId !== 'string' || !UUID_ANY_CASE.test(operationId))
      throw new ActionLedgerError('not_found', 'no such operation');
    const op = await this.#db.query<Record<string, unknown>>(this.#q.tenantSelectOperation, [operationId, tenant]);
    const operation = op.rows[0];
    if (operation === undefined) throw new ActionLedgerError('not_found', 'no such operation');
    const history = await this.#db.query<HistoryRow>(this.#history, [operationId]);
    return { operation, history: history.rows };
  }

  /** The operation's authorization evidence and reconciliation checks, oldest first (empty for another tenant's). */
  async records(tenant: string, operationId: string): Promise<OperationRecords> {
    if (typeof operationId !== 'string' || !UUID_ANY_CASE.test(operationId)) return { evidence: [], checks: [] };
    const [evidence, checks] = await Promise.all([
      this.#db.query<OperationRecords['evidence'][number]>(this.#q.tenantEvidence, [operationId, tenant]),
      this.#db.query<OperationRecords['checks'][number]>(this.#q.tenantReconcileChecks, [operationId, tenant]),
    ]);
    return { evidence: evidence.rows, checks: checks.rows };
  }

  /**
   * One page of the tenant's operations, newest first (by reservation time, then id). Throws `invalid_request`
   * for a page size outside {@link OPERATION_PAGE}, an unknown status, or a cursor this did not write. An
   * operation committed after a page passed its place is not on the later pages: start again to see it.
   */
  async list(
    tenant: string,
    filter: OperationFilter = {},
    page: { limit?: number | undefined; cursor?: string | undefined } = {},
  ): Promise<OperationPage> {
    const limit = page.limit ?? OPERATION_PAGE.default;
    if (!Number.isSafeInteger(limit) || limit < OPERATION_PAGE.min || limit > OPERATION_PAGE.max)
      throw new ActionLedgerError(
        'invalid_request',
        `limit must be a whole number from ${OPERATION_PAGE.min} to ${OPERATION_PAGE.max}`,
        { details: { field: 'limit' } },
      );
    if (filter.status !== undefined && !OPERATION_STATUSES.includes(filter.status))
      throw new ActionLedgerError('invalid_request', `status must be one of ${OPERATION_STATUSES.join(', ')}`, {
        details: { field: 'status' },
      });
    const params: unknown[] = [
      tenant,
      filter.status ?? null,
      filter.tool ?? null,
      filter.task_id ?? null,
      filter.principal_id ?? null,
      limit + 1,
    ];
    let text: string = this.#q.tenantListFirst;
    if (page.cursor !== undefined) {
      const after = decodeCursor(page.cursor);
      params.push(after.us, after.operationId);
      text = this.#q.tenantListAfter;
    }
    const { rows } = await this.#db.query<Row>(text, params);
    const more = rows.length > limit;
    const shown = more ? rows.slice(0, limit) : rows;
    const last = shown[shown.length - 1];
    return {
      operations: shown.map(({ cursor_us: _c, ...summary }) => summary),
      next_cursor: more && last !== undefined ? encodeCursor(last.cursor_us, last.operation_id) : null,
    };
  }
}
