/**
 * Does the dispatcher's rate hold as the queue grows? For each backlog (1,000 / 10,000 / 100,000 queued
 * operations) on a fresh database: the operations are bulk-loaded by set-based SQL as reservations would leave
 * them (valid arguments hashes, routes the registry holds; the effect keys are not HMACs, which dispatch does
 * not check), the tables analyzed as autovacuum would after such a load, then one real Dispatcher (concurrency
 * C, over mutual TLS to the sandbox servers) drains the whole backlog; the rate is outcomes per second from the
 * 10% mark to the last outcome commit (the first operations also pay for connections and TLS sessions). Then, with the dispatcher stopped and every operation finished, reservations are timed into that
 * ledger (N callers, a few seconds), to see whether a larger ledger slows them.
 */
import type pg from 'pg';
import { closedLoopOps, dropDatabase, migratedDatabase, sleep, type Run } from './cells.js';
import { openDispatchBench, type BenchPki } from './dispatch-env.js';

export interface BacklogRow {
  queued: number;
  concurrency: number;
  /** Outcomes per second from the 10% mark to the last outcome commit acknowledged. */
  drainOpsPerS: number;
  /** Dispatcher start -> last outcome. */
  drainSeconds: number;
  /** Operations by end state after the drain, e.g. "succeeded=100000". */
  states: string;
  /** Reservations into the ledger the drain left (`reserveCallers` in flight). */
  reserve: Run;
}

/** Loads `n` pending operations with outbox rows, valid for the bench registry's `issue_refund` route. */
async function loadBacklog(pool: pg.Pool, n: number, providerId: string, endpoint: string): Promise<void> {
  for (let done = 0; done < n; done += 20_000) {
    const m = Math.min(20_000, n - done);
    await pool.query(
      `WITH ins AS (
         INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name,
           tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
           current_approval_id, current_policy_version, status)
         SELECT gen_random_uuid(), 'v1.k1.' || encode(sha256(('backlog-' || i)::bytea), 'hex'), 'k1', 'backlog', 'backlog-' || i, 's1',
           'issue_refund', 'tenant-a', $3, $4, 'Idempotency-Key',
           encode(sha256(convert_to('{"amount":' || i || ',"currency":"EUR","order_id":"o-' || i || '"}', 'UTF8')), 'hex'),
           jsonb_build_object('amount', i, 'currency', 'EUR', 'order_id', 'o-' || i), 'a1', 'v1', 'pending'
         FROM generate_series($1::int, $2::int) i
         RETURNING operation_id
       )
       INSERT INTO actionledger.outbox (operation_id, attempt, available_at)
       SELECT operation_id, 1, now() - interval '1 second' FROM ins`,
      [done + 1, done + m, providerId, endpoint],
    );
  }
  await pool.query('ANALYZE actionledger.operations');
  await pool.query('ANALYZE actionledger.outbox');
}

export async function backlogCell(adminUrl: string, pki: BenchPki, queued: number, concurrency: number, reserveCallers: number, reserveMs: number): Promise<BacklogRow> {
  const name = `al_bench_backlog_${queued}`;
  const url = await migratedDatabase(adminUrl, name);
  const env = await openDispatchBench(pki, url, concurrency, concurrency + 4, false);
  try {
    const route = env.config.tools.get('issue_refund')!;
    await loadBacklog(env.producerPool, queued, route.providerId, route.endpoint);
    const finished = (): number => [...env.probe.outcomes.values()].reduce((a, b) => a + b, 0);
    const start = performance.now();
    await env.dispatcher.start();
    const deadline = start + 60_000 + queued * 20; // generous: 50 operations/s
    // The rate is taken from the 10% mark on: the first operations also pay for connections and TLS sessions.
    const mark = Math.ceil(queued / 10);
    let last = finished();
    let lastAt = start;
    let markAt: number | undefined;
    let markCount = 0;
    while (last < queued && performance.now() < deadline) {
      await sleep(20);
      const now = finished();
      if (now !== last) lastAt = performance.now();
      if (markAt === undefined && now >= mark) {
        markAt = lastAt;
        markCount = now;
      }
      last = now;
    }
    await env.dispatcher.stop(10_000);
    const drainSeconds = (lastAt - start) / 1000;
    const drainOpsPerS = (last - markCount) / ((lastAt - (markAt ?? start)) / 1000);
    const { rows } = await env.producerPool.query<{ status: string; n: number }>('SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status');
    const states = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    if (last < queued || rows.length !== 1 || rows[0]?.status !== 'succeeded') process.stderr.write(`WARNING backlog ${queued}: ${last} outcomes seen; ${states}\n`);
    const reserve = await closedLoopOps(
      reserveCallers,
      Number.MAX_SAFE_INTEGER,
      reserveMs,
      async (w, i) => {
        const t0 = performance.now();
        await env.ledger.reserve(
          { tenant_id: 'tenant-a', principal_id: `producer-${w}`, task_id: `after-backlog-${i}`, workflow_step_id: 's1', approval_id: 'a1', policy_version: 'v1' },
          'issue_refund',
          { order_id: `ord-${i}`, amount: 100, currency: 'EUR' },
        );
        return performance.now() - t0;
      },
      reserveMs,
    );
    return { queued, concurrency, drainOpsPerS, drainSeconds, states, reserve };
  } finally {
    await env.close();
    await dropDatabase(adminUrl, name);
  }
}
