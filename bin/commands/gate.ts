/**
 * `gate`: what people do at the gate from a terminal. Call a tool through the gate, confirm and execute its
 * proposal (gate-call.ts), approve or reject an approval (by id and the envelope hash shown by `gate show`),
 * engage, lift or list kill switches, revoke or restore a role, expire due approvals. Every action is audited
 * like the library's. The CLI runs no business validators or resource resolvers (those live in the embedding
 * service): a call that needs one is refused with `config_invalid`, nothing reserved, and approving a tool that
 * binds resources is refused the same way, before the vote is recorded; do those through the library.
 */
import {
  EXIT,
  JSON_ALWAYS,
  parseCommand,
  printJson,
  runSubcommand,
  stringValues,
  usageError,
  type Command,
  type Parsed,
} from '../cli-util.js';
import { hiddenInJson } from '../../core/visible-text.js';
import {
  ACTING_TENANT,
  ACTOR,
  APPROVER,
  APPROVER_ROLE,
  GATE_EXITS,
  ROLE,
  TENANT,
  withActingGate,
  withGate,
} from './gate-kit.js';
import { actingActor, actingRequest, actingTenant, approverRole, BREAK_GLASS, BREAK_GLASS_PREFIX } from './acting.js';
import { killSwitchCommand } from './gate-kill-switch.js';
import { gateCallCommand, gateConfirmCommand, gateExecuteCommand } from './gate-call.js';
import type { Gate, GateResult, Reviewer } from '../../gate/index.js';

const ID_EXAMPLE = '0f3e6a52-8c1d-4b7a-9e2f-5d4c3b2a1908';

/** The one APPROVAL_ID of a parsed invocation and its string options, or the usage error's exit code. */
function approvalArgs(cmd: Command, parsed: Parsed): { id: string; v: Record<string, string | undefined> } | number {
  const [id, ...extra] = parsed.positionals;
  if (id === undefined || extra.length > 0) return usageError(cmd, 'expected one APPROVAL_ID');
  return { id, v: stringValues(parsed.values) };
}

/**
 * A break-glass operator is the person they name: `break-glass:alice` deciding alice's request, or voting
 * again beside alice's own vote, is the requester approving itself or one person counting twice. Refused
 * `self_approval_forbidden` before the gate is asked; null when the name is neither.
 */
async function breakGlassSelf(
  gate: Gate,
  acting: { breakGlass: boolean; actor: string },
  id: string,
  reviewer: Reviewer,
): Promise<GateResult | null> {
  if (!acting.breakGlass) return null;
  const name = acting.actor.slice(BREAK_GLASS_PREFIX.length);
  const view = await gate.approvals.show(id, reviewer).catch(() => null);
  if (view === null) return null;
  const requester = (view.envelope.requester as { principal_id?: unknown } | undefined)?.principal_id;
  if (requester !== name && !view.approvers.includes(name)) return null;
  return {
    ok: false,
    error: 'self_approval_forbidden',
    message: 'another person must decide this: breaking glass under your own name does not make you someone else',
    request_id: id,
  };
}

/**
 * Approves or rejects: one APPROVAL_ID, the deciding principal, its tenant and role from the token (or the
 * break-glass operator, tenant and approver role named), the gate's answer printed.
 */
async function decide(
  cmd: Command,
  argv: string[],
  act: (
    gate: Gate,
    id: string,
    reviewer: Reviewer,
    v: Record<string, string | undefined>,
    flags: Parsed['values'],
  ) => Promise<GateResult>,
): Promise<number> {
  const parsed = parseCommand(cmd, argv, { positionals: true });
  if (typeof parsed === 'number') return parsed;
  const a = approvalArgs(cmd, parsed);
  if (typeof a === 'number') return a;
  const req = actingRequest(cmd, parsed.values, ['tenant', 'role']);
  if (typeof req === 'number') return req;
  return withActingGate(req, async (gate, rt, acting) => {
    const reviewer = {
      tenant_id: actingTenant(acting, a.v.tenant),
      principal_id: actingActor(acting, 'approver', a.v.approver),
      role: approverRole(rt.config, acting, a.v.role),
    };
    const r =
      (await breakGlassSelf(gate, acting, a.id, reviewer)) ?? (await act(gate, a.id, reviewer, a.v, parsed.values));
    printJson(r);
    return r.ok ? EXIT.ok : EXIT.refused;
  });
}

const show: Command = {
  name: 'gate show',
  summary: 'an approval with its envelope and the envelope hash to approve by',
  args: 'APPROVAL_ID',
  options: { tenant: TENANT, json: JSON_ALWAYS },
  examples: [`actionledger gate show ${ID_EXAMPLE} --tenant tenant-a`],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const a = approvalArgs(this, parsed);
    if (typeof a === 'number') return a;
    return withGate(async (gate) => {
      const view = await gate.approvals.show(a.id, { tenant_id: a.v.tenant ?? '' });
      // What `gate approve` would refuse without --accept-hidden-characters, said before it is asked.
      const hidden = hiddenInJson(view.envelope);
      printJson({ ok: true, ...view, ...(hidden.length === 0 ? {} : { hidden_characters: hidden }) });
      return EXIT.ok;
    });
  },
};

