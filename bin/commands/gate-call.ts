/**
 * `gate call`, `gate confirm`, `gate execute`: a tool call through the gate's whole pipeline from a terminal,
 * exactly as the library's `Gate.call`, `Gate.confirm` and `Gate.executeProposal` run it (roles, kill switches,
 * rate, schema, caps, then a reservation, a proposal to confirm, or an approval to ask a person for), each
 * audited. The trusted context comes from the flags: whoever runs the command line has the database and is
 * trusted to state it. The CLI runs no business validators or resource resolvers, so a call that needs one is
 * refused (`config_invalid`) and nothing is reserved. The answer is the gate's, printed as one JSON document
 * with `next`: the exact commands to run after it (confirm and execute, or show and approve, or show).
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseStrictJson } from '../../core/json.js';
import {
  EXIT,
  JSON_ALWAYS,
  intOption,
  parseCommand,
  printJson,
  stringValues,
  usageError,
  type Command,
  type OptionSpecs,
  type Parsed,
} from '../cli-util.js';
import { TOKEN_ENV } from './acting.js';
import { GATE_EXITS, withGate } from './gate-kit.js';
import type { Gate, GateContext, GateResult } from '../../gate/index.js';

type Values = Record<string, string | undefined>;

/** The trusted context, one flag per field (gate/types.ts GATE_CONTEXT_FIELDS, and the plan version). */
const CONTEXT_OPTIONS = {
  tenant: { type: 'string', value: 'T', required: true, description: 'tenant the call acts in' },
  principal: {
    type: 'string',
    value: 'P',
    required: true,
    description: 'the calling principal (agent or person), as your authentication established it',
  },
  role: { type: 'string', value: 'ROLE', required: true, description: "the caller's role (one of the tool's roles)" },
  account: {
    type: 'string',
    value: 'A',
    required: true,
    description: 'the account the call acts for (per-account caps count here)',
  },
  task: { type: 'string', value: 'K', required: true, description: 'the task the step belongs to' },
  step: {
    type: 'string',
    value: 'S',
    required: true,
    description: 'workflow step id: principal, task and step are the operation (the same step again is the same one)',
  },
  conversation: {
    type: 'string',
    value: 'C',
    description: 'conversation id (per-conversation caps count here)',
    default: 'the --task value',
  },
  turn: {
    type: 'string',
    value: 'N',
    description: 'the user turn the call is made in (a confirmation must come in a later one)',
    default: '1',
  },
  trace: { type: 'string', value: 'ID', description: 'trace id, kept in the audit log', default: 'a new random id' },
  plan: {
    type: 'string',
    value: 'V',
    description:
      "the current plan version of this principal's task (a new one invalidates its approvals bound to the old)",
    default: 'unchanged',
  },
} satisfies OptionSpecs;

const ARGS_SOURCES = "one strict JSON object, @FILE to read it from a file, or '-' for stdin";

const CTX_EXAMPLE =
  '--tenant tenant-a --principal agent-7 --role agent --account acct-1 --task refund-42 --step 1 --conversation c-1';
const ID_EXAMPLE = '6c1f0b7e-3d2a-4e59-8f41-0a9b8c7d6e5f';

