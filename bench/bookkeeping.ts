/**
 * `npm run bench -- --only bookkeeping`: how much of end to end's PostgreSQL CPU per operation the rows its
 * invariants write account for, measured by taking them away. In each round and at each level, four cells run in
 * a rotating order on one cluster: the peer (pg-boss with the two mTLS calls in its handler, bench/cells.ts) and
 * end to end three times, each on a fresh database migrated as shipped and then changed by {@link STRIPPED}:
 *   - `shipped`: unchanged;
 *   - `no foreign-key checks`: the foreign keys from the history, outbox, evidence and gate tables to the
 *     operations table dropped (each insert into those tables otherwise runs a key-share lookup of the operation);
 *   - `no bookkeeping rows`: that, and no history row (a trigger discards each before it is written, so its own
 *     call stays in the cost: an upper bound), and the state-machine trigger left with its two column settings
 *     (provider contact, attention) but without the legality lookup and the claim listing (`operation_claims`).
 * What is left in the last is what no design keeping the promises can drop: the operation row (inserted, updated
 * in place twice), the outbox row, the evidence row, and the dispatcher's statements (claim, evidence, row locks,
 * final check, outcome). These databases break invariants on purpose (no history, no legality check): the bench
 * only runs operations through them, and each cell still checks that every operation succeeded with one provider
 * request under its own key.
 *
 * PostgreSQL CPU per operation is the cluster's processes' CPU over the cell's measured run (bench/cpu.ts), divided
 * by its operations; ratios are to the peer's in the same round, medians over rounds.
 */
import {
  actionledgerCell,
  cellContext,
  gitHead,
  medianOf,
  pgBossMtlsCell,
  type CellLimits,
  type Run,
} from './cells.js';
import { findPostmaster, waitForQuiet } from './cpu.js';
import { createBenchPki } from './dispatch-env.js';
import { machine, openBenchDatabase, printTable, saveResults, stopOnSignal, type ResultEntry } from './harness.js';
import type { PgWork } from './pg-work.js';

/** The foreign keys to `operations` whose checks the second cell drops. */
const DROP_FOREIGN_KEYS = `
  DO $$
  DECLARE r record;
  BEGIN
    FOR r IN SELECT con.conname, rel.relname
             FROM pg_constraint con JOIN pg_class rel ON rel.oid = con.conrelid
             WHERE con.contype = 'f' AND con.confrelid = 'actionledger.operations'::regclass
               AND rel.relname IN ('operation_history', 'outbox', 'authorization_evidence', 'gate_operations')
    LOOP
      EXECUTE format('ALTER TABLE actionledger.%I DROP CONSTRAINT %I', r.relname, r.conname);
    END LOOP;
  END $$;`;

/** The schema changes of each end-to-end cell (undefined: as migrated). */
export const STRIPPED: Record<string, string | undefined> = {
  shipped: undefined,
  'no foreign-key checks': DROP_FOREIGN_KEYS,
  'no bookkeeping rows': `${DROP_FOREIGN_KEYS}
    SET search_path = actionledger;
    CREATE FUNCTION bench_discard_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
    CREATE TRIGGER bench_discard_history BEFORE INSERT ON operation_history
      FOR EACH ROW EXECUTE FUNCTION bench_discard_row();
    CREATE OR REPLACE FUNCTION operations_transition_check() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    BEGIN
      IF NEW.status IN ('executing', 'succeeded', 'unknown', 'compensating', 'compensated') THEN
        NEW.provider_contact := 'maybe_called';
      ELSIF NEW.status = 'pending' THEN
        NEW.provider_contact := 'not_called';
      END IF;
      NEW.attention := CASE WHEN NEW.status IN ('unknown', 'needs_review', 'compensating', 'failed')
                            THEN NEW.status END;
      RETURN NEW;
    END $$;`,
};

export interface BookkeepingOptions {
  levels: number[];
  rounds: number;
  limits: CellLimits;
  quietMaxSeconds: number;
  save: boolean;
}

interface Cell {
  run: Run;
  pgCpuMs: number;
  work: PgWork;
}

const log = (line: string): void => void process.stdout.write(line + '\n');
const PEER = 'peer: pg-boss, handler makes the two mTLS calls';
const pgCpuMs = (r: Run): number => (r.cpu.postgresCores * 1000) / r.opsPerS;

