/**
 * Console single sign-on through OpenID Connect, end to end: a real provider (`oidc-provider`, on loopback),
 * the console on a real database, and Debian's chromium going through the provider's login and consent pages.
 * A mapped person gets the roles of the rules that match them (and sees what those roles allow), an unmapped
 * one gets no session, a revoked role or a role taken out of the mapping is gone at the next request, a
 * tampered state, state cookie or nonce is refused, and the new routes keep the console's CSRF and CSP rules.
 */
import { createHmac } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { Compensator } from '../../compensator/index.js';
import type { Config } from '../../config/index.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { AuditWriter } from '../../gate/index.js';
import { ConsoleSessions, PrincipalStore } from '../../principals/index.js';
import { Review } from '../../reconciler/index.js';
import { buildApi } from '../../server/api/app.js';
import { CSP } from '../../server/console/layout.js';
import { API_PERMISSIONS } from '../helpers/api.js';
import { auditRows, gateConfig, gateFixture, type GateFixture } from '../helpers/gate.js';
import { freePort } from '../helpers/net.js';
import { CLIENT_ID, CLIENT_SECRET, oidcProvider, providerLogin, type TestIdp } from '../helpers/oidc-provider.js';

/** alice by her subject (principal `alice`, operator); anyone in the `auditors` group (principal: their sub). */
const MAPPING = {
  'tenant-a': [
    { subject: 'alice-sub', principal: 'alice', roles: ['operator'] },
    { group: 'auditors', roles: ['auditor'] },
  ],
};

/**
 * For the console whose principal claim is `email`: anyone in `staff` (principal: their verified email), and
 * `gina-sub` as the existing, operator-added principal `gina` (a subject rule naming it).
 */
const EMAIL_MAPPING = {
  'tenant-a': [
    { group: 'staff', roles: ['auditor'] },
    { subject: 'gina-sub', principal: 'gina', roles: ['auditor'] },
  ],
};

interface Env {
  g: GateFixture;
  /** A console whose principal claim is `email` (EMAIL_MAPPING), on the same provider and database. */
  emailBase: string;
  idp: TestIdp;
  base: string;
  browser: Browser;
  store: PrincipalStore;
  /** The console's configuration with another mapping (the same provider and database). */
  configWith(tenants: Record<string, unknown>, over?: Record<string, unknown>): Config;
  /** Serves the console with this configuration on a port of its own; its base URL. */
  serve(config: Config, port?: number, secrets?: NodeJS.ProcessEnv): Promise<string>;
  /**
   * A console whose redirect URL is a catcher's, not its own: the provider sends the browser there, and the
   * catcher only records the URL (so a test can bring the provider's answer to the console changed or not).
   */
  caught: { base: string; redirect: string; last: () => string | undefined };
}

