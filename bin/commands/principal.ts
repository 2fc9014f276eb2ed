/**
 * `principal add|grant|revoke|list`: the principals (services and people) and the roles each holds per tenant,
 * kept by the principal store. Whoever runs them holds the database credentials; the actor recorded with each
 * change is the token's principal (`ACTIONLEDGER_TOKEN`, acting in its own tenant) or the break-glass operator.
 */
import type { PrincipalKind } from '../../principals/index.js';
import {
  EXIT,
  JSON_ALWAYS,
  JSON_OPTION,
  parseCommand,
  printJson,
  runSubcommand,
  stringValues,
  table,
  usageError,
  type Command,
} from '../cli-util.js';
import { load } from './load.js';
import { oneId, PRINCIPAL_EXITS, withReadStore, withStore } from './principal-store.js';
import { slackLink, slackUnlink } from './principal-slack.js';
import { actingAudit, actingRequest, actingTenant, BREAK_GLASS } from './acting.js';

const add: Command = {
  name: 'principal add',
  summary: 'add a principal: a service (an agent, a backend) or a person (audited)',
  args: 'PRINCIPAL_ID',
  options: {
    kind: { type: 'string', value: 'service|person', required: true, description: 'what the principal is' },
    name: { type: 'string', value: 'DISPLAY', description: 'the name shown for it', default: 'its id' },
    'break-glass': BREAK_GLASS,
    json: JSON_ALWAYS,
  },
  examples: [
    "actionledger principal add alice --kind person --name 'Alice Example' --break-glass root",
    'actionledger principal add billing-agent --kind service',
  ],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = oneId(this, parsed, 'PRINCIPAL_ID');
    if (typeof id === 'number') return id;
    const v = stringValues(parsed.values);
    if (v.kind !== 'service' && v.kind !== 'person')
      return usageError(this, `--kind must be service or person, not ${JSON.stringify(v.kind)}`);
    const kind: PrincipalKind = v.kind;
    const req = actingRequest(this, parsed.values);
    if (typeof req === 'number') return req;
    return withStore(req, async (store, acting) => {
      const added = await store.add(id, kind, v.name ?? '', acting.actor);
      printJson({ ok: true, principal_id: id, kind, added });
      return EXIT.ok;
    });
  },
};

function roleChange(action: 'grant' | 'revoke'): Command {
  const grant = action === 'grant';
  return {
    name: `principal ${action}`,
    summary: grant
      ? 'grant a principal a role in a tenant (and lift a revocation of it) (audited)'
      : 'take a role away at once; prints the approvals whose pending votes by the principal were withdrawn (audited)',
    args: 'PRINCIPAL_ID',
    options: {
      tenant: {
        type: 'string',
        value: 'T',
        required: true,
        description: "the tenant (with a token, it must be the token's)",
      },
      role: { type: 'string', value: 'ROLE', required: true, description: `the role to ${action}` },
      'break-glass': BREAK_GLASS,
      json: JSON_ALWAYS,
    },
    examples: [`actionledger principal ${action} alice --tenant tenant-a --role supervisor`],
    exits: PRINCIPAL_EXITS,
    async run(argv) {
      const parsed = parseCommand(this, argv, { positionals: true });
      if (typeof parsed === 'number') return parsed;
      const id = oneId(this, parsed, 'PRINCIPAL_ID');
      if (typeof id === 'number') return id;
      const v = stringValues(parsed.values);
      const req = actingRequest(this, parsed.values);
      if (typeof req === 'number') return req;
      return withStore(req, async (store, acting) => {
        const tenant = actingTenant(acting, v.tenant);
        const role = v.role ?? '';
        const done = grant
          ? { granted: await store.grant(id, tenant, role, acting.actor) }
          : await store.revoke(id, tenant, role, acting.actor);
        printJson({ ok: true, principal_id: id, tenant_id: tenant, role, ...done });
        return EXIT.ok;
      });
    },
  };
}

