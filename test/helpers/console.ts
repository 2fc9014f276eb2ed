/**
 * The operator console in a real browser: the gate behind a real dispatcher and the sandbox provider (mTLS),
 * the HTTP API with the console on loopback, people made through the real principal store, sign-in links made
 * as the CLI makes them, and Debian's chromium driven by playwright-core.
 */
import type { Test } from 'tap';
import { chromium, type Browser, type Page } from 'playwright-core';
import { Compensator } from '../../compensator/index.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { AuditWriter, AuthorizationService } from '../../gate/index.js';
import { ConsoleSessions, PrincipalStore } from '../../principals/index.js';
import { Review } from '../../reconciler/index.js';
import { buildApi } from '../../server/api/app.js';
import type { ApiDeps } from '../../server/api/types.js';
import { API_PERMISSIONS } from './api.js';
import { settled } from './fleet.js';
import { GATE_RESOLVERS, gateFixture, gateRoutes, type GateFixture } from './gate.js';
import { predispatchEnv, type PredispatchEnv } from './predispatch-env.js';

export interface ConsoleEnv {
  e: PredispatchEnv;
  g: GateFixture;
  base: string;
  store: PrincipalStore;
  sessions: ConsoleSessions;
  browser: Browser;
  /** Adds a person with these roles in tenant-a. */
  person(id: string, roles: string[]): Promise<void>;
  /**
   * A new browser context signed in as the person through a one-time link, then at `path` (the pending
   * approvals unless named; null: where the sign-in leads).
   */
  signIn(id: string, path?: string | null, viewport?: { width: number; height: number }): Promise<Page>;
  /** Runs a dispatcher until the operation settles. */
  dispatch(operationId: string): Promise<Awaited<ReturnType<typeof settled>>>;
}

export async function consoleEnv(t: Test, gate: Record<string, unknown> = {}): Promise<ConsoleEnv> {
  const e = await predispatchEnv(t);
  const g = await gateFixture(t, {
    url: e.url,
    pool: e.pool,
    endpoint: e.provider.endpoint,
    gate,
    extra: { api: { permissions: API_PERMISSIONS } },
  });
  const service = new AuthorizationService({
    config: g.config,
    pool: e.pool,
    resolvers: GATE_RESOLVERS,
    tls: { ...e.pki.server, ca: e.pki.ca.cert },
  });
  t.teardown(() => service.stop());
  await service.start();
  const log = createLogger({ level: 'error', name: 'console-test', destination: process.stderr });
  const metrics = new Metrics({ defaultMetrics: false });
  const audit = new AuditWriter({ config: g.config, pool: g.pool, log, metrics });
  const store = new PrincipalStore(g.config, g.pool, audit);
  const deps: ApiDeps = {
    // An error answer a route does not declare goes out as a 500 naming it (server/api/route-errors.ts).
    declaredErrors: 'enforce',
    config: g.config,
    pool: g.pool,
    log,
    gate: g.gate,
    ledger: g.ledger,
    principals: store,
    audit,
    metrics,
    review: new Review(
      g.config,
      g.pool,
      new Compensator({ config: g.config, pool: g.pool, ledger: g.ledger, log, actor: 'console-test' }),
    ),
  };
  const api = await buildApi(deps);
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => api.app.close());
  const address = api.app.server.address();
  if (address === null || typeof address === 'string') throw new Error('no address');
  const base = `http://127.0.0.1:${address.port}`;
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
  t.teardown(() => browser.close());
  const sessions = new ConsoleSessions(g.config, g.pool, audit);
  return {
    e,
    g,
    base,
    store,
    sessions,
    browser,
    async person(id, roles) {
      await store.add(id, 'person', id, 'test');
      for (const r of roles) await store.grant(id, 'tenant-a', r, 'test');
    },
    async signIn(id, path = '/console/approvals', viewport = { width: 1100, height: 900 }) {
      const link = await sessions.createLoginLink(id, 'test');
      const context = await browser.newContext({ viewport });
      const p = await context.newPage();
      await p.goto(`${base}/console/login?link=${link.secret}`);
      await p.click('button[type=submit]');
      await p.waitForURL((u) => !u.pathname.startsWith('/console/login') && u.pathname !== '/console/');
      if (path !== null) await p.goto(`${base}${path}`);
      return p;
    },
    async dispatch(operationId) {
      const d = await e.open({ tools: gateRoutes(e.provider.endpoint), authorizationUrl: service.authorizeUrl });
      try {
        return await settled(e.pool, operationId);
      } finally {
        await d.stop();
      }
    },
  };
}
