/**
 * `reconcile`, `review`, `verify`: resolving what the dispatcher could not, by machine and by person, and
 * checking that the ledger and the providers agree.
 */
import { parseArgs } from 'node:util';
import { ActionLedgerError, isActionLedgerError } from '../../core/errors.js';
import { openRuntime, type Runtime } from '../../core/runtime.js';
import { loadDispatchIdentity } from '../../core/identity.js';
import { EffectKeyer } from '../../ledger/index.js';
import {
  openReconciler,
  openReview,
  ReconcileSchedule,
  verifyLedger,
  type PassSummary,
} from '../../reconciler/index.js';
import { printJson, printRefusal, stderrLog, table, usageError, type Command } from '../cli-util.js';

/** Exit code of `reconcile --once` when a provider could not be read back (the database was reachable). */
export const EXIT_PROVIDER_UNREACHABLE = 3;

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
  summary: 'resolve unknown and orphaned operations by provider readback, and run compensations',
  usage:
    'actionledger reconcile --once [--json]   (without --once: run the pg-boss schedule until SIGTERM); exit 3: a provider could not be read back, 1: an operation or the database failed',
  async run(argv) {
    let values: { once?: boolean; json?: boolean };
    try {
      ({ values } = parseArgs({ args: argv, options: { once: { type: 'boolean' }, json: { type: 'boolean' } } }));
    } catch (err) {
      return usageError('reconcile', (err as Error).message, this.usage);
    }
    let rt: Runtime;
    try {
      rt = await openRuntime({ name: 'reconcile', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
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
          if (s.reconcile.errors > 0) return 1;
          return s.reconcile.provider_errors > 0 ? EXIT_PROVIDER_UNREACHABLE : 0;
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

const REVIEW_ACTIONS = ['retry', 'resolve-succeeded', 'resolve-failed', 'compensate'] as const;
type ReviewAction = (typeof REVIEW_ACTIONS)[number];

export const reviewCommand: Command = {
  summary: 'act on an operation in review: retry, resolve-succeeded, resolve-failed, compensate (audited)',
  usage:
    'actionledger review retry|resolve-succeeded|resolve-failed|compensate OPERATION_ID --actor WHO --reason WHY [--receipt R] [--approval A] [--policy V]',
  async run(argv) {
    let values: Record<string, string | undefined>;
    let positionals: string[];
    try {
      ({ values, positionals } = parseArgs({
        args: argv,
        allowPositionals: true,
        options: Object.fromEntries(
          ['actor', 'reason', 'receipt', 'approval', 'policy'].map((k) => [k, { type: 'string' as const }]),
        ),
      }));
    } catch (err) {
      return usageError('review', (err as Error).message, this.usage);
    }
    const [action, id, ...extra] = positionals;
    if (!REVIEW_ACTIONS.includes(action as ReviewAction) || id === undefined || extra.length > 0) {
      return usageError('review', `expected an action (${REVIEW_ACTIONS.join(', ')}) and one OPERATION_ID`, this.usage);
    }
    if (values.receipt !== undefined && action !== 'resolve-succeeded')
      return usageError('review', '--receipt goes with resolve-succeeded only', this.usage);
    if ((values.approval !== undefined || values.policy !== undefined) && action !== 'retry')
      return usageError('review', '--approval and --policy go with retry only', this.usage);
    try {
      const rt = await openRuntime({
        name: 'review',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      const kit = openReview(rt);
      try {
        const input = { actor: values.actor ?? '', reason: values.reason ?? '' };
        const r =
          action === 'retry'
            ? await kit.review.retry(id, {
                ...input,
                ...(values.approval === undefined ? {} : { approvalId: values.approval }),
                ...(values.policy === undefined ? {} : { policyVersion: values.policy }),
              })
            : action === 'resolve-succeeded'
              ? await kit.review.resolveSucceeded(id, { ...input, receipt: values.receipt ?? '' })
              : action === 'resolve-failed'
                ? await kit.review.resolveFailed(id, input)
                : await kit.review.compensate(id, input);
        printJson(r);
        return 0;
      } finally {
        kit.close();
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err);
    }
  },
};

export const verifyCommand: Command = {
  summary: 'check the ledger independently: argument hashes, effect keys, history paths, evidence, provider listings',
  usage: 'actionledger verify [--json]   (exit 1 when it finds any discrepancy)',
  async run(argv) {
    let values: { json?: boolean };
    try {
      ({ values } = parseArgs({ args: argv, options: { json: { type: 'boolean' } } }));
    } catch (err) {
      return usageError('verify', (err as Error).message, this.usage);
    }
    try {
      const rt = await openRuntime({
        name: 'verify',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      try {
        let provider: Parameters<typeof verifyLedger>[0]['provider'];
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
          return report.ok ? 0 : 1;
        } finally {
          await provider?.agent.close();
        }
      } finally {
        await rt.close();
      }
    } catch (err) {
      if (err instanceof ActionLedgerError) return printRefusal(err);
      throw err;
    }
  },
};