/** The context the flags state; optional fields take their documented defaults. */
function contextOf(v: Values): GateContext {
  return {
    tenant_id: v.tenant ?? '',
    principal_id: v.principal ?? '',
    role: v.role ?? '',
    account_id: v.account ?? '',
    conversation_id: v.conversation ?? v.task ?? '',
    turn_id: v.turn ?? '1',
    trace_id: v.trace ?? `cli-${randomUUID()}`,
    task_id: v.task ?? '',
    workflow_step_id: v.step ?? '',
    ...(v.plan === undefined ? {} : { plan_version: v.plan }),
  };
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

/** `--args`: the JSON text itself, @FILE, or '-' (stdin), parsed as one strict JSON object; else a usage error. */
async function readArgs(cmd: Command, raw: string): Promise<{ args: unknown } | number> {
  let text = raw;
  if (raw === '-') text = await readStdin();
  else if (raw.startsWith('@')) {
    try {
      text = readFileSync(raw.slice(1), 'utf8');
    } catch (err) {
      const why = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      return usageError(cmd, `--args ${raw}: cannot read ${JSON.stringify(raw.slice(1))} (${why})`);
    }
  }
  const from = raw === '-' ? ' (from stdin)' : raw.startsWith('@') ? ` (from ${raw.slice(1)})` : '';
  try {
    return { args: parseStrictJson(text, { requireObject: true }) };
  } catch (err) {
    return usageError(cmd, `--args${from} is not one strict JSON object: ${(err as Error).message}`);
  }
}

/** A word as the shell reads it back: bare when it is plain, else single-quoted. */
function sh(word: string): string {
  return /^[A-Za-z0-9_.:/@=+,-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/** The context flags that state `ctx` again, in turn `turn`. */
function contextFlags(ctx: GateContext, turn: string): string {
  const flags: [string, string][] = [
    ['tenant', ctx.tenant_id],
    ['principal', ctx.principal_id],
    ['role', ctx.role],
    ['account', ctx.account_id],
    ['task', ctx.task_id],
    ['step', ctx.workflow_step_id],
    ['conversation', ctx.conversation_id],
    ['turn', turn],
  ];
  if (ctx.plan_version !== undefined) flags.push(['plan', ctx.plan_version]);
  // A value beginning with '-' is written --flag=VALUE, as the parser reads it.
  return flags.map(([k, v]) => (v.startsWith('-') ? `--${k}=${sh(v)}` : `--${k} ${sh(v)}`)).join(' ');
}

/** The turn after `turn`: the next integer, or a placeholder to fill in. */
function laterTurn(turn: string): string {
  return /^[0-9]{1,15}$/.test(turn) ? String(Number(turn) + 1) : `LATER_TURN`;
}

/** The exact commands that follow the gate's answer, or none. */
function nextCommands(gate: Gate, r: GateResult, ctx: GateContext, tool: string): string[] {
  if (r.ok && r.operation_id !== undefined) return [`actionledger show ${r.operation_id}`];
  const id = r.request_id ?? '';
  if (r.ok && r.status === 'confirmed') return [`actionledger gate execute ${id} ${contextFlags(ctx, ctx.turn_id)}`];
  if (r.ok) return [];
  if (r.error === 'confirmation_required') {
    const turn = laterTurn(ctx.turn_id);
    const token = r.confirm_token ?? '';
    // A token may begin with '-': after `--` it is read as the argument, never as an option.
    const confirm = token.startsWith('-')
      ? `actionledger gate confirm ${contextFlags(ctx, turn)} -- ${token}`
      : `actionledger gate confirm ${token} ${contextFlags(ctx, turn)}`;
    return [confirm, `actionledger gate execute ${id} ${contextFlags(ctx, turn)}`];
  }
  if (r.error === 'approval_required') {
    const roles = [...(gate.tool(tool)?.approverRoles ?? [])];
    const role = roles.length === 1 ? sh(roles[0] ?? '') : `APPROVER_ROLE`;
    // `gate approve` acts as someone: the token in the environment, or without one the operator named by
    // --break-glass (refused unauthenticated when neither is there, and invalid_request when both are).
    const token = process.env[TOKEN_ENV];
    const who = token === undefined || token === '' ? ' --break-glass APPROVER_NAME' : '';
    return [
      `actionledger gate show ${id} --tenant ${sh(ctx.tenant_id)}`,
      `actionledger gate approve ${id} --hash ENVELOPE_SHA256 --tenant ${sh(ctx.tenant_id)} --role ${role}${who}`,
    ];
  }
  return [];
}

/** Prints the gate's answer with the commands that follow it; exit 0 when it says ok, else 1. */
function answer(gate: Gate, r: GateResult, ctx: GateContext, tool: string): number {
  const next = nextCommands(gate, r, ctx, tool);
  printJson(next.length === 0 ? r : { ...r, next });
  return r.ok ? EXIT.ok : EXIT.refused;
}

/** The one positional argument of a parsed invocation, or the usage error's exit code. */
function onePositional(cmd: Command, parsed: Parsed): string | number {
  const [first, ...extra] = parsed.positionals;
  if (first === undefined || first === '' || extra.length > 0) return usageError(cmd, `expected one ${cmd.args}`);
  return first;
}

const CALL_OPTIONS = {
  ...CONTEXT_OPTIONS,
  tool: { type: 'string', value: 'NAME', required: true, description: 'the tool to call (one of gate.tools)' },
  args: { type: 'string', value: 'JSON', required: true, description: `the tool's arguments: ${ARGS_SOURCES}` },
  ttl: {
    type: 'string',
    value: 'SECONDS',
    description: 'a shorter confirmation window for a proposal (never longer than configured)',
    default: 'gate.confirmation_ttl_s',
  },
  json: JSON_ALWAYS,
} satisfies OptionSpecs;

export const gateCallCommand: Command = {
  name: 'gate call',
  summary: 'call a tool through the whole gate, as an agent would: reserved, refused, or held for a person',
  notes: [
    'Runs Gate.call: role, kill switch, rate, schema, caps, then a reservation (`reserved`), a proposal to',
    'confirm (`confirmation_required`, with a one-time confirm token: `gate confirm` then `gate execute`), or',
    'an approval a person decides (`approval_required`: `gate show`, then `gate approve` with the hash).',
    '`next` holds those commands. The context comes from the flags: whoever runs this has the database and is',
    'trusted to state it. No business validators or resource resolvers run here: a call that needs one is',
    'refused (config_invalid) and nothing is reserved; make it through the service that registers them.',
    'Exit 1 for every answer with ok false, the holds included: nothing is reserved yet.',
  ].join('\n'),
  options: CALL_OPTIONS,
  examples: [
    `actionledger gate call ${CTX_EXAMPLE} --tool issue_refund --args '{"order_id":"o-1","amount":1250,"currency":"EUR"}'`,
    `actionledger gate call ${CTX_EXAMPLE} --tool issue_refund --args @refund.json`,
  ],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const v = stringValues(parsed.values);
    const ttl = intOption(parsed.values, 'ttl', 1, 86400);
    if ('problem' in ttl) return usageError(this, ttl.problem);
    const a = await readArgs(this, v.args ?? '');
    if (typeof a === 'number') return a;
    const ctx = contextOf(v);
    const tool = v.tool ?? '';
    return withGate(async (gate) => {
      const r = await gate.call(ctx, tool, a.args, ttl.value === undefined ? {} : { ttl_s: ttl.value });
      return answer(gate, r, ctx, tool);
    });
  },
};

export const gateConfirmCommand: Command = {
  name: 'gate confirm',
  summary: "confirm a proposal by its one-time token, in a later turn than the call's (then `gate execute`)",
  args: 'TOKEN',
  notes: [
    "Runs Gate.confirm: the token of `gate call`'s confirmation_required answer ('-' reads it from stdin), once,",
    "as the call's principal in its tenant (anyone else: proposal_not_found), in a later turn than the call's",
    '(the same turn is refused: proposal_same_turn_confirm).',
    'A confirmation reserves nothing: `gate execute` with the request id does.',
  ].join('\n'),
  options: {
    ...CONTEXT_OPTIONS,
    turn: {
      type: 'string',
      value: 'N',
      required: true,
      description: "the user turn the confirmation comes in: a later one than the call's",
    },
    json: JSON_ALWAYS,
  },
  examples: [`actionledger gate confirm 'Zm9vYmFy...' ${CTX_EXAMPLE} --turn 2`],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const raw = onePositional(this, parsed);
    if (typeof raw === 'number') return raw;
    const token = raw === '-' ? (await readStdin()).trim() : raw;
    const ctx = contextOf(stringValues(parsed.values));
    return withGate(async (gate) => answer(gate, await gate.confirm(token, ctx), ctx, ''));
  },
};

export const gateExecuteCommand: Command = {
  name: 'gate execute',
  summary: 'execute a confirmed proposal: reserves the proposed call (idempotent: again, the same operation)',
  args: 'REQUEST_ID',
  notes: [
    'Runs Gate.executeProposal: the stored arguments are reserved, never re-supplied ones; permission and kill',
    "switches are checked again with today's state. With --args, they must be the proposed ones (params_mismatch).",
  ].join('\n'),
  options: {
    ...CONTEXT_OPTIONS,
    args: {
      type: 'string',
      value: 'JSON',
      description: `the arguments you expect, compared by hash with the proposed ones: ${ARGS_SOURCES}`,
      default: 'not compared',
    },
    json: JSON_ALWAYS,
  },
  examples: [`actionledger gate execute ${ID_EXAMPLE} ${CTX_EXAMPLE} --turn 2`],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = onePositional(this, parsed);
    if (typeof id === 'number') return id;
    const v = stringValues(parsed.values);
    const a = v.args === undefined ? {} : await readArgs(this, v.args);
    if (typeof a === 'number') return a;
    const ctx = contextOf(v);
    return withGate(async (gate) => answer(gate, await gate.executeProposal(id, ctx, a), ctx, ''));
  },
};