/** Runs the part; prints the table; replaces `runs.bookkeeping` in bench/results.json when `save`. */
export async function runBookkeepingBench(o: BookkeepingOptions): Promise<void> {
  const db = await openBenchDatabase();
  stopOnSignal(db);
  try {
    cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
    const pki = await createBenchPki();
    const systems = [PEER, ...Object.keys(STRIPPED)];
    log(`\n# bookkeeping: PostgreSQL ${db.version}; ${machine()}; ${o.rounds} round(s) at N = ${o.levels.join(', ')}`);
    const results = new Map<string, Cell[]>(); // key `${n} ${system}`
    for (let round = 0; round < o.rounds; round++)
      for (const n of o.levels) {
        const order = systems.map((_, i) => systems[(i + round) % systems.length] as string);
        const line: string[] = [];
        for (const system of order) {
          await waitForQuiet(cellContext.postmaster, o.quietMaxSeconds * 1000);
          const cell: Cell =
            system === PEER
              ? await pgBossMtlsCell(db.adminUrl, pki, n, o.limits).then((r) => ({
                  run: r,
                  pgCpuMs: pgCpuMs(r),
                  work: r.pgWork,
                }))
              : await actionledgerCell(db.adminUrl, pki, n, o.limits, STRIPPED[system]).then((r) => {
                  if (r.notSucceeded > 0) throw new Error(`bookkeeping ${system} N=${n}: ${r.check}`);
                  return { run: r, pgCpuMs: pgCpuMs(r), work: r.pgWork };
                });
          const key = `${n} ${system}`;
          results.set(key, [...(results.get(key) ?? []), cell]);
          line.push(`${system} ${cell.run.opsPerS.toFixed(0)}/s PG ${cell.pgCpuMs.toFixed(2)} ms/op`);
        }
        log(`  round ${round + 1} N=${n}: ${line.join('; ')}`);
      }

    const header = [
      'N',
      'system',
      'ops/s',
      'PG CPU ms/op',
      'WAL bytes/op',
      'heap rows ins / upd / del per op',
      'PG CPU / peer',
      'ops/s / peer',
      'PG CPU / shipped',
    ];
    const rows: (string | number)[][] = [];
    const entries: ResultEntry[] = [];
    for (const n of o.levels) {
      const peer = results.get(`${n} ${PEER}`) ?? [];
      const shipped = results.get(`${n} shipped`) ?? [];
      for (const system of systems) {
        const cells = results.get(`${n} ${system}`) ?? [];
        const byRound = (f: (c: Cell, i: number) => number): number => medianOf(cells.map(f));
        const cpu = byRound((c) => c.pgCpuMs);
        const toPeer = byRound((c, i) => c.pgCpuMs / (peer[i]?.pgCpuMs ?? NaN));
        const rateToPeer = byRound((c, i) => c.run.opsPerS / (peer[i]?.run.opsPerS ?? NaN));
        const toShipped = system === PEER ? NaN : byRound((c, i) => c.pgCpuMs / (shipped[i]?.pgCpuMs ?? NaN));
        const w = (f: (x: PgWork) => number): number => byRound((c) => f(c.work));
        const f2 = (x: number): string => x.toFixed(2);
        rows.push([
          String(n),
          system,
          byRound((c) => c.run.opsPerS),
          cpu,
          w((x) => x.walBytes),
          `${f2(w((x) => x.inserted))} / ${f2(w((x) => x.updated))} / ${f2(w((x) => x.deleted))}`,
          toPeer,
          rateToPeer,
          toShipped,
        ]);
        entries.push({
          name: system,
          concurrency: n,
          ops_per_s: byRound((c) => c.run.opsPerS),
          p50_ms: byRound((c) => c.run.p50Ms),
          p99_ms: byRound((c) => c.run.p99Ms),
          postgres_cpu_ms_per_op: cpu,
          postgres_cpu_ratio_to_peer: toPeer,
          ops_per_s_ratio_to_peer: rateToPeer,
          postgres_cpu_ratio_to_shipped: toShipped,
          pg_wal_bytes_per_op: w((x) => x.walBytes),
          pg_rows_written_per_op: w((x) => x.rowsWritten),
        });
      }
    }
    log(
      `\nEnd to end with its bookkeeping taken away, against the peer (PostgreSQL CPU per operation from procfs; ratios: medians of per-round ratios; ${o.rounds} round(s)):`,
    );
    const table = printTable(header, rows);
    if (o.save)
      saveResults('bookkeeping', entries, { machine: machine(), postgres: db.version, tree: gitHead(), table });
  } finally {
    cellContext.postmaster = null;
    await db.close();
  }
}
