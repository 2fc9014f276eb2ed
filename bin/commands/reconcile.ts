/**
 * `reconcile`, `verify`: resolving what the dispatcher could not by provider readback, and checking that the
 * ledger and the providers agree. What is left for a person is `review` (review.ts).
 */
import { isActionLedgerError } from '../../core/errors.js';
import type { Runtime } from '../../runtime/index.js';
import type { PassSummary, VerifyOptions } from '../../reconciler/index.js';
import { load } from './load.js';
import {
  EXIT,
  JSON_OPTION,
  parseCommand,
  printJson,
  printRefusal,
  stderrLog,
  table,
  usageError,
  type Command,
} from '../cli-util.js';

/** Exit code of `reconcile --once` when a provider could not be read back (the database was reachable). */
export const EXIT_PROVIDER_UNREACHABLE = EXIT.providerUnreadable;

function waitForSignal(): Promise<string> {
  return new Promise((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
  });
}

function printPass(s: PassSummary): void {
  const r = s.reconcile;
  if (!r.ran) {
    process.stdout.write('another reconciliation pass holds the lock; nothing done\n');
    return;
  }
  process.stdout.write(
    `${table([
      [
        'examined',
        'succeeded',
        'still unknown',
        'escalated',
        'skipped',
        'provider errors',
        'errors',
        'compensations minted',
        'compensated',
        'compensations escalated',
      ],
      [
        r.examined,
        r.succeeded,
        r.still_unknown,
        r.escalated,
        r.skipped,
        r.provider_errors,
        r.errors,
        s.compensate.minted,
        s.compensate.completed,
        s.compensate.escalated,
      ],
    ])}\n`,
  );
}

export const reconcileCommand: Command = {
  name: 'reconcile',
  summary: 'resolve unknown and orphaned operations by provider readback, and run compensations',
  notes:
    'Without --once it runs the pg-boss schedule (reconciler.schedule) until SIGTERM or SIGINT and prints nothing on stdout.',
  options: {
    once: {
      type: 'boolean',
      description: 'run one pass now, print its summary and exit',
      default: 'off: run the schedule',
    },
    json: { ...JSON_OPTION, description: 'with --once: print the pass summary as one JSON document on stdout' },
  },
  examples: ['actionledger reconcile --once', 'actionledger reconcile --once --json', 'actionledger reconcile'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage, EXIT.providerUnreadable],
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const values = parsed.values;
    if (values.json === true && values.once !== true) return usageError(this, '--json goes with --once only');
    const [{ openRuntime }, { openReconciler, ReconcileSchedule }] = await Promise.all([
      load.runtime(),
      load.reconciler(),
    ]);
    let rt: Runtime;
    try {
      rt = await openRuntime({
        name: 'reconcile',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog({ daemon: values.once !== true }),
      });
    } catch (err) {
      return printRefusal(err);
    }
    try {
      const kit = await openReconciler(rt, process.env);
      try {
        if (values.once === true) {
          const s = await kit.pass();
          if (values.json === true)
            printJson({ ok: s.reconcile.provider_errors === 0 && s.reconcile.errors === 0, ...s });
          else printPass(s);
          if (s.reconcile.errors > 0) return EXIT.refused;
          return s.reconcile.provider_errors > 0 ? EXIT_PROVIDER_UNREACHABLE : EXIT.ok;
        }
        const schedule = new ReconcileSchedule({
          databaseUrl: rt.databaseUrl,
          schema: rt.config.schema,
          cron: rt.config.reconciler.schedule,
          log: rt.log,
          run: (signal) => kit.pass(signal),
        });
        await schedule.start();
        await waitForSignal();
        await schedule.stop();
        return 0;
      } finally {
        kit.close();
      }
    } catch (err) {
      return printRefusal(err);
    } finally {
      await rt.close();
    }
  },
};

/** 0 clean; 3 when the only discrepancies are provider listings that could not be read; 1 otherwise. */
export function verifyExit(discrepancies: readonly { kind: string }[]): number {
  if (discrepancies.length === 0) return EXIT.ok;
  return discrepancies.every((d) => d.kind === 'listing_unavailable') ? EXIT.providerUnreadable : EXIT.refused;
}

export const verifyCommand: Command = {
  name: 'verify',
  summary: 'check the ledger independently: argument hashes, effect keys, history paths, evidence, provider listings',
  notes:
    'Provider listings are read when the dispatch identity (profile, credentials) is configured; otherwise the\nreport says they were not read. Exit 1 on any discrepancy; exit 3 when the only ones are listings that\ncould not be read (listing_unavailable).',
  options: { json: JSON_OPTION },
  examples: ['actionledger verify', 'actionledger verify --json'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage, EXIT.providerUnreadable],
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const values = parsed.values;
    try {
      const [{ openRuntime }, { loadDispatchIdentity }, { EffectKeyer }, { verifyLedger }] = await Promise.all([
        load.runtime(),
        load.identity(),
        load.ledger(),
        load.reconciler(),
      ]);
      const rt = await openRuntime({
        name: 'verify',
        // Reads only (it needs the effect-key secrets, to check every key, but no write privilege).
        migrate: 'check',
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      try {
        let provider: VerifyOptions['provider'];
        let listingsNote: string | null = null;
        try {
          const id = await loadDispatchIdentity(rt, process.env);
          provider = { agent: id.agent(), profile: id.profile, credentials: id.credentials };
        } catch (err) {
          if (!isActionLedgerError(err, 'config_invalid')) throw err;
          listingsNote = `provider listings not read: ${err.message}`;
        }
        try {
          const report = await verifyLedger({
            config: rt.config,
            pool: rt.pool,
            keyer: new EffectKeyer(rt.effectKeys),
            ...(provider === undefined ? {} : { provider }),
          });
          if (values.json === true) printJson({ ...report, ...(listingsNote === null ? {} : { note: listingsNote }) });
          else {
            process.stdout.write(
              `operations ${report.operations}, history rows ${report.history_rows}, provider listings ${report.listings}, provider effects ${report.provider_effects}\n`,
            );
            if (listingsNote !== null) process.stdout.write(`${listingsNote}\n`);
            if (report.discrepancies.length === 0) process.stdout.write('no discrepancies\n');
            else {
              process.stdout.write(
                `\n${table([['kind', 'operation', 'effect key', 'detail'], ...report.discrepancies.map((d) => [d.kind, d.operation_id ?? '-', d.effect_key ?? '-', d.detail])])}\n`,
              );
            }
          }
          return verifyExit(report.discrepancies);
        } finally {
          await provider?.agent.close();
        }
      } finally {
        await rt.close();
      }
    } catch (err) {
      // Coded or not (a PostgreSQL error from a role that may not read the schema): one JSON refusal, exit 1.
      return printRefusal(err);
    }
  },
};
