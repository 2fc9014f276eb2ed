/** `migrate`, `status`, `reserve`, `show`: the ledger's subcommands. */
import { parseStrictJson } from '../../core/json.js';
import { ActionLedgerError } from '../../core/errors.js';
import { visibleJson } from '../../core/visible-text.js';
import { load } from './load.js';
import {
  EXIT,
  JSON_ALWAYS,
  JSON_OPTION,
  parseCommand,
  printJson,
  printRefusal,
  readOnlyRuntime,
  stderrLog,
  table,
  usageError,
  type Command,
  type OptionSpecs,
} from '../cli-util.js';

const STANDARD_EXITS = [EXIT.ok, EXIT.refused, EXIT.usage];

export const migrateCommand: Command = {
  name: 'migrate',
  summary: 'apply pending migrations (under an advisory lock) and exit',
  options: { json: JSON_ALWAYS },
  examples: ['actionledger migrate'],
  exits: STANDARD_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    try {
      const { openRuntime } = await load.runtime();
      const rt = await openRuntime({
        name: 'migrate',
        migrate: true,
        // Changing the schema mints no effect keys: a migration job needs no secrets.
        effectKeys: false,
        defaultMetrics: false,
        logDestination: stderrLog(),
      });
      await rt.close();
      printJson({ ok: true });
      return EXIT.ok;
    } catch (err) {
      return printRefusal(err, { json: parsed.values.json === true });
    }
  },
};

export const statusCommand: Command = {
  name: 'status',
  summary: 'operations by state, outbox depth and the oldest waiting age',
  options: { json: JSON_OPTION },
  examples: ['actionledger status', 'actionledger status --json'],
  exits: STANDARD_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    try {
      const [{ openRuntime }, { LedgerView }] = await Promise.all([load.runtime(), load.ledger()]);
      const rt = await openRuntime({ name: 'status', ...readOnlyRuntime() });
      try {
        const s = await new LedgerView(rt.pool, rt.config.schemaQuoted).status();
        if (parsed.values.json === true) printJson({ ok: true, ...s });
        else {
          const rows: (string | number)[][] = [
            ['state', 'operations'],
            ...Object.entries(s.by_status).map(([k, v]) => [k, v]),
          ];
          process.stdout.write(
            `${table(rows)}\n\noutbox depth: ${s.outbox_depth}\noldest pending: ${s.oldest_pending_age_s === null ? '-' : `${s.oldest_pending_age_s.toFixed(1)} s`}\n`,
          );
        }
        return EXIT.ok;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err, { json: parsed.values.json === true });
    }
  },
};

const RESERVE_OPTIONS = {
  tenant: { type: 'string', value: 'T', required: true, description: 'tenant the operation acts for' },
  principal: { type: 'string', value: 'P', required: true, description: 'principal (agent or user) acting' },
  task: { type: 'string', value: 'K', required: true, description: 'task id the step belongs to' },
  step: { type: 'string', value: 'S', required: true, description: 'workflow step id (one operation per step)' },
  approval: { type: 'string', value: 'A', required: true, description: 'approval id authorizing the step' },
  policy: { type: 'string', value: 'V', required: true, description: 'policy version the approval was made under' },
  tool: { type: 'string', value: 'NAME', required: true, description: 'configured tool to call' },
  args: { type: 'string', value: 'JSON', required: true, description: "the tool's arguments: one strict JSON object" },
  json: JSON_ALWAYS,
} satisfies OptionSpecs;

export const reserveCommand: Command = {
  name: 'reserve',
  summary: 'reserve one operation for a workflow step (prints the operation id and effect key)',
  notes:
    "The trusted-service path: it reserves straight in the ledger and skips every gate check (an agent's call\ngoes through `gate call`); the built-in authorization service allows it at dispatch only when\ngate.direct_reservations is allow. Reserving the same step again with the same arguments returns the\nsame operation (created: false); other arguments for the same step are refused (operation_conflict).",
  options: RESERVE_OPTIONS,
  examples: [
    `actionledger reserve --tenant tenant-a --principal agent-1 --task task-1 --step s-1 --approval ap-1 --policy v1 --tool issue_refund --args '{"order_id":"o-1","amount":10,"currency":"EUR"}'`,
  ],
  exits: STANDARD_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const v = (k: keyof typeof RESERVE_OPTIONS): string => String(parsed.values[k] ?? '');
    try {
      let args: unknown;
      try {
        args = parseStrictJson(v('args'), { requireObject: true });
      } catch (cause) {
        throw new ActionLedgerError(
          'invalid_arguments',
          `--args is not one strict JSON object: ${(cause as Error).message}`,
          { cause },
        );
      }
      const [{ openRuntime }, { EffectKeyer, Ledger }] = await Promise.all([load.runtime(), load.ledger()]);
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
            tenant_id: v('tenant'),
            principal_id: v('principal'),
            task_id: v('task'),
            workflow_step_id: v('step'),
            approval_id: v('approval'),
            policy_version: v('policy'),
          },
          v('tool'),
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
        return EXIT.ok;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err, { json: parsed.values.json === true });
    }
  },
};

export const showCommand: Command = {
  name: 'show',
  summary: 'one operation and its state history',
  args: 'OPERATION_ID',
  options: { json: JSON_OPTION },
  examples: ['actionledger show 6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e --json'],
  exits: STANDARD_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = parsed.positionals[0];
    if (id === undefined || parsed.positionals.length > 1) return usageError(this, 'expected one OPERATION_ID');
    try {
      const [{ openRuntime }, { LedgerView }] = await Promise.all([load.runtime(), load.ledger()]);
      const rt = await openRuntime({ name: 'show', ...readOnlyRuntime() });
      try {
        const { operation, history } = await new LedgerView(rt.pool, rt.config.schemaQuoted).show(id);
        if (parsed.values.json === true) printJson({ ok: true, operation, history });
        else {
          const { arguments_json: _args, ...rest } = operation;
          for (const [k, v] of Object.entries(rest))
            process.stdout.write(`${k.padEnd(24)} ${v instanceof Date ? v.toISOString() : visibleJson(v)}\n`);
          process.stdout.write(
            `\n${table([['at', 'from', 'to', 'actor', 'reason'], ...history.map((h) => [h.at.toISOString(), h.from_status ?? '-', h.to_status, h.actor, h.reason])])}\n`,
          );
        }
        return EXIT.ok;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err, { json: parsed.values.json === true });
    }
  },
};