async function oidcEnv(t: Test): Promise<Env> {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let last: string | undefined;
  const catcher = createServer((req, res) => {
    // Only the provider's answer: the browser asks for /favicon.ico besides.
    if (req.url?.startsWith('/console/oidc/callback?') === true) last = req.url;
    res.end('caught');
  });
  await new Promise<void>((resolve) => catcher.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => catcher.close(() => resolve())));
  const catcherUrl = `http://127.0.0.1:${(catcher.address() as AddressInfo).port}/console/oidc/callback`;
  const emailPort = await freePort();
  const emailBase = `http://127.0.0.1:${emailPort}`;
  const idp = await oidcProvider(t, [
    `${base}/console/oidc/callback`,
    catcherUrl,
    `${emailBase}/console/oidc/callback`,
  ]);
  const secretFile = join(mkdtempSync(join(tmpdir(), 'al-oidc-')), 'client-secret');
  writeFileSync(secretFile, `${CLIENT_SECRET}\n`);
  const extra = (
    tenants: Record<string, unknown>,
    redirect = `${base}/console/oidc/callback`,
    over: Record<string, unknown> = {},
  ) => ({
    api: {
      permissions: API_PERMISSIONS,
      console: {
        oidc: {
          display_name: 'Test IdP',
          issuer: idp.issuer,
          client_id: CLIENT_ID,
          ...(over.client_secret_env === undefined ? { client_secret_file: secretFile } : {}),
          redirect_url: redirect,
          scopes: ['openid', 'email', 'profile', 'groups'],
          tenants,
          ...over,
        },
      },
    },
  });
  const g = await gateFixture(t, { extra: extra(MAPPING) });
  const log = createLogger({ level: 'error', name: 'console-oidc-test', destination: process.stderr });
  const metrics = new Metrics({ defaultMetrics: false });
  const audit = new AuditWriter({ config: g.config, pool: g.pool, log, metrics });
  const store = new PrincipalStore(g.config, g.pool, audit);
  const serve = async (config: Config, at?: number, secrets?: NodeJS.ProcessEnv): Promise<string> => {
    const api = await buildApi({
      ...(secrets === undefined ? {} : { env: secrets }),
      declaredErrors: 'enforce',
      config,
      pool: g.pool,
      log,
      gate: g.gate,
      ledger: g.ledger,
      principals: store,
      audit,
      metrics,
      review: new Review(
        config,
        g.pool,
        new Compensator({ config, pool: g.pool, ledger: g.ledger, log, actor: 'console-oidc-test' }),
      ),
    });
    const listenOn = at ?? (await freePort());
    await api.app.listen({ host: '127.0.0.1', port: listenOn });
    t.teardown(() => api.app.close());
    return `http://127.0.0.1:${listenOn}`;
  };
  await serve(g.config, port);
  await serve(
    gateConfig(g.url, {
      extra: extra(EMAIL_MAPPING, `${emailBase}/console/oidc/callback`, { principal_claim: 'email' }),
    }),
    emailPort,
  );
  const caughtBase = await serve(gateConfig(g.url, { extra: extra(MAPPING, catcherUrl) }));
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
  t.teardown(() => browser.close());
  return {
    g,
    emailBase,
    idp,
    base,
    browser,
    store,
    configWith: (tenants, over) => gateConfig(g.url, { extra: extra(tenants, undefined, over) }),
    serve,
    caught: { base: caughtBase, redirect: catcherUrl, last: () => last },
  };
}

/** A fresh browser that goes from the sign-in page's button to the provider and signs in there as `login`. */
async function startSignIn(env: Env, login: string, base = env.base): Promise<{ context: BrowserContext; page: Page }> {
  const context = await env.browser.newContext();
  const page = await context.newPage();
  await page.goto(`${base}/console/login`);
  await page.click('#oidc-sign-in');
  await providerLogin(page, login);
  return { context, page };
}

/** Signs in through the provider as `login` and waits for the console's landing page, signed in. */
async function signIn(env: Env, login: string, base = env.base): Promise<{ context: BrowserContext; page: Page }> {
  const s = await startSignIn(env, login, base);
  await s.page.waitForURL((u) => u.origin === base && !u.pathname.startsWith('/console/oidc/'));
  await s.page.waitForSelector('.who');
  return s;
}

/** The console session cookie of a browser, as a Cookie header. */
async function sessionCookie(context: BrowserContext): Promise<string> {
  const c = (await context.cookies()).find((x) => x.name === 'al_console');
  return c === undefined ? '' : `al_console=${c.value}`;
}

async function get(base: string, path: string, cookie: string): Promise<Response> {
  return fetch(`${base}${path}`, { headers: { cookie }, redirect: 'manual' });
}

/**
 * Goes through the provider as `login` from the console whose redirect URL is the catcher's: the provider's
 * answer (the callback URL, on the catching console), and the state cookie the console set at the start.
 */
async function stopAtCallback(env: Env, login: string): Promise<{ url: URL; state: string }> {
  const context = await env.browser.newContext();
  const page = await context.newPage();
  await page.goto(`${env.caught.base}/console/login`);
  await page.click('#oidc-sign-in');
  await providerLogin(page, login);
  await page.getByText('caught', { exact: true }).waitFor();
  const url = new URL(env.caught.last() ?? '', env.caught.base);
  const state = (await context.cookies()).find((c) => c.name === 'al_oidc')?.value ?? '';
  await context.close();
  return { url, state };
}

