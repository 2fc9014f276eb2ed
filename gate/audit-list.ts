/**
 * The audit log of one tenant, for the people who answer for it: `gate_audit` rows, newest first, filtered by
 * action, outcome, tool, principal, subject and time, in pages keyed by the row id (ids only grow), so each
 * row is listed once while new ones are appended. The tenant is always a parameter of the query: a cursor,
 * however it was made, never reaches another tenant's rows. Arguments were redacted before they were written.
 */
import { bindQueries, type Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';

export interface AuditListFilter {
  tenant_id: string;
  action?: string;
  outcome?: string;
  tool?: string;
  principal_id?: string;
  subject_id?: string;
  /** An ISO 8601 time with its offset: only rows at or after it. */
  since?: string;
  limit: number;
  /** The `next_cursor` of the previous page. */
  cursor?: string;
}

export interface AuditListRow {
  /** The row id, as text (a bigint). */
  id: string;
  at: string;
  action: string;
  outcome: string;
  tenant_id: string;
  principal_id: string | null;
  role: string | null;
  account_id: string | null;
  conversation_id: string | null;
  turn_id: string | null;
  trace_id: string | null;
  tool_name: string | null;
  subject_id: string | null;
  arguments: unknown;
  detail: Record<string, unknown>;
  duration_ms: number | null;
}

export interface AuditPage {
  rows: AuditListRow[];
  /** Null on the last page. */
  next_cursor: string | null;
}

const queries = {
  list: `
    SELECT id::text AS id, at, action, outcome, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
           trace_id, tool_name, subject_id, arguments, detail, duration_ms
    FROM @schema.gate_audit
    WHERE tenant_id = $1
      AND ($2::text IS NULL OR action = $2)
      AND ($3::text IS NULL OR outcome = $3)
      AND ($4::text IS NULL OR tool_name = $4)
      AND ($5::text IS NULL OR principal_id = $5)
      AND ($6::text IS NULL OR subject_id = $6)
      AND ($7::timestamptz IS NULL OR at >= $7::timestamptz)
      AND ($8::bigint IS NULL OR id < $8::bigint)
    ORDER BY gate_audit.id DESC
    LIMIT $9`,
} as const;

/** An ISO 8601 time with seconds and an offset, e.g. 2026-01-31T09:00:00Z or 2026-01-31T10:00:00.5+01:00. */
export const ISO_TIME_PATTERN =
  '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$';

/** Whether an ISO time matching the pattern names a real instant (no 30 February, no hour 24). */
function realTime(iso: string): boolean {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})/.exec(iso);
  if (m === null) return false;
  const [y, mo, d, h, mi, s] = m.slice(1).map(Number) as [number, number, number, number, number, number];
  const day = new Date(Date.UTC(y, mo - 1, d));
  return (
    day.getUTCFullYear() === y &&
    day.getUTCMonth() === mo - 1 &&
    day.getUTCDate() === d &&
    h < 24 &&
    mi < 60 &&
    s < 60 &&
    !Number.isNaN(Date.parse(iso))
  );
}

function decodeCursor(cursor: string): string {
  const m = /^a([1-9][0-9]{0,17})$/.exec(Buffer.from(cursor, 'base64url').toString('utf8'));
  if (m === null)
    throw new ActionLedgerError('invalid_request', 'the cursor is not one this listing gave', {
      details: { field: 'cursor' },
    });
  return m[1] as string;
}

/**
 * One page of the tenant's audit rows, newest first. Throws `invalid_request` for a cursor it did not make or a
 * `since` that is not a real time, and what PostgreSQL throws.
 */
export async function listAudit(db: Queryable, schemaQuoted: string, filter: AuditListFilter): Promise<AuditPage> {
  if (filter.since !== undefined && (!new RegExp(ISO_TIME_PATTERN).test(filter.since) || !realTime(filter.since)))
    throw new ActionLedgerError('invalid_request', 'since must be an ISO 8601 time with an offset', {
      details: { field: 'since' },
    });
  const before = filter.cursor === undefined ? null : decodeCursor(filter.cursor);
  const { rows } = await db.query<Omit<AuditListRow, 'at'> & { at: Date }>(bindQueries(queries, schemaQuoted).list, [
    filter.tenant_id,
    filter.action ?? null,
    filter.outcome ?? null,
    filter.tool ?? null,
    filter.principal_id ?? null,
    filter.subject_id ?? null,
    filter.since ?? null,
    before,
    filter.limit + 1,
  ]);
  const page = rows.slice(0, filter.limit);
  const last = page.at(-1);
  return {
    rows: page.map((r) => ({ ...r, at: r.at.toISOString() })),
    next_cursor:
      rows.length > filter.limit && last !== undefined ? Buffer.from(`a${last.id}`).toString('base64url') : null,
  };
}
