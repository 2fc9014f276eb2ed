/**
 * The operator console over real HTTP without a browser: people made through the real principal store, signed
 * in through a one-time link as the CLI makes them, and the form posts a browser would send (CSRF token and
 * session cookie included).
 */
import { ConsoleSessions } from '../../principals/index.js';
import type { ApiFixture } from './api.js';

export const FORM = { 'content-type': 'application/x-www-form-urlencoded' };

/** A signed-in browser: its session cookie and the CSRF token its pages carry. */
export interface Signed {
  cookie: string;
  csrf: string;
}

/** Adds a person with these roles in the tenant. */
export async function person(f: ApiFixture, id: string, roles: string[], tenant = 'tenant-a'): Promise<void> {
  await f.store.add(id, 'person', id, 'test');
  for (const r of roles) await f.store.grant(id, tenant, r, 'test');
}

export function sessions(f: ApiFixture): ConsoleSessions {
  return new ConsoleSessions(f.config, f.pool, f.deps.audit);
}

/** Redeems a sign-in link as the sign-in page's form posts it. */
export function redeem(f: ApiFixture, secret: string): Promise<Response> {
  return fetch(`${f.base}/console/login`, {
    method: 'POST',
    headers: FORM,
    body: `link=${secret}`,
    redirect: 'manual',
  });
}

export function get(
  f: ApiFixture,
  path: string,
  cookie?: string,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(`${f.base}${path}`, {
    headers: { ...headers, ...(cookie === undefined ? {} : { cookie }) },
    redirect: 'manual',
  });
}

export function post(
  f: ApiFixture,
  path: string,
  s: Signed,
  fields: Record<string, string>,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(`${f.base}${path}`, {
    method: 'POST',
    headers: { ...FORM, cookie: s.cookie, ...headers },
    body: new URLSearchParams(fields).toString(),
    redirect: 'manual',
  });
}

/** Signs the person in through a fresh one-time link; the cookie and the CSRF token of the approvals page. */
export async function signIn(f: ApiFixture, id: string): Promise<Signed> {
  const link = await sessions(f).createLoginLink(id, 'test');
  const res = await redeem(f, link.secret);
  if (res.status !== 303) throw new Error(`sign-in answered ${res.status}`);
  const cookie = (res.headers.get('set-cookie') ?? '').split(';')[0] ?? '';
  const page = await get(f, '/console/approvals', cookie);
  const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())?.[1] ?? '';
  return { cookie, csrf };
}