function callbackWith(url: URL, state: string, change: (q: URLSearchParams) => void = () => undefined) {
  const u = new URL(url);
  change(u.searchParams);
  return fetch(u, { headers: { cookie: `al_oidc=${state}` }, redirect: 'manual' });
}

/**
 * Re-signs a state cookie's payload as the console whose redirect URL is `redirect` would (the key is derived
 * from the client secret and the redirect URL).
 */
function resigned(cookie: string, redirect: string, change: (p: Record<string, unknown>) => void): string {
  const p = JSON.parse(Buffer.from(cookie.split('.')[0] ?? '', 'base64url').toString('utf8')) as Record<
    string,
    unknown
  >;
  change(p);
  const body = Buffer.from(JSON.stringify(p), 'utf8').toString('base64url');
  const key = createHmac('sha256', CLIENT_SECRET).update(`actionledger-console-oidc-state\n${redirect}`).digest();
  return `${body}.${createHmac('sha256', key).update(body).digest('base64url')}`;
}

t.test('console single sign-on through a real OpenID Connect provider', async (t) => {
  const env = await oidcEnv(t);
  env.idp.accounts.set('alice-sub', { name: 'Alice Example', groups: [] });
  env.idp.accounts.set('bob', { name: 'Bob', groups: ['auditors', 'unrelated'] });
  env.idp.accounts.set('mallory', { name: 'Mallory', groups: ['contractors'] });

  await t.test('the sign-in page offers the provider, under the console CSP', async (t) => {
    const res = await fetch(`${env.base}/console/login`);
    t.equal(res.headers.get('content-security-policy'), CSP);
    t.match(await res.text(), /id="oidc-sign-in" href="\/console\/oidc\/start">Sign in with Test IdP</);
  });

  await t.test('a person mapped by subject gets their role and sees the pages it allows', async (t) => {
    const { context, page } = await signIn(env, 'alice-sub');
    t.match(await page.textContent('.who'), /Signed in as\s+alice/);
    const cookie = await sessionCookie(context);
    t.equal((await get(env.base, '/console/review', cookie)).status, 200, 'operator: review');
    t.equal((await get(env.base, '/console/kill-switches', cookie)).status, 200, 'operator: kill switches');
    const signedIn = await auditRows(env.g.pool, `action = 'token' AND outcome = 'console_signed_in'`);
    t.match(signedIn.at(-1), { principal_id: 'alice', detail: { method: 'oidc', oidc_subject: 'alice-sub' } });
    const raw = (await context.cookies()).find((c) => c.name === 'al_console');
    t.match(raw, { httpOnly: true, sameSite: 'Strict', path: '/console' }, 'the usual session cookie');
    t.notOk(
      (await context.cookies()).some((c) => c.name === 'al_oidc'),
      'the state cookie is gone after the callback',
    );
    await context.close();
  });

  await t.test('a person mapped by group is added as a person and holds only that group’s role', async (t) => {
    const { context, page } = await signIn(env, 'bob');
    t.match(await page.textContent('.who'), /Signed in as\s+bob/);
    const cookie = await sessionCookie(context);
    t.equal((await get(env.base, '/console/audit', cookie)).status, 200, 'auditor: audit');
    const switches = await get(env.base, '/console/kill-switches', cookie);
    t.equal(switches.status, 403, 'auditor: no kill switches');
    t.match(await switches.text(), /permission_denied/);
    t.match(await env.store.list(), [{ principal_id: 'alice' }, { principal_id: 'bob', kind: 'person' }]);
    const added = await auditRows(env.g.pool, `action = 'principal' AND outcome = 'added'`);
    t.match(added, [
      { principal_id: 'alice', detail: { by: 'oidc' } },
      { principal_id: 'bob', detail: { by: 'oidc' } },
    ]);
    await context.close();
  });

  await t.test('an unmapped person is refused oidc_not_mapped and gets no session', async (t) => {
    const before = (await env.store.list()).length;
    const { context, page } = await startSignIn(env, 'mallory');
    await page.waitForSelector('.code');
    t.match(await page.textContent('main'), /oidc_not_mapped \(HTTP 403\)/);
    t.equal(await sessionCookie(context), '', 'no session cookie');
    const after = await get(env.base, '/console/approvals', await sessionCookie(context));
    t.equal(after.status, 401);
    t.match(await after.text(), /Sign in with Test IdP/, 'the signed-out page offers the provider too');
    t.equal((await env.store.list()).length, before, 'no principal was added for them');
    await context.close();
  });

  await t.test('a revoked role is gone at the next request, and at the next sign-in', async (t) => {
    const { context } = await signIn(env, 'alice-sub');
    const cookie = await sessionCookie(context);
    t.equal((await get(env.base, '/console/review', cookie)).status, 200);
    await env.store.revoke('alice', 'tenant-a', 'operator', 'test');
    const next = await get(env.base, '/console/review', cookie);
    t.equal(next.status, 401, 'signed out at the next request');
    t.match(await next.text(), /revoked/);
    await context.close();
    const again = await startSignIn(env, 'alice-sub');
    await again.page.waitForSelector('.code');
    t.match(await again.page.textContent('main'), /oidc_not_mapped/, 'the mapping cannot give a revoked role back');
    t.equal(await sessionCookie(again.context), '');
    await again.context.close();
    await env.store.grant('alice', 'tenant-a', 'operator', 'test');
    const restored = await signIn(env, 'alice-sub');
    t.equal((await get(env.base, '/console/review', await sessionCookie(restored.context))).status, 200);
    await restored.context.close();
  });

  await t.test('a mapping changed in the configuration holds at the next request of a live session', async (t) => {
    const { context } = await signIn(env, 'bob');
    const cookie = await sessionCookie(context);
    t.equal((await get(env.base, '/console/audit', cookie)).status, 200, 'auditor by the first mapping');
    const supervisors = await env.serve(env.configWith({ 'tenant-a': [{ group: 'auditors', roles: ['supervisor'] }] }));
    t.equal((await get(supervisors, '/console/audit', cookie)).status, 403, 'the role the mapping took away');
    t.equal((await get(supervisors, '/console/operations', cookie)).status, 200, 'the role it gives now');
    const none = await env.serve(env.configWith({ 'tenant-a': [{ group: 'someone-else', roles: ['auditor'] }] }));
    const out = await get(none, '/console/operations', cookie);
    t.equal(out.status, 401, 'no rule left: signed out');
    t.match(await out.text(), /mapping gives you no role/);
    t.equal((await get(env.base, '/console/audit', cookie)).status, 401, 'and the session has ended');
    await context.close();
  });

  await t.test('a tampered state, state cookie or nonce is refused, and nobody is signed in', async (t) => {
    const first = await stopAtCallback(env, 'alice-sub');
    const tampered = await callbackWith(first.url, first.state, (q) => q.set('state', `${q.get('state')}x`));
    t.equal(tampered.status, 401);
    const body = await tampered.text();
    t.match(body, /oidc_sign_in_failed/);
    t.match(body, /does not belong to this browser’s sign-in/, 'refused for its state');
    t.equal(tampered.headers.get('content-security-policy'), CSP);
    t.notMatch(tampered.headers.get('set-cookie') ?? '', /al_console=[A-Za-z0-9_-]/, 'no session cookie');
    const noCookie = await fetch(first.url, { redirect: 'manual' });
    t.equal(noCookie.status, 401, 'without the state cookie (another browser)');
    const forged = first.state.replace(/^./, (c) => (c === 'e' ? 'f' : 'e'));
    const forgedAnswer = await callbackWith(first.url, forged);
    t.equal(forgedAnswer.status, 401, 'a state cookie changed without the key');
    t.match(await forgedAnswer.text(), /not made by this console/);
    // The untouched answer signs in: the refusals above were about what was changed.
    const otherConsole = new URL(first.url.pathname + first.url.search, env.base);
    const staging = await callbackWith(otherConsole, first.state);
    t.equal(staging.status, 401, 'a state cookie another console made with the same client secret');
    t.match(await staging.text(), /not made by this console/);
    const providerRefusal = await callbackWith(first.url, first.state, (q) => {
      q.set('error', 'access_denied');
      q.set('state', 'not-this-browsers-state');
    });
    t.equal(providerRefusal.status, 401);
    t.match(
      await providerRefusal.text(),
      /does not belong to this browser’s sign-in/,
      'an error answer for another state is refused for its state, before its error is read',
    );
    const genuine = await callbackWith(first.url, first.state);
    t.equal(genuine.status, 200);
    t.match(genuine.headers.get('set-cookie') ?? '', /al_console=[A-Za-z0-9_-]{43}; Path=\/console; HttpOnly/);

    const second = await stopAtCallback(env, 'alice-sub');
    const otherNonce = resigned(second.state, env.caught.redirect, (p) => (p.n = 'a-nonce-the-provider-never-saw'));
    const nonce = await callbackWith(second.url, otherNonce);
    t.equal(nonce.status, 401, 'an ID token for another nonce');
    t.match(await nonce.text(), /oidc_sign_in_failed.*OAUTH_JWT_CLAIM_COMPARISON_FAILED/s, 'refused for its nonce');
    t.notMatch(nonce.headers.get('set-cookie') ?? '', /al_console=[A-Za-z0-9_-]/);
    t.match(nonce.headers.get('set-cookie') ?? '', /al_oidc=; Path=\/console\/oidc;.*Max-Age=0/, 'state cleared');
  });

  await t.test(
    'behind a proxy ending TLS (an https redirect URL, a plain-HTTP listener) the state cookie is __Host- and Secure',
    async (t) => {
      const proxied = await env.serve(
        env.configWith(MAPPING, { redirect_url: 'https://console.example.test/console/oidc/callback' }),
      );
      const start = await fetch(`${proxied}/console/oidc/start`, { redirect: 'manual' });
      t.equal(start.status, 303);
      const set = start.headers.get('set-cookie') ?? '';
      t.match(set, /^__Host-al_oidc=[^;]+; Path=\/; Secure; HttpOnly; SameSite=Lax; Max-Age=600$/);
      const value = /^__Host-al_oidc=([^;]+)/.exec(set)?.[1] ?? '';
      const state = new URL(start.headers.get('location') ?? '').searchParams.get('state') ?? '';
      const answer = `${proxied}/console/oidc/callback?error=access_denied&state=${encodeURIComponent(state)}`;
      // A cookie planted under the plain name (from a sibling subdomain, or a plain-HTTP answer) is not read.
      const planted = await fetch(answer, { headers: { cookie: `al_oidc=${value}` }, redirect: 'manual' });
      t.equal(planted.status, 401);
      t.match(await planted.text(), /oidc_sign_in_failed.*no sign-in in progress/s, 'no sign-in in progress');
      t.match(planted.headers.get('set-cookie') ?? '', /^__Host-al_oidc=; Path=\/; Secure;.*Max-Age=0$/, 'cleared');
      // The same value under the __Host- name is this browser's sign-in (here, refused by the provider).
      const own = await fetch(answer, { headers: { cookie: `__Host-al_oidc=${value}` }, redirect: 'manual' });
      t.equal(own.status, 401);
      t.match(await own.text(), /the identity provider refused the sign-in/);
    },
  );

  await t.test('the client secret from the environment: read at start, its absence refuses start', async (t) => {
    const fromEnv = env.configWith(MAPPING, { client_secret_env: 'OIDC_TEST_CLIENT_SECRET' });
    await t.rejects(env.serve(fromEnv, undefined, {}), {
      code: 'secret_missing',
      message: /OIDC_TEST_CLIENT_SECRET is not set/,
    });
    const served = await env.serve(fromEnv, undefined, { OIDC_TEST_CLIENT_SECRET: CLIENT_SECRET });
    const start = await fetch(`${served}/console/oidc/start`, { redirect: 'manual' });
    t.equal(start.status, 303, 'starts a sign-in');
  });

  await t.test(
    'a provider that cannot be read is refused oidc_sign_in_failed at the start, with no state cookie',
    async (t) => {
      const nobody = `http://127.0.0.1:${await freePort()}`;
      const down = await env.serve(env.configWith(MAPPING, { issuer: nobody }));
      const res = await fetch(`${down}/console/oidc/start`, { redirect: 'manual' });
      t.equal(res.status, 401);
      t.match(await res.text(), /oidc_sign_in_failed.*could not be read/s);
      t.equal(res.headers.get('set-cookie'), null, 'no state cookie');
      const up = await fetch(`${env.base}/console/oidc/start`, { redirect: 'manual' });
      t.equal(up.status, 303, 'the configured provider still starts sign-ins');
    },
  );

  await t.test('the new routes keep the console’s CSRF and CSP rules', async (t) => {
    const cross = await fetch(`${env.base}/console/oidc/start`, {
      headers: { 'sec-fetch-site': 'cross-site' },
      redirect: 'manual',
    });
    t.equal(cross.status, 403, 'a sign-in started from another site');
    t.match(await cross.text(), /csrf_token_invalid/);
    t.equal(cross.headers.get('set-cookie'), null, 'no state cookie');
    t.equal(cross.headers.get('content-security-policy'), CSP);
    const own = await fetch(`${env.base}/console/oidc/start`, {
      headers: { 'sec-fetch-site': 'same-origin' },
      redirect: 'manual',
    });
    t.equal(own.status, 303);
    t.ok(own.headers.get('location')?.startsWith(`${env.idp.issuer}/`), 'to the provider');
    const location = new URL(own.headers.get('location') ?? '');
    t.equal(location.searchParams.get('code_challenge_method'), 'S256', 'PKCE');
    t.ok(location.searchParams.get('state') !== null && location.searchParams.get('nonce') !== null);
    t.match(own.headers.get('set-cookie') ?? '', /^al_oidc=[^;]+; Path=\/console\/oidc; HttpOnly; SameSite=Lax/);
    const posted = await fetch(`${env.base}/console/oidc/start`, { method: 'POST', redirect: 'manual' });
    t.ok(posted.status >= 400 && posted.headers.get('set-cookie') === null, 'GET only: a POST starts nothing');
    // A state change after an OIDC sign-in still needs the page's CSRF token.
    const { context } = await signIn(env, 'bob');
    const logout = await fetch(`${env.base}/console/logout`, {
      method: 'POST',
      headers: { cookie: await sessionCookie(context), 'content-type': 'application/x-www-form-urlencoded' },
      body: 'csrf=wrong',
      redirect: 'manual',
    });
    t.equal(logout.status, 403);
    t.match(await logout.text(), /csrf_token_invalid/);
    await context.close();
  });

  /** Signs in as `login` at the email console and expects a refusal: the page's text. */
  const refusedAt = async (t: Test, login: string): Promise<string> => {
    const { context, page } = await startSignIn(env, login, env.emailBase);
    await page.waitForSelector('.code');
    const text = (await page.textContent('main')) ?? '';
    t.equal(await sessionCookie(context), '', `no session for ${login}`);
    await context.close();
    return text;
  };
  const staff = (email: string) => ({ name: email, email, email_verified: true, groups: ['staff'] });

  await t.test('one person is one principal: a subject and a principal are bound at the first sign-in', async (t) => {
    env.idp.accounts.set('dana-sub', staff('Dana@Example.com'));
    const first = await signIn(env, 'dana-sub', env.emailBase);
    t.match(await first.page.textContent('.who'), /Signed in as\s+dana@example\.com/, 'the email, lower-cased');
    await first.context.close();
    const bound = await env.g.pool.query(
      `SELECT issuer, subject, principal_id FROM actionledger.console_oidc_subjects WHERE subject = 'dana-sub'`,
    );
    t.match(bound.rows, [{ issuer: env.idp.issuer, subject: 'dana-sub', principal_id: 'dana@example.com' }]);

    // Someone else whose provider account has the same (verified) email does not become dana.
    env.idp.accounts.set('erin-sub', staff('dana@example.com'));
    t.match(await refusedAt(t, 'erin-sub'), /oidc_not_mapped.*belongs to another person/s, 'principal bound elsewhere');

    // Dana with another email is still dana: not a second principal (a second vote).
    env.idp.accounts.set('dana-sub', staff('dana.x@example.com'));
    t.match(await refusedAt(t, 'dana-sub'), /oidc_not_mapped.*signed in before as dana@example\.com/s, 'subject bound');

    // A revoked role does not come back under another spelling of the same email.
    await env.store.revoke('dana@example.com', 'tenant-a', 'auditor', 'test');
    env.idp.accounts.set('dana-sub', staff('DANA@example.com'));
    t.match(await refusedAt(t, 'dana-sub'), /oidc_not_mapped.*is revoked/s, 'the revocation holds');
    const principals = (await env.store.list()).map((p) => p.principal_id);
    t.notOk(
      principals.some((p) => p !== 'dana@example.com' && p.toLowerCase().startsWith('dana')),
      'no second principal for dana',
    );
  });

  await t.test('a claim cannot sign in as an existing principal the provider did not add', async (t) => {
    await env.store.add('frank@example.com', 'person', 'Frank', 'test');
    await env.store.grant('frank@example.com', 'tenant-a', 'operator', 'test');
    env.idp.accounts.set('frank-impostor', staff('frank@example.com'));
    t.match(await refusedAt(t, 'frank-impostor'), /oidc_not_mapped.*did not add/s);
    const bound = await env.g.pool.query(
      `SELECT 1 FROM actionledger.console_oidc_subjects WHERE principal_id = 'frank@example.com'`,
    );
    t.equal(bound.rowCount, 0, 'and it is not bound to the impostor');
    // A subject rule naming an existing principal is the operator saying who that subject is.
    await env.store.add('gina', 'person', 'Gina', 'test');
    env.idp.accounts.set('gina-sub', { name: 'Gina', groups: [] });
    const gina = await signIn(env, 'gina-sub', env.emailBase);
    t.match(await gina.page.textContent('.who'), /Signed in as\s+gina/);
    await gina.context.close();
  });

  await t.test('a principal id from a claim is plain ASCII and never a break-glass actor', async (t) => {
    const before = (await env.store.list()).length;
    env.idp.accounts.set('cyrillic-sub', staff('\u0430lice@example.com'));
    t.match(await refusedAt(t, 'cyrillic-sub'), /oidc_not_mapped.*not a usable principal id/s, 'a Cyrillic а');
    env.idp.accounts.set('glass-sub', staff('break-glass:admin'));
    t.match(await refusedAt(t, 'glass-sub'), /oidc_not_mapped.*not a usable principal id/s, 'break-glass:');
    t.equal((await env.store.list()).length, before, 'no principal was added');
  });

  await t.test('two first sign-ins at once bind one subject to one principal', async (t) => {
    const log = createLogger({ level: 'error', name: 'console-oidc-race', destination: process.stderr });
    const audit = new AuditWriter({
      config: env.g.config,
      pool: env.g.pool,
      log,
      metrics: new Metrics({ defaultMetrics: false }),
    });
    const sessions = new ConsoleSessions(env.g.config, env.g.pool, audit);
    const signIn = (principal: string, subject: string) =>
      sessions.startOidc(principal, principal, {
        issuer: env.idp.issuer,
        claims: { subject, groups: ['auditors'] },
        named: false,
      });
    // One subject as two principals (an email changed between two tabs), then two subjects as one principal.
    for (const pair of [
      [
        ['ivy-1', 'ivy-sub'],
        ['ivy-2', 'ivy-sub'],
      ],
      [
        ['jon', 'jon-sub-1'],
        ['jon', 'jon-sub-2'],
      ],
    ] as const) {
      const settled = await Promise.allSettled(pair.map(([principal, subject]) => signIn(principal, subject)));
      t.equal(settled.filter((r) => r.status === 'fulfilled').length, 1, 'one sign-in');
      t.match(
        settled.filter((r) => r.status === 'rejected'),
        [{ reason: { code: 'oidc_not_mapped' } }],
        'the other refused oidc_not_mapped',
      );
    }
    const bound = await env.g.pool.query(
      `SELECT principal_id FROM actionledger.console_oidc_subjects WHERE subject IN ('ivy-sub', 'jon-sub-1', 'jon-sub-2')`,
    );
    t.equal(bound.rowCount, 2, 'one binding each');
  });
});
