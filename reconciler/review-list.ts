/**
 * What waits for a person: the operations in `needs_review`, filtered and oldest first, each with whether a
 * reviewed retry would be safe (the same rule `Review.retry` applies under its lock). Read-only: one SELECT.
 */
import type { Config } from '../config/index.js';
import { bindQueries, type Pool } from '../db/index.js';
import type { ProviderContact } from '../ledger/index.js';
import { reviewQueries } from './queries.js';
import { retryIsSafe } from './review.js';
import { policyStates, type PolicyState } from './review-policy.js';

export interface ReviewFilter {
  /** A review reason: matched exactly, or as a prefix when it ends with `:` (`authorization:`). */
  reason?: string;
  tool?: string;
  tenant?: string;
  /** Only operations that entered review at least this many seconds ago. */
  olderThanS?: number;
  /** At most this many, oldest first; all when absent. */
  limit?: number;
}

export interface InReview {
  operation_id: string;
  tenant_id: string;
  tool_name: string;
  review_reason: string;
  provider_contact: ProviderContact;
  /** Whether a reviewed retry is allowed by the recorded provider contact (`retryIsSafe`). */
  retry_safe: boolean;
  /** When it last entered review (ISO 8601), and the seconds since. */
  entered_review_at: string;
  age_s: number;
  /** The dispatch attempt it is in review with, and the readbacks spent on it. */
  attempt: number;
  reconcile_attempts: number;
  /**
   * Present only when a review policy covers the operation: which one, how many of its retries are spent, and
   * whether the next pass retries it or it waits for a person (reconciler/review-policy.ts).
   */
  policy?: PolicyState;
}

export interface ReviewListing {
  operations: InReview[];
  /** How many matched the filter, the limit aside. */
  total: number;
  /** More matched than the limit let through. */
  truncated: boolean;
}

/** Whether a reason filter is a prefix (it ends with `:`) rather than one exact reason. */
export function isReasonPrefix(reason: string): boolean {
  return reason.endsWith(':');
}

interface Row {
  operation_id: string;
  tenant_id: string;
  tool_name: string;
  review_reason: string;
  provider_contact: ProviderContact;
  attempt: number;
  reconcile_attempts: number;
  entered_at: Date;
  age_s: number;
  total: number;
}

/** The operations in review that match `filter`, oldest entry into review first. */
export async function listInReview(
  config: Pick<Config, 'schemaQuoted'> & Partial<Pick<Config, 'reviewPolicies'>>,
  db: Pick<Pool, 'query'>,
  filter: ReviewFilter = {},
): Promise<ReviewListing> {
  const sql = bindQueries({ list: reviewQueries.list }, config.schemaQuoted).list;
  const { rows } = await db.query<Row>(sql, [
    filter.reason ?? null,
    filter.reason !== undefined && isReasonPrefix(filter.reason),
    filter.tool ?? null,
    filter.tenant ?? null,
    filter.olderThanS ?? null,
    filter.limit ?? null,
  ]);
  const total = rows[0]?.total ?? 0;
  const policies =
    config.reviewPolicies === undefined || config.reviewPolicies.length === 0
      ? new Map<string, PolicyState>()
      : await policyStates({ schemaQuoted: config.schemaQuoted, reviewPolicies: config.reviewPolicies }, db, rows);
  return {
    operations: rows.map((r) => ({
      operation_id: r.operation_id,
      tenant_id: r.tenant_id,
      tool_name: r.tool_name,
      review_reason: r.review_reason,
      provider_contact: r.provider_contact,
      retry_safe: retryIsSafe(r.provider_contact),
      entered_review_at: r.entered_at.toISOString(),
      age_s: Math.max(0, r.age_s),
      attempt: r.attempt,
      reconcile_attempts: r.reconcile_attempts,
      ...(policies.has(r.operation_id) ? { policy: policies.get(r.operation_id) } : {}),
    })),
    total,
    truncated: total > rows.length,
  };
}