const list: Command = {
  name: 'principal list',
  summary: 'the principals and the roles each holds (in one tenant, or every tenant)',
  options: {
    tenant: {
      type: 'string',
      value: 'T',
      description: 'only principals holding a role in this tenant',
      default: 'every tenant',
    },
    json: JSON_OPTION,
  },
  examples: ['actionledger principal list', 'actionledger principal list --tenant tenant-a --json'],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const json = parsed.values.json === true;
    const tenant = stringValues(parsed.values).tenant;
    return withReadStore(json, async (store) => {
      const rows = await store.list(tenant ?? null);
      if (json) printJson({ ok: true, principals: rows });
      else {
        const head = ['principal', 'kind', 'name', 'roles (tenant:role)'];
        const lines = rows.map((r) => [
          r.principal_id,
          r.kind,
          r.display_name,
          r.roles.map((g) => `${g.tenant_id}:${g.role}`).join(', '),
        ]);
        process.stdout.write(`${table([head, ...lines])}\n`);
      }
      return EXIT.ok;
    });
  },
};

/** A one-time sign-in link to the operator console; the base URL is the listener's unless --url gives it. */
const loginLink: Command = {
  name: 'principal login-link',
  summary: 'print a one-time sign-in link to the operator console (/console) for a person (audited)',
  args: 'PRINCIPAL_ID',
  options: {
    url: {
      type: 'string',
      value: 'BASE',
      description: 'the console as its users reach it',
      default: 'http(s)://http.host:http.port',
    },
    'break-glass': BREAK_GLASS,
    json: JSON_ALWAYS,
  },
  examples: [
    'actionledger principal login-link alice --break-glass root',
    'actionledger principal login-link alice --url https://ledger.example.com --break-glass root',
  ],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = oneId(this, parsed, 'PRINCIPAL_ID');
    if (typeof id === 'number') return id;
    const v = stringValues(parsed.values);
    const req = actingRequest(this, parsed.values);
    if (typeof req === 'number') return req;
    return withStore(req, async (_store, acting, rt) => {
      const [{ ConsoleSessions }, { AuditWriter }] = await Promise.all([load.principals(), load.gate()]);
      const audit =
        (await actingAudit(rt, acting)) ?? new AuditWriter({ config: rt.config, pool: rt.pool, log: rt.log });
      const sessions = new ConsoleSessions(rt.config, rt.pool, audit);
      const link = await sessions.createLoginLink(String(id), acting.actor);
      const http = rt.config.http;
      const base = (v.url ?? `${http.tls === null ? 'http' : 'https'}://${http.host}:${http.port}`).replace(/\/+$/, '');
      printJson({
        ok: true,
        principal_id: link.principal_id,
        url: `${base}/console/login?link=${link.secret}`,
        expires_at: link.expires_at,
      });
      return EXIT.ok;
    });
  },
};

export const principalCommand: Command = {
  name: 'principal',
  summary:
    'principals and their roles per tenant (services and people): add, grant, revoke, list, Slack user links (audited)',
  notes: `Who acts is the principal of the token in ACTIONLEDGER_TOKEN (in its own tenant), or without a token the
operator named by --break-glass NAME (recorded as break-glass:NAME; the first principal is added that way).`,
  options: {},
  examples: [
    ...add.examples.slice(0, 1),
    `actionledger principal grant alice --tenant tenant-a --role supervisor --break-glass root`,
    ...list.examples.slice(0, 1),
  ],
  exits: PRINCIPAL_EXITS,
  subcommands: new Map([
    ['add', add],
    ['grant', roleChange('grant')],
    ['revoke', roleChange('revoke')],
    ['list', list],
    ['login-link', loginLink],
    ['slack-link', slackLink],
    ['slack-unlink', slackUnlink],
  ]),
  run(argv) {
    return runSubcommand(this, argv);
  },
};
