/**
 * The HTTP API's configuration: the listener's TLS and bind policy (`http`), and who may do what beyond the
 * gate's own role tables (`api`). Every capability is denied unless a role is listed for it.
 */
import { resolve } from 'node:path';
import type { ConfigProblems } from '../core/config-problems.js';
import { compileConsoleOidc, consoleOidcSchema, type ConsoleOidcConfig, type RawConsoleOidc } from './console-oidc.js';

/** What a principal's role may do through the API, apart from gate calls and approvals (the tools' roles decide those). */
export const API_CAPABILITIES = ['reserve', 'act_for_users', 'read', 'review', 'kill_switch', 'audit'] as const;
export type ApiCapability = (typeof API_CAPABILITIES)[number];

const roleList = {
  type: 'array',
  items: { type: 'string', minLength: 1, maxLength: 128 },
  uniqueItems: true,
  default: [],
} as const;

/** `http.write_probe_interval_ms` when not set. */
const DEFAULT_WRITE_PROBE_INTERVAL_MS = 5000;

/** The `http` section's schema. */
export const httpSchema = {
  type: 'object',
  additionalProperties: false,
  default: {},
  properties: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'integer', minimum: 0, maximum: 65535, default: 7420 },
    /** Serve HTTPS; with `client_ca_file`, client certificates mapped to principals are accepted too. */
    tls: {
      type: 'object',
      additionalProperties: false,
      required: ['cert_file', 'key_file'],
      properties: {
        cert_file: { type: 'string', minLength: 1 },
        key_file: { type: 'string', minLength: 1 },
        client_ca_file: { type: 'string', minLength: 1 },
      },
    },
    /** Binding an address other than loopback without TLS is refused unless this is true. */
    allow_plaintext_bind: { type: 'boolean', default: false },
    /**
     * How often the serving process tries a write (server/write-probe.ts) to learn whether the database takes
     * writes: `/readyz` recovers from a full disk or a read-only server within about this long.
     */
    write_probe_interval_ms: {
      type: 'integer',
      minimum: 100,
      maximum: 300_000,
      default: DEFAULT_WRITE_PROBE_INTERVAL_MS,
    },
  },
} as const;

/** The `api` section's schema. */
export const apiSchema = {
  type: 'object',
  additionalProperties: false,
  default: {},
  properties: {
    permissions: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        reserve: roleList,
        act_for_users: roleList,
        read: roleList,
        review: roleList,
        kill_switch: roleList,
        audit: roleList,
      },
    },
    /** Requests per principal and tenant in each window, across the whole fleet. */
    rate_limit: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        requests: { type: 'integer', minimum: 1, maximum: 10000000, default: 6000 },
        window_s: { type: 'integer', minimum: 1, maximum: 86400, default: 60 },
      },
    },
    max_body_bytes: { type: 'integer', minimum: 256, maximum: 16777216, default: 262144 },
    /** The longest life `token create` grants, and its default. */
    token_max_ttl_days: { type: 'integer', minimum: 1, maximum: 3650, default: 365 },
    /** The operator console under /console (server/console/). */
    console: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        session_ttl_s: { type: 'integer', minimum: 60, maximum: 604800, default: 28800 },
        login_link_ttl_s: { type: 'integer', minimum: 30, maximum: 86400, default: 900 },
        /** Sign-in by a header an authenticating proxy sets, believed only from these peer addresses. */
        trusted_header: {
          type: 'object',
          additionalProperties: false,
          required: ['name', 'proxies'],
          properties: {
            name: { type: 'string', pattern: '^[A-Za-z0-9-]{1,64}$' },
            proxies: { type: 'array', minItems: 1, uniqueItems: true, items: { type: 'string', minLength: 1 } },
          },
        },
        /** Sign-in through an OpenID Connect provider, its claims mapped to principals and roles per tenant. */
        oidc: consoleOidcSchema,
      },
    },
  },
} as const;

export interface HttpConfig {
  readonly host: string;
  readonly port: number;
  readonly tls: { readonly certFile: string; readonly keyFile: string; readonly clientCaFile: string | null } | null;
  readonly allowPlaintextBind: boolean;
  readonly writeProbeIntervalMs: number;
}

export interface ApiConfig {
  /** The roles granted each capability. */
  readonly permissions: Readonly<Record<ApiCapability, ReadonlySet<string>>>;
  readonly rateLimit: { readonly requests: number; readonly windowS: number };
  readonly maxBodyBytes: number;
  readonly tokenMaxTtlDays: number;
  readonly console: ConsoleConfig;
}

