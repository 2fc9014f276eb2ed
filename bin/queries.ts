/** SQL of the service parent (`actionledger start`), with `@schema.` placeholders bound at start. */
export const SERVICE_QUERIES = {
  /** Operations still `executing` under a claim of one of this fleet's workers (host and pids). */
  executingUnderWorkers: `
    SELECT count(*)::int AS n
    FROM @schema.operations o
    JOIN @schema.workers w ON w.worker_id = o.claimed_by
    WHERE o.status = 'executing' AND w.host = $1 AND w.pid = ANY($2::int[])`,
} as const;
