/**
 * `npm run bench:scaling`: does the claim stay flat as the queue and the ledger grow? See bench/claim-scaling.ts
 * for what is loaded, analyzed and measured (the shipped claim, the previous one it replaced, and the previous
 * one with the kill-switch table analyzed), on 1,000 / 10,000 / 100,000 queued operations and on 1,000 queued beside
 * 100,000 finished ones. Claim p50/p99 are shown beside the 1,000-queued figure of the same claim in the same
 * run; every claim's EXPLAIN (ANALYZE, BUFFERS) is printed.
 *
 * Options (environment): BENCH_CLAIMS (most claims per claim and ledger, default 300), BENCH_CLAIM_SECONDS
 * (claims stop after this long, default 10).
 */
import { runClaimScaling, scalingReport } from './claim-scaling.js';
import { machine, openBenchDatabase, printTable, saveResults } from './harness.js';

const CLAIMS = Number(process.env.BENCH_CLAIMS ?? 300);
const CLAIM_MS = Number(process.env.BENCH_CLAIM_SECONDS ?? 10) * 1000;

async function main(): Promise<void> {
  const db = await openBenchDatabase();
  process.stdout.write(
    `# PostgreSQL ${db.version}; ${machine()}; at most ${CLAIMS} claims of 32 (and ${CLAIM_MS / 1000} s) per claim and ledger, each rolled back\n`,
  );
  try {
    const { rows, notes } = await runClaimScaling(db.adminUrl, { maxClaims: CLAIMS, maxMsPerVariant: CLAIM_MS });
    const { table, entries } = scalingReport(rows, rows[0]?.ledger);
    for (const r of rows)
      process.stdout.write(`\n== ${r.ledger.name}, ${r.variant}: EXPLAIN (ANALYZE, BUFFERS)\n${r.plan}\n`);
    process.stdout.write('\n' + notes.map((n) => `- ${n}`).join('\n') + '\n\n');
    printTable(
      [
        'ledger',
        'claim',
        'claims',
        'p50 ms',
        'p99 ms',
        'p50 / 1,000 queued',
        'rows read by the pick',
        'shared buffers',
        'scans in the pick',
      ],
      table,
    );
    saveResults('scaling', entries, { machine: machine(), postgres: db.version, claims_per_row: String(CLAIMS) });
  } finally {
    await db.close();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
