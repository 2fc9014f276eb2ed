/**
 * Console sign-in through an OpenID Connect provider (`api.console.oidc`): where the provider is, who this
 * service is to it, and the per-tenant mapping from the provider's claims (its subject, its groups) to a
 * principal and roles. The mapping is read again on every console request (principals/console-sessions.ts), so
 * what it says now, not what it said at sign-in, is what a session may do.
 */
import { ConfigProblems, pointer } from '../core/config-problems.js';
import { identifierProblem } from '../core/identifier.js';

const envName = { type: 'string', pattern: '^[A-Z_][A-Z0-9_]*$' } as const;
const name = { type: 'string', minLength: 1, maxLength: 256 } as const;

/** The `api.console.oidc` schema. */
export const consoleOidcSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['issuer', 'client_id', 'redirect_url', 'tenants'],
  properties: {
    /** The button says "Sign in with" this. */
    display_name: { type: 'string', minLength: 1, maxLength: 64, default: 'single sign-on' },
    /** The issuer's URL; its discovery document is read at `<issuer>/.well-known/openid-configuration`. */
    issuer: { type: 'string', minLength: 1 },
    client_id: { type: 'string', minLength: 1 },
    /** Where the client secret is read at start (exactly one of the two; never from the file itself). */
    client_secret_env: envName,
    client_secret_file: { type: 'string', minLength: 1 },
    /** This console's `/console/oidc/callback` as the provider knows it. */
    redirect_url: { type: 'string', minLength: 1 },
    scopes: {
      type: 'array',
      items: { type: 'string', pattern: '^[\\x21\\x23-\\x5B\\x5D-\\x7E]+$' },
      uniqueItems: true,
      minItems: 1,
      default: ['openid', 'email', 'profile'],
    },
    /** The claim whose value is the principal id of a person matched by group (not by a subject rule). */
    principal_claim: { type: 'string', minLength: 1, default: 'sub' },
    /** The claim that lists the person's groups (a string counts as a list of one). */
    groups_claim: { type: 'string', minLength: 1, default: 'groups' },
    /** Tenant -> its rules; a person holds in a tenant the roles of every rule that matches them there. */
    tenants: {
      type: 'object',
      minProperties: 1,
      additionalProperties: {
        type: 'array',
        minItems: 1,
        items: {
          type: 'object',
          additionalProperties: false,
          required: ['roles'],
          properties: {
            subject: name,
            group: name,
            /** With `subject`: the principal that subject signs in as (else `principal_claim`'s value). */
            principal: name,
            roles: { type: 'array', minItems: 1, uniqueItems: true, items: name },
          },
        },
      },
    },
  },
} as const;

export interface RawConsoleOidc {
  display_name: string;
  issuer: string;
  client_id: string;
  client_secret_env?: string;
  client_secret_file?: string;
  redirect_url: string;
  scopes: string[];
  principal_claim: string;
  groups_claim: string;
  tenants: Record<string, { subject?: string; group?: string; principal?: string; roles: string[] }[]>;
}

export interface OidcRule {
  readonly subject: string | null;
  readonly group: string | null;
  readonly principal: string | null;
  readonly roles: readonly string[];
}

export interface ConsoleOidcConfig {
  readonly displayName: string;
  readonly issuer: string;
  readonly clientId: string;
  /** Exactly one is set: where the client secret is read at start. */
  readonly clientSecretEnv: string | null;
  readonly clientSecretFile: string | null;
  readonly redirectUrl: string;
  readonly scopes: readonly string[];
  readonly principalClaim: string;
  readonly groupsClaim: string;
  readonly tenants: ReadonlyMap<string, readonly OidcRule[]>;
}

/** What a session keeps of the provider's claims: enough to apply the mapping again on every request. */
export interface OidcClaims {
  subject: string;
  groups: readonly string[];
}

const AT = '/api/console/oidc';

/** The loopback hosts of config/api.ts `isLoopback` (not imported: api.ts imports this file's schema). */
const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost)$/;

/** http(s) URL problems: https, or http to a loopback host (a provider on the same machine, in development). */
function urlProblem(value: string): string | null {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return 'must be an absolute URL';
  }
  if (url.protocol === 'https:') return null;
  if (url.protocol === 'http:' && LOOPBACK.test(url.hostname.replace(/^\[|\]$/g, ''))) return null;
  return 'must be an https URL (http only to a loopback host)';
}