const approve: Command = {
  name: 'gate approve',
  summary: 'approve an approval, bound to the envelope hash `gate show` displayed (executes at the last vote)',
  args: 'APPROVAL_ID',
  options: {
    hash: { type: 'string', value: 'SHA256', required: true, description: 'envelope_sha256 as `gate show` printed it' },
    tenant: ACTING_TENANT,
    approver: APPROVER,
    role: APPROVER_ROLE,
    'break-glass': BREAK_GLASS,
    'accept-hidden-characters': {
      type: 'boolean',
      description:
        'approve an envelope that holds characters a reader would not see as written, or right-to-left text (`gate show` prints each hidden character as its \\u code and lists both in hidden_characters; refused `hidden_characters` without this)',
      default: 'off',
    },
    json: JSON_ALWAYS,
  },
  examples: [
    `actionledger gate approve ${ID_EXAMPLE} --hash 9b71d224bd62f3785d96d46ad3ea3d73319bfbc2890caadae2dff72519673ca7 --role supervisor`,
    `actionledger gate approve ${ID_EXAMPLE} --hash 9b71d224bd62f3785d96d46ad3ea3d73319bfbc2890caadae2dff72519673ca7 --tenant tenant-a --role supervisor --break-glass alice`,
  ],
  exits: GATE_EXITS,
  run(argv) {
    return decide(this, argv, (gate, id, reviewer, v, flags) =>
      gate.approve(id, v.hash ?? '', reviewer, {
        acknowledgeHiddenCharacters: flags['accept-hidden-characters'] === true,
      }),
    );
  },
};

const reject: Command = {
  name: 'gate reject',
  summary: 'reject an approval (final)',
  args: 'APPROVAL_ID',
  options: {
    reason: { type: 'string', value: 'WHY', required: true, description: 'why (stored with the approval; audited)' },
    tenant: ACTING_TENANT,
    approver: APPROVER,
    role: APPROVER_ROLE,
    'break-glass': BREAK_GLASS,
    json: JSON_ALWAYS,
  },
  examples: [`actionledger gate reject ${ID_EXAMPLE} --reason 'duplicate request' --role supervisor`],
  exits: GATE_EXITS,
  run(argv) {
    return decide(this, argv, (gate, id, reviewer, v) => gate.reject(id, reviewer, v.reason ?? ''));
  },
};

function roleCommand(action: 'revoke-role' | 'restore-role'): Command {
  const revoke = action === 'revoke-role';
  return {
    name: `gate ${action}`,
    summary: revoke
      ? 'revoke a role from a principal in a tenant (its calls and approvals are refused from now on)'
      : 'restore a revoked role',
    options: {
      tenant: { ...ACTING_TENANT, description: 'tenant the principal acts in (with a token, its tenant)' },
      principal: { type: 'string', value: 'P', required: true, description: 'the principal (agent or person)' },
      role: { ...ROLE, description: 'the role to revoke or restore' },
      actor: ACTOR,
      'break-glass': BREAK_GLASS,
      json: JSON_ALWAYS,
    },
    examples: [
      `actionledger gate ${action} --principal agent-1 --role agent`,
      `actionledger gate ${action} --tenant tenant-a --principal agent-1 --role agent --break-glass security`,
    ],
    exits: GATE_EXITS,
    async run(argv) {
      const parsed = parseCommand(this, argv);
      if (typeof parsed === 'number') return parsed;
      const v = stringValues(parsed.values);
      const req = actingRequest(this, parsed.values, ['tenant']);
      if (typeof req === 'number') return req;
      return withActingGate(req, async (gate, _rt, acting) => {
        const args = [
          actingTenant(acting, v.tenant),
          v.principal ?? '',
          v.role ?? '',
          actingActor(acting, 'actor', v.actor),
        ] as const;
        if (revoke) await gate.revokeRole(...args);
        else await gate.restoreRole(...args);
        printJson({ ok: true });
        return EXIT.ok;
      });
    },
  };
}

const expire: Command = {
  name: 'gate expire',
  summary: 'expire due approvals and proposals (releasing what they hold) and prune rate windows',
  options: { json: JSON_ALWAYS },
  examples: ['actionledger gate expire'],
  exits: GATE_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    return withGate(async (gate) => {
      printJson({ ok: true, ...(await gate.housekeeping()) });
      return EXIT.ok;
    });
  },
};

const SUBCOMMANDS: ReadonlyMap<string, Command> = new Map([
  ['call', gateCallCommand],
  ['confirm', gateConfirmCommand],
  ['execute', gateExecuteCommand],
  ['show', show],
  ['approve', approve],
  ['reject', reject],
  ['kill-switch', killSwitchCommand],
  ['revoke-role', roleCommand('revoke-role')],
  ['restore-role', roleCommand('restore-role')],
  ['expire', expire],
]);

export const gateCommand: Command = {
  name: 'gate',
  summary:
    'call a tool through the gate (confirm, execute), approve / reject approvals, kill switches, role revocations, expire due approvals and proposals and prune rate windows (audited)',
  notes: `The CLI runs no business validators or resource resolvers: a call that needs a validator or a resolver,
and approving a tool that binds resources, are refused (config_invalid) and nothing is reserved; make
them through the service that registers them.

approve, reject, kill-switch engage and lift, revoke-role and restore-role act as the principal of the
token in ACTIONLEDGER_TOKEN, in its tenant and with its role (--approver, --actor, --tenant that disagree
are refused); without a token, the operator names themself with --break-glass NAME (audited as
break-glass:NAME, with break_glass: true), and names the tenant (and, to approve, an approver role).`,
  options: {},
  examples: [
    ...gateCallCommand.examples.slice(0, 1),
    ...show.examples,
    ...approve.examples,
    ...killSwitchCommand.examples.slice(0, 1),
  ],
  exits: GATE_EXITS,
  subcommands: SUBCOMMANDS,
  run(argv) {
    return runSubcommand(this, argv);
  },
};
