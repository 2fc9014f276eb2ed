/**
 * Does the dispatcher's rate hold as the queue grows? For each backlog (1,000 / 10,000 / 100,000 queued
 * operations) on a fresh database: the operations are bulk-loaded (`loadOperations`) as reservations would
 * leave them, the tables analyzed as autovacuum would after such a load, then one real Dispatcher (concurrency
 * C, over mutual TLS to the sandbox servers) drains the whole backlog; the rate is outcomes per second from the
 * 10% mark to the last outcome commit (the first operations also pay for connections and TLS sessions). Then,
 * with the dispatcher stopped and every operation finished, reservations are timed into that ledger (N callers,
 * a few seconds), to see whether a larger ledger slows them.
 */
import { loadOperations } from './claim-scaling.js';
import { closedLoopOps, dropDatabase, migratedDatabase, producerContext, sleep, type Run } from './cells.js';
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

export async function backlogCell(
  adminUrl: string,
  pki: BenchPki,
  queued: number,
  concurrency: number,
  reserveCallers: number,
  reserveMs: number,
): Promise<BacklogRow> {
  const name = `al_bench_backlog_${queued}`;
  const url = await migratedDatabase(adminUrl, name);
  const env = await openDispatchBench(pki, url, concurrency, concurrency + 4, false);
  try {
    const route = env.config.tools.get('issue_refund')!;
    await loadOperations(env.producerPool, queued, 'pending', 'tenant-a', route);
    // What autovacuum does after a bulk load.
    await env.producerPool.query('ANALYZE actionledger.operations');
    await env.producerPool.query('ANALYZE actionledger.outbox');
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
    const { rows } = await env.producerPool.query<{ status: string; n: number }>(
      'SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status',
    );
    const states = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    if (last < queued || rows.length !== 1 || rows[0]?.status !== 'succeeded')
      process.stderr.write(`WARNING backlog ${queued}: ${last} outcomes seen; ${states}\n`);
    const reserve = await closedLoopOps(
      reserveCallers,
      Number.MAX_SAFE_INTEGER,
      reserveMs,
      async (w, i) => {
        const t0 = performance.now();
        await env.ledger.reserve(producerContext('after-backlog', w, i), 'issue_refund', {
          order_id: `ord-${i}`,
          amount: 100,
          currency: 'EUR',
        });
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