/** The checks the schema cannot make; each problem names its path. Skips a part the schema found malformed. */
export function consoleOidcProblems(raw: RawConsoleOidc | undefined, problems: ConfigProblems): void {
  if (raw === undefined || problems.malformed(AT)) return;
  for (const key of ['issuer', 'redirect_url'] as const) {
    const problem = urlProblem(raw[key]);
    if (problem !== null) problems.add(`${AT}/${key}`, problem, { got: raw[key] });
  }
  if (urlProblem(raw.redirect_url) === null && new URL(raw.redirect_url).pathname !== '/console/oidc/callback')
    problems.add(`${AT}/redirect_url`, 'must end in /console/oidc/callback (the console’s callback)', {
      got: raw.redirect_url,
    });
  if ((raw.client_secret_env === undefined) === (raw.client_secret_file === undefined))
    problems.add(`${AT}/client_secret_env`, 'set exactly one of client_secret_env and client_secret_file');
  if (!raw.scopes.includes('openid')) problems.add(`${AT}/scopes`, 'must include openid');
  const principalOf = new Map<string, string>();
  for (const [tenant, rules] of Object.entries(raw.tenants)) {
    const tenantProblem = identifierProblem(tenant);
    if (tenantProblem !== null) problems.add(`${AT}/tenants${pointer(tenant)}`, `tenant id ${tenantProblem}`);
    rules.forEach((rule, i) => {
      const at = `${AT}/tenants${pointer(tenant, i)}`;
      if ((rule.subject === undefined) === (rule.group === undefined))
        problems.add(at, 'set exactly one of subject and group');
      if (rule.principal !== undefined && rule.subject === undefined)
        problems.add(`${at}/principal`, 'only a subject rule names a principal (a group holds many people)');
      for (const [field, value] of [['principal', rule.principal], ...rule.roles.map((r) => ['roles', r])] as const) {
        const problem = value === undefined ? null : identifierProblem(value);
        if (problem !== null) problems.add(`${at}/${field}`, `${field === 'roles' ? 'a role' : field} ${problem}`);
      }
      if (rule.subject !== undefined && rule.principal !== undefined) {
        const before = principalOf.get(rule.subject);
        if (before !== undefined && before !== rule.principal)
          problems.add(
            `${at}/principal`,
            `subject ${rule.subject} is mapped to ${before} elsewhere: one person, one principal`,
          );
        principalOf.set(rule.subject, rule.principal);
      }
    });
  }
}

export function compileConsoleOidc(raw: RawConsoleOidc | undefined): ConsoleOidcConfig | null {
  if (raw === undefined) return null;
  const tenants = new Map<string, readonly OidcRule[]>();
  for (const [tenant, rules] of Object.entries(raw.tenants))
    tenants.set(
      tenant.normalize('NFC'),
      Object.freeze(
        rules.map((r) =>
          Object.freeze({
            subject: r.subject ?? null,
            group: r.group ?? null,
            principal: r.principal?.normalize('NFC') ?? null,
            roles: Object.freeze(r.roles.map((x) => x.normalize('NFC'))),
          }),
        ),
      ),
    );
  return Object.freeze({
    displayName: raw.display_name,
    issuer: raw.issuer,
    clientId: raw.client_id,
    clientSecretEnv: raw.client_secret_env ?? null,
    clientSecretFile: raw.client_secret_file ?? null,
    redirectUrl: raw.redirect_url,
    scopes: Object.freeze([...raw.scopes]),
    principalClaim: raw.principal_claim,
    groupsClaim: raw.groups_claim,
    tenants,
  });
}

export interface OidcMapping {
  /** The principal a subject rule names for this person, or null (then `principal_claim`'s value is used). */
  principal: string | null;
  /** Tenant -> the roles the mapping gives these claims there, in order; tenants with none left out. */
  grants: Map<string, string[]>;
}

/** What the mapping gives these claims now. With no `api.console.oidc`, nothing. */
export function oidcMapping(oidc: ConsoleOidcConfig | null, claims: OidcClaims): OidcMapping {
  const grants = new Map<string, string[]>();
  let principal: string | null = null;
  for (const [tenant, rules] of oidc?.tenants ?? []) {
    const roles = new Set<string>();
    for (const rule of rules) {
      const matches =
        (rule.subject !== null && rule.subject === claims.subject) ||
        (rule.group !== null && claims.groups.includes(rule.group));
      if (!matches) continue;
      if (rule.principal !== null) principal = rule.principal;
      for (const r of rule.roles) roles.add(r);
    }
    if (roles.size > 0) grants.set(tenant, [...roles].sort());
  }
  return { principal, grants: new Map([...grants].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) };
}
