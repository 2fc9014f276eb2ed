/**
 * The review policies' SQL (reconciler/review-policy.ts): which operations in review a policy covers, and how
 * many retries policies have made of an operation. The retry itself is the review action's own fenced
 * statement (`reviewQueries.retry`); nothing here moves an operation. `@schema.` is bound once at start.
 */

/**
 * A retry made by a policy, told apart from a person's by its history row: reason `review:retry` with a
 * `review_policy` in its detail (the review action writes it only for a policy's retry).
 */
const POLICY_RETRIES = `
  SELECT count(*)::int FROM @schema.operation_history h
  WHERE h.operation_id = o.operation_id AND h.reason = 'review:retry' AND h.detail ? 'review_policy'`;

export const policyQueries = {
  /**
   * Operations in review that one policy covers and may still retry, oldest first: one of its tools ($1), a
   * review reason equal to one of $2 with the provider contact beside it in $3, or starting with one of $4 with
   * the contact beside it in $5, and fewer than $6 retries by any policy so far. $7 limit. The contact is part
   * of the match, so an operation the provider may have seen is never selected, whatever its reason says.
   */
  candidates: `
    SELECT o.operation_id, o.tool_name, o.review_reason, o.provider_contact, o.attempt, r.n AS policy_retries
    FROM @schema.operations o
    CROSS JOIN LATERAL (${POLICY_RETRIES}) r(n)
    WHERE o.attention = 'needs_review' AND o.status = 'needs_review' AND o.tool_name = ANY ($1::text[])
      AND (EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) m(reason, contact)
                   WHERE o.review_reason = m.reason AND o.provider_contact = m.contact)
        OR EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) m(prefix, contact)
                   WHERE starts_with(o.review_reason, m.prefix) AND o.provider_contact = m.contact))
      AND r.n < $6
    ORDER BY o.updated_at, o.operation_id
    LIMIT $7`,

  /** Retries by any policy of operation $1 (read under its row lock by the retry's guard). */
  retriesOf: `SELECT (${POLICY_RETRIES}) AS n FROM @schema.operations o WHERE o.operation_id = $1`,

  /** The same count for each of the operations $1 (for `review list`). */
  retriesOfEach: `
    SELECT o.operation_id, (${POLICY_RETRIES}) AS n FROM @schema.operations o WHERE o.operation_id = ANY ($1::uuid[])`,
} as const;
