/** `migrate`, `status`, `reserve`, `show`: the ledger's subcommands. */
import { parseArgs } from 'node:util';
import { parseStrictJson } from '../../core/json.js';
import { ActionLedgerError } from '../../core/errors.js';
import { openRuntime } from '../../core/runtime.js';
import { EffectKeyer, Ledger } from '../../ledger/index.js';
import { printJson, printRefusal, stderrLog, table, usageError, type Command } from '../cli-util.js';

export const migrateCommand: Command = {
  summary: 'apply pending migrations (under an advisory lock) and exit',
  usage: 'actionledger migrate',
  async run() {
    try {
      const rt = await openRuntime({
        name: 'migrate',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      await rt.close();
      printJson({ ok: true });
      return 0;
    } catch (err) {
      return printRefusal(err);
    }
  },
};

export const statusCommand: Command = {
  summary: 'operations by state, outbox depth and the oldest waiting age',
  usage: 'actionledger status [--json]',
  async run(argv) {
    const { values } = parseArgs({ args: argv, options: { json: { type: 'boolean' } } });
    try {
      const rt = await openRuntime({
        name: 'status',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      try {
        const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
        const s = await ledger.status();
        ledger.stop();
        if (values.json === true) printJson({ ok: true, ...s });
        else {
          const rows: (string | number)[][] = [
            ['state', 'operations'],
            ...Object.entries(s.by_status).map(([k, v]) => [k, v]),
          ];
          process.stdout.write(
            `${table(rows)}\n\noutbox depth: ${s.outbox_depth}\noldest pending: ${s.oldest_pending_age_s === null ? '-' : `${s.oldest_pending_age_s.toFixed(1)} s`}\n`,
          );
        }
        return 0;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err);
    }
  },
};

export const reserveCommand: Command = {
  summary: 'reserve one operation for a workflow step (prints the operation id and effect key)',
  usage:
    'actionledger reserve --tenant T --principal P --task K --step S --approval A --policy V --tool NAME --args JSON',
  async run(argv) {
    let values: Record<string, string | undefined>;
    try {
      ({ values } = parseArgs({
        args: argv,
        options: Object.fromEntries(
          ['tenant', 'principal', 'task', 'step', 'approval', 'policy', 'tool', 'args'].map((k) => [
            k,
            { type: 'string' as const },
          ]),
        ),
      }));
    } catch (err) {
      return usageError('reserve', (err as Error).message, this.usage);
    }
    const missing = ['tenant', 'principal', 'task', 'step', 'approval', 'policy', 'tool', 'args'].filter(
      (k) => values[k] === undefined,
    );
    if (missing.length > 0) return usageError('reserve', `missing --${missing.join(', --')}`, this.usage);
    try {
      let args: unknown;
      try {
        args = parseStrictJson(values.args ?? '', { requireObject: true });
      } catch (cause) {
        throw new ActionLedgerError(
          'invalid_arguments',
          `--args is not one strict JSON object: ${(cause as Error).message}`,
          { cause },
        );
      }
      const rt = await openRuntime({
        name: 'reserve',
        migrate: true,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      try {
        const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
        const r = await ledger.reserve(
          {
            tenant_id: values.tenant ?? '',
            principal_id: values.principal ?? '',
            task_id: values.task ?? '',
            workflow_step_id: values.step ?? '',
            approval_id: values.approval ?? '',
            policy_version: values.policy ?? '',
          },
          values.tool ?? '',
          args,
          { actor: 'cli' },
        );
        ledger.stop();
        printJson({
          ok: true,
          operation_id: r.operation_id,
          effect_key: r.effect_key,
          created: r.created,
          status: r.status,
        });
        return 0;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err);
    }
  },
};

export const showCommand: Command = {
  summary: 'one operation and its state history',
  usage: 'actionledger show OPERATION_ID [--json]',
  async run(argv) {
    const { values, positionals } = parseArgs({
      args: argv,
      options: { json: { type: 'boolean' } },
      allowPositionals: true,
    });
    const id = positionals[0];
    if (id === undefined || positionals.length > 1) return usageError('show', 'expected one OPERATION_ID', this.usage);
    try {
      const rt = await openRuntime({ name: 'show', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
      try {
        const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
        const { operation, history } = await ledger.show(id);
        ledger.stop();
        if (values.json === true) printJson({ ok: true, operation, history });
        else {
          const { arguments_json: _args, ...rest } = operation;
          for (const [k, v] of Object.entries(rest))
            process.stdout.write(`${k.padEnd(24)} ${v instanceof Date ? v.toISOString() : JSON.stringify(v)}\n`);
          process.stdout.write(
            `\n${table([['at', 'from', 'to', 'actor', 'reason'], ...history.map((h) => [h.at.toISOString(), h.from_status ?? '-', h.to_status, h.actor, h.reason])])}\n`,
          );
        }
        return 0;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err);
    }
  },
};
