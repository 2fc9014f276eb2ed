/**
 * The HTTP API on loopback over a fresh database (the gate fixture's tools, validators and resolvers), with
 * principals and tokens made through the real store, and a small fetch wrapper that keeps status, headers
 * and the parsed body.
 */
import type { Test } from 'tap';
import { Compensator } from '../../compensator/index.js';
import { AuditWriter } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { PrincipalStore, type PrincipalKind } from '../../principals/index.js';
import { Review } from '../../reconciler/index.js';
import { buildApi, type Api } from '../../server/api/app.js';
import type { UndeclaredError } from '../../server/api/route-errors.js';
import type { ApiDeps } from '../../server/api/types.js';
import { gateFixture, type GateFixture } from './gate.js';

/** The API section every API test starts from: each capability granted one role of the same name. */
export const API_PERMISSIONS = {
  reserve: ['service'],
  act_for_users: ['agent-runtime'],
  read: ['operator', 'auditor', 'supervisor'],
  review: ['operator'],
  kill_switch: ['operator'],
  audit: ['auditor', 'operator'],
};

export interface ApiFixture extends GateFixture {
  api: Api;
  deps: ApiDeps;
  base: string;
  store: PrincipalStore;
  /** Adds the principal (once) with these roles in the tenant and returns a new token for it there. */
  token(
    principal: string,
    roles: string[],
    options?: { tenant?: string; kind?: PrincipalKind; ttlDays?: number },
  ): Promise<string>;
  /**
   * The error answers a route gave that it does not declare (server/api/route-errors.ts). The fixture's app
   * enforces the declarations: such an answer goes out as a 500 `internal` naming it, so the test that met it
   * fails; this list says which it was.
   */
  undeclared: UndeclaredError[];
  /** A request with a bearer token (or none) and a JSON body (or raw text). */
  call(method: string, path: string, options?: CallOptions): Promise<ApiResponse>;
}

export interface CallOptions {
  token?: string | undefined;
  body?: unknown;
  raw?: string | Buffer;
  headers?: Record<string, string>;
}

export interface ApiResponse {
  status: number;
  headers: Headers;
  body: Record<string, unknown>;
  text: string;
}

export async function apiFixture(
  t: Test,
  options: Parameters<typeof gateFixture>[1] & { api?: Record<string, unknown> } = {},
): Promise<ApiFixture> {
  const { api: apiSection, ...gateOptions } = options;
  const fixture = await gateFixture(t, {
    ...gateOptions,
    extra: { api: { permissions: API_PERMISSIONS, ...apiSection }, ...gateOptions.extra },
  });
  const log = createLogger({ level: 'error', name: 'api-test', destination: process.stderr });
  const metrics = new Metrics({ defaultMetrics: false });
  const audit = new AuditWriter({ config: fixture.config, pool: fixture.pool, log, metrics });
  const store = new PrincipalStore(fixture.config, fixture.pool, audit);
  const undeclared: UndeclaredError[] = [];
  const deps: ApiDeps = {
    declaredErrors: 'enforce',
    onUndeclaredError: (u) => undeclared.push(u),
    config: fixture.config,
    pool: fixture.pool,
    log,
    gate: fixture.gate,
    ledger: fixture.ledger,
    principals: store,
    audit,
    metrics,
    review: new Review(
      fixture.config,
      fixture.pool,
      new Compensator({ config: fixture.config, pool: fixture.pool, ledger: fixture.ledger, log, actor: 'api-test' }),
    ),
  };
  const api = await buildApi(deps);
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => api.app.close());
  const address = api.app.server.address();
  if (address === null || typeof address === 'string') throw new Error('no address');
  const base = `http://127.0.0.1:${address.port}`;
  const added = new Set<string>();
  return {
    ...fixture,
    api,
    deps,
    base,
    store,
    undeclared,
    async token(principal, roles, o = {}) {
      const tenant = o.tenant ?? 'tenant-a';
      if (!added.has(principal)) {
        await store.add(principal, o.kind ?? 'service', principal, 'test');
        added.add(principal);
      }
      for (const role of roles) await store.grant(principal, tenant, role, 'test');
      return (await store.createToken(principal, tenant, 'test', o.ttlDays ?? 1, 'test')).token;
    },
    call: (method, path, o = {}) => request(base, method, path, o),
  };
}

export async function request(base: string, method: string, path: string, o: CallOptions = {}): Promise<ApiResponse> {
  const headers: Record<string, string> = { ...o.headers };
  if (o.token !== undefined) headers.authorization = `Bearer ${o.token}`;
  let body: string | Buffer | undefined;
  if (o.raw !== undefined) body = o.raw;
  else if (o.body !== undefined) {
    body = JSON.stringify(o.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await fetch(`${base}${path}`, { method, headers, ...(body === undefined ? {} : { body }) });
  const text = await res.text();
  let parsed: Record<string, unknown> = {};
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    // not JSON (metrics): the text is kept
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}
