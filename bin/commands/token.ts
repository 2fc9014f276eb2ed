/**
 * `token create|revoke|list`: API tokens. A token acts for one principal in one tenant until it expires or is
 * revoked; it is printed once, when it is created, and only its sha256 is kept (a listing never shows it).
 * The actor recorded is the token's principal (`ACTIONLEDGER_TOKEN`) or the break-glass operator.
 */
import { ActionLedgerError } from '../../core/errors.js';
import {
  EXIT,
  JSON_ALWAYS,
  JSON_OPTION,
  intOption,
  parseCommand,
  printJson,
  runSubcommand,
  stringValues,
  table,
  usageError,
  type Command,
} from '../cli-util.js';
import { actingRequest, actingTenant, BREAK_GLASS } from './acting.js';
import { oneId, PRINCIPAL_EXITS, withReadStore, withStore } from './principal-store.js';

const TOKEN_ID_EXAMPLE = '3d0c8a1e-5b7f-4e29-8c61-0a9b2f4d6e13';

const create: Command = {
  name: 'token create',
  summary: 'a new API token for a principal in a tenant, printed this once (audited)',
  args: 'PRINCIPAL_ID',
  notes: `The principal must hold a role in the tenant. The token is printed once, on stdout, with its id and
expiry; only its sha256 is kept, so it cannot be shown again (revoke it and create another).`,
  options: {
    tenant: {
      type: 'string',
      value: 'T',
      required: true,
      description: "the tenant the token acts in (with a token, it must be the token's)",
    },
    name: { type: 'string', value: 'N', description: 'a label for the token', default: 'token' },
    'ttl-days': {
      type: 'string',
      value: 'D',
      description: 'days until it expires (at most api.token_max_ttl_days)',
      default: 'api.token_max_ttl_days',
    },
    'break-glass': BREAK_GLASS,
    json: JSON_OPTION,
  },
  examples: [
    'actionledger token create alice --tenant tenant-a --name laptop --ttl-days 30',
    'actionledger token create billing-agent --tenant tenant-a --json --break-glass root',
  ],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = oneId(this, parsed, 'PRINCIPAL_ID');
    if (typeof id === 'number') return id;
    const ttl = intOption(parsed.values, 'ttl-days', 1, 3650);
    if ('problem' in ttl) return usageError(this, ttl.problem);
    const v = stringValues(parsed.values);
    const req = actingRequest(this, parsed.values);
    if (typeof req === 'number') return req;
    return withStore(req, async (store, acting, rt) => {
      const tenant = actingTenant(acting, v.tenant);
      const days = ttl.value ?? rt.config.api.tokenMaxTtlDays;
      const made = await store.createToken(id, tenant, v.name ?? '', days, acting.actor);
      if (parsed.values.json === true) printJson({ ok: true, ...made });
      else {
        const rows = [
          ['token_id', made.token_id],
          ['principal', made.principal_id],
          ['tenant', made.tenant_id],
          ['expires_at', made.expires_at],
          ['token', made.token],
        ];
        process.stdout.write(`${table(rows)}\n`);
        process.stderr.write('actionledger: the token is shown this once; keep it now (only its sha256 is stored)\n');
      }
      return EXIT.ok;
    });
  },
};

const revoke: Command = {
  name: 'token revoke',
  summary: 'revoke a token: the next command or request with it is refused (audited)',
  args: 'TOKEN_ID',
  options: { 'break-glass': BREAK_GLASS, json: JSON_ALWAYS },
  examples: [`actionledger token revoke ${TOKEN_ID_EXAMPLE}`],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv, { positionals: true });
    if (typeof parsed === 'number') return parsed;
    const id = oneId(this, parsed, 'TOKEN_ID');
    if (typeof id === 'number') return id;
    const req = actingRequest(this, parsed.values);
    if (typeof req === 'number') return req;
    return withStore(req, async (store, acting) => {
      // A token revokes the tokens of its own tenant only; another tenant's looks like one that does not exist.
      if (acting.tenant !== null) {
        const mine = await store.listTokens({ tenant_id: acting.tenant });
        if (!mine.some((t) => t.token_id === id.toLowerCase()))
          throw new ActionLedgerError('not_found', 'there is no token with that id');
      }
      const revoked = await store.revokeToken(id, acting.actor);
      printJson({ ok: true, token_id: id, revoked });
      return EXIT.ok;
    });
  },
};

const list: Command = {
  name: 'token list',
  summary: 'the tokens (never the tokens themselves or their hashes), of a principal or tenant, or all',
  options: {
    principal: { type: 'string', value: 'P', description: "only this principal's tokens", default: 'every principal' },
    tenant: { type: 'string', value: 'T', description: 'only tokens acting in this tenant', default: 'every tenant' },
    json: JSON_OPTION,
  },
  examples: ['actionledger token list', 'actionledger token list --principal alice --json'],
  exits: PRINCIPAL_EXITS,
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const json = parsed.values.json === true;
    const v = stringValues(parsed.values);
    return withReadStore(json, async (store) => {
      const rows = await store.listTokens({
        ...(v.principal === undefined ? {} : { principal_id: v.principal }),
        ...(v.tenant === undefined ? {} : { tenant_id: v.tenant }),
      });
      if (json) printJson({ ok: true, tokens: rows });
      else {
        const head = ['token', 'principal', 'tenant', 'name', 'expires at', 'last used', 'state'];
        const state = (r: (typeof rows)[number]): string =>
          r.revoked_at !== null ? 'revoked' : r.active ? 'active' : 'expired';
        const lines = rows.map((r) => [
          r.token_id,
          r.principal_id,
          r.tenant_id,
          r.name,
          r.expires_at.toISOString(),
          r.last_used_at?.toISOString() ?? 'never',
          state(r),
        ]);
        process.stdout.write(`${table([head, ...lines])}\n`);
      }
      return EXIT.ok;
    });
  },
};

export const tokenCommand: Command = {
  name: 'token',
  summary: 'API tokens of principals: create (printed once), revoke, list (never their hashes) (audited)',
  notes: `A token acts for one principal in one tenant. Who acts here is the principal of the token in
ACTIONLEDGER_TOKEN (in its own tenant), or without a token the operator named by --break-glass NAME.`,
  options: {},
  examples: [...create.examples.slice(0, 1), ...revoke.examples, ...list.examples.slice(0, 1)],
  exits: PRINCIPAL_EXITS,
  subcommands: new Map([
    ['create', create],
    ['revoke', revoke],
    ['list', list],
  ]),
  run(argv) {
    return runSubcommand(this, argv);
  },
};
