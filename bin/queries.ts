/** SQL of the service parent (`actionledger start`), with `@schema.` placeholders bound at start. */
export const SERVICE_QUERIES = {
  /** Operations still `executing` under a claim of one of this fleet's workers (host and pids). */
  executingUnderWorkers: `
    SELECT count(*)::int AS n
    FROM @schema.workers w
    JOIN @schema.operation_claims c ON c.claimed_by = w.worker_id
    JOIN @schema.operations o ON o.operation_id = c.operation_id
    WHERE o.status = 'executing' AND w.host = $1 AND w.pid = ANY($2::int[])`,
} as const;
