/** `gate kill-switch engage|lift|list`: stop a tool (or every tool) for a tenant (or every tenant), and back. */
import {
  EXIT,
  JSON_ALWAYS,
  JSON_OPTION,
  parseCommand,
  printJson,
  printRefusal,
  readOnlyRuntime,
  runSubcommand,
  stringValues,
  table,
  type Command,
  type OptionSpecs,
} from '../cli-util.js';
import { load } from './load.js';
import { ACTOR, GATE_EXITS, withActingGate } from './gate-kit.js';
import { actingActor, actingRequest, actingTenant, BREAK_GLASS, requireCapability, type Acting } from './acting.js';
import type { Config } from '../../config/index.js';

const TARGET = {
  tenant: {
    type: 'string',
    value: "T|'*'",
    description: "the tenant, or '*' for every tenant (with --break-glass only)",
    default: "the token's tenant; required with --break-glass",
  },
  tool: { type: 'string', value: "NAME|'*'", required: true, description: "the tool, or '*' for every tool" },
  actor: ACTOR,
  'break-glass': BREAK_GLASS,
} satisfies OptionSpecs;

/** The switch's tenant and the actor; a token needs the `kill_switch` capability and acts in its tenant only. */
function target(config: Config, acting: Acting, v: Record<string, string | undefined>): [string, string] {
  requireCapability(config, acting, 'kill_switch');
  return [actingTenant(acting, v.tenant), actingActor(acting, 'actor', v.actor)];
}

const engage: Command = {
  name: 'gate kill-switch engage',
  summary: 'refuse every call of a tool from now on, and wait for calls already past the check',
  options: {
    ...TARGET,
    reason: { type: 'string', value: 'WHY', required: true, description: 'why (audited; shown by list)' },
    json: JSON_ALWAYS,
  },
  examples: [
    "actionledger gate kill-switch engage --tool '*' --reason 'incident 7'",
    "actionledger gate kill-switch engage --tenant '*' --tool '*' --reason 'incident 7' --break-glass oncall",
  ],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const v = stringValues(parsed.values);
    const req = actingRequest(this, parsed.values, ['tenant']);
    if (typeof req === 'number') return req;
    const [tool, reason] = [v.tool ?? '', v.reason ?? ''];
    return withActingGate(req, async (gate, rt, acting) => {
      const [tenant, actor] = target(rt.config, acting, v);
      const waited = await gate.engageKillSwitch(tenant, tool, actor, reason);
      printJson({ ok: true, tenant_id: tenant, tool_name: tool, engaged: true, ...waited });
      return EXIT.ok;
    });
  },
};

const lift: Command = {
  name: 'gate kill-switch lift',
  summary: 'lift an engaged kill switch (exit 1, not_found, when none is engaged for that tenant and tool)',
  options: { ...TARGET, json: JSON_ALWAYS },
  examples: [
    "actionledger gate kill-switch lift --tool '*'",
    "actionledger gate kill-switch lift --tenant '*' --tool '*' --break-glass oncall",
  ],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const v = stringValues(parsed.values);
    const req = actingRequest(this, parsed.values, ['tenant']);
    if (typeof req === 'number') return req;
    const tool = v.tool ?? '';
    return withActingGate(req, async (gate, rt, acting) => {
      const [tenant, actor] = target(rt.config, acting, v);
      if (!(await gate.liftKillSwitch(tenant, tool, actor))) {
        printJson({ ok: false, error: 'not_found', message: 'no such kill switch is engaged' });
        return EXIT.refused;
      }
      printJson({ ok: true, tenant_id: tenant, tool_name: tool, engaged: false });
      return EXIT.ok;
    });
  },
};

const list: Command = {
  name: 'gate kill-switch list',
  summary: 'the engaged kill switches',
  options: { json: JSON_OPTION },
  examples: ['actionledger gate kill-switch list', 'actionledger gate kill-switch list --json'],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    try {
      // Reads only: no migrations, no secrets, no gate (a role with SELECT alone may list).
      const [{ openRuntime }, { listKillSwitches }] = await Promise.all([load.runtime(), load.gate()]);
      const rt = await openRuntime({ name: 'gate', ...readOnlyRuntime() });
      try {
        const rows = await listKillSwitches(rt.pool, rt.config.schemaQuoted);
        if (parsed.values.json === true) printJson({ ok: true, kill_switches: rows });
        else
          process.stdout.write(
            `${table([['tenant', 'tool', 'engaged at', 'by', 'reason'], ...rows.map((r) => [r.tenant_id, r.tool_name, r.engaged_at.toISOString(), r.engaged_by, r.reason])])}\n`,
          );
        return EXIT.ok;
      } finally {
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err, { json: parsed.values.json === true });
    }
  },
};

export const killSwitchCommand: Command = {
  name: 'gate kill-switch',
  summary: 'engage, lift or list kill switches (audited)',
  options: {},
  examples: [...engage.examples, ...lift.examples, ...list.examples],
  exits: GATE_EXITS,
  subcommands: new Map([
    ['engage', engage],
    ['lift', lift],
    ['list', list],
  ]),
  run(argv) {
    return runSubcommand(this, argv);
  },
};
