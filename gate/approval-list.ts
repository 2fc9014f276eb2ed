/**
 * The approvals of one tenant, for the people who decide them: a read without a gate, filtered by status and
 * tool, oldest first, in pages. A page ends with an opaque cursor (the creation time to the microsecond and
 * the id of its last row), so a row is listed once however many approvals arrive meanwhile. The tenant is
 * always a parameter of the query: a cursor, however it was made, never reaches another tenant's rows.
 */
import { bindQueries, type Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import type { ApprovalRow } from './approval-envelope.js';

export const APPROVAL_STATUSES = ['pending', 'approved', 'executed', 'rejected', 'expired', 'invalidated'] as const;

export interface ApprovalListFilter {
  tenant_id: string;
  /** One stored status; every status when absent. */
  status?: ApprovalRow['status'];
  /** Only these tools; null: every tool. */
  tools: readonly string[] | null;
  limit: number;
  /** The `next_cursor` of the previous page. */
  cursor?: string;
}

export interface ApprovalSummary {
  approval_id: string;
  status: ApprovalRow['status'];
  tool_name: string;
  requester_id: string;
  requester_role: string;
  /** The effect in words, as the envelope states it. */
  effect: string;
  envelope_sha256: string;
  required_approvals: number;
  approvers: string[];
  reason: string | null;
  operation_id: string | null;
  created_at: string;
  expires_at: string;
  /** Past its TTL: it can no longer be approved (the stored status changes on the next touch or expiry pass). */
  past_ttl: boolean;
}

export interface ApprovalPage {
  approvals: ApprovalSummary[];
  /** Null on the last page. */
  next_cursor: string | null;
}

const queries = {
  list: `
    SELECT approval_id, status, tool_name, requester_id, requester_role, envelope_json->>'effect' AS effect,
           envelope_sha256, required_approvals, approvers, reason, operation_id, created_at, expires_at,
           expires_at <= now() AS past_ttl,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_key
    FROM @schema.gate_approvals
    WHERE tenant_id = $1
      AND ($2::text IS NULL OR status = $2)
      AND ($3::text[] IS NULL OR tool_name = ANY ($3::text[]))
      AND ($4::timestamptz IS NULL OR (created_at, approval_id) > ($4::timestamptz, $5::uuid))
    ORDER BY created_at, approval_id
    LIMIT $6`,
} as const;

type Row = Omit<ApprovalSummary, 'created_at' | 'expires_at'> & {
  created_at: Date;
  expires_at: Date;
  created_key: string;
};

const CURSOR =
  /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z)\|([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;

function decodeCursor(cursor: string): [string, string] {
  const m = CURSOR.exec(Buffer.from(cursor, 'base64url').toString('utf8'));
  // A time PostgreSQL cannot take (year 0, February 30, 24:00) is not one this listing wrote.
  const at = m === null ? NaN : Date.parse(m[1] ?? '');
  if (m === null || Number.isNaN(at) || at < 0 || new Date(at).toISOString().slice(0, 19) !== m[1]?.slice(0, 19))
    throw new ActionLedgerError('invalid_request', 'the cursor is not one this listing gave', {
      details: { field: 'cursor' },
    });
  return [m[1] ?? '', m[2] as string];
}

/** One page of the tenant's approvals. Throws `invalid_request` for a cursor it did not make, and what PostgreSQL throws. */
export async function listApprovals(
  db: Queryable,
  schemaQuoted: string,
  filter: ApprovalListFilter,
): Promise<ApprovalPage> {
  const [after, afterId] = filter.cursor === undefined ? [null, null] : decodeCursor(filter.cursor);
  const { rows } = await db.query<Row>(bindQueries(queries, schemaQuoted).list, [
    filter.tenant_id,
    filter.status ?? null,
    filter.tools === null ? null : [...filter.tools],
    after,
    afterId,
    filter.limit + 1,
  ]);
  const page = rows.slice(0, filter.limit);
  const last = page.at(-1);
  return {
    approvals: page.map(({ created_key: _key, ...r }) => ({
      ...r,
      created_at: r.created_at.toISOString(),
      expires_at: r.expires_at.toISOString(),
    })),
    next_cursor:
      rows.length > filter.limit && last !== undefined
        ? Buffer.from(`${last.created_key}|${last.approval_id}`).toString('base64url')
        : null,
  };
}