export interface ConsoleConfig {
  readonly sessionTtlS: number;
  readonly loginLinkTtlS: number;
  /** The proxy's header (lower case) and the peer addresses it is believed from; null: the mode is off. */
  readonly trustedHeader: { readonly name: string; readonly proxies: ReadonlySet<string> } | null;
  /** Single sign-on through an OpenID Connect provider (config/console-oidc.ts); null: off. */
  readonly oidc: ConsoleOidcConfig | null;
}

interface RawHttp {
  host: string;
  port: number;
  tls?: { cert_file: string; key_file: string; client_ca_file?: string };
  allow_plaintext_bind: boolean;
  write_probe_interval_ms: number;
}

interface RawApi {
  permissions: Partial<Record<ApiCapability, string[]>>;
  rate_limit: { requests: number; window_s: number };
  max_body_bytes: number;
  token_max_ttl_days: number;
  console: {
    session_ttl_s: number;
    login_link_ttl_s: number;
    trusted_header?: { name: string; proxies: string[] };
    oidc?: RawConsoleOidc;
  };
}

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost)$/;

/** Whether the host names only this machine. */
export function isLoopback(host: string): boolean {
  return LOOPBACK.test(host);
}

/** The listener's settings; a non-loopback bind without TLS (and not explicitly allowed) is a problem. */
export function compileHttp(raw: RawHttp, port: number, cwd: string, problems: ConfigProblems): HttpConfig {
  // A malformed section is reported by the schema step; the loopback default stands in for the rest of the pass.
  if (problems.malformed('/http') || raw === null || typeof raw !== 'object')
    return Object.freeze({
      host: '127.0.0.1',
      port,
      tls: null,
      allowPlaintextBind: false,
      writeProbeIntervalMs: DEFAULT_WRITE_PROBE_INTERVAL_MS,
    });
  const tls =
    raw.tls === undefined
      ? null
      : Object.freeze({
          certFile: resolve(cwd, raw.tls.cert_file),
          keyFile: resolve(cwd, raw.tls.key_file),
          clientCaFile: raw.tls.client_ca_file === undefined ? null : resolve(cwd, raw.tls.client_ca_file),
        });
  if (!problems.malformed('/http/host') && !isLoopback(raw.host) && tls === null && raw.allow_plaintext_bind !== true)
    problems.add(
      '/http/host',
      `binds ${JSON.stringify(raw.host)}, which is not loopback, without TLS: set /http/tls (cert_file, key_file), or /http/allow_plaintext_bind to true behind a TLS-terminating proxy`,
    );
  return Object.freeze({
    host: raw.host,
    port,
    tls,
    allowPlaintextBind: raw.allow_plaintext_bind === true,
    writeProbeIntervalMs: raw.write_probe_interval_ms,
  });
}

export function compileApi(raw: RawApi): ApiConfig {
  const permissions = Object.fromEntries(
    API_CAPABILITIES.map((c) => [c, Object.freeze(new Set(raw.permissions[c] ?? []))]),
  ) as unknown as Record<ApiCapability, ReadonlySet<string>>;
  return Object.freeze({
    permissions: Object.freeze(permissions),
    rateLimit: Object.freeze({ requests: raw.rate_limit.requests, windowS: raw.rate_limit.window_s }),
    maxBodyBytes: raw.max_body_bytes,
    tokenMaxTtlDays: raw.token_max_ttl_days,
    console: compileConsole(raw.console),
  });
}

/** Proxy addresses as the socket reports them (an IPv4 peer of a dual-stack listener is ::ffff:a.b.c.d). */
function compileConsole(raw: RawApi['console']): ConsoleConfig {
  const header = raw.trusted_header;
  const proxies = new Set<string>();
  for (const p of header?.proxies ?? []) {
    proxies.add(p);
    if (/^\d+\.\d+\.\d+\.\d+$/.test(p)) proxies.add(`::ffff:${p}`);
  }
  return Object.freeze({
    sessionTtlS: raw.session_ttl_s,
    loginLinkTtlS: raw.login_link_ttl_s,
    trustedHeader:
      header === undefined ? null : Object.freeze({ name: header.name.toLowerCase(), proxies: Object.freeze(proxies) }),
    oidc: compileConsoleOidc(raw.oidc),
  });
}
