/**
 * Who is using the console, for every /console route but sign-in and the static files: the session cookie
 * (HttpOnly, SameSite=Strict; over TLS named `__Host-al_console`, Secure, Path=/; over plain HTTP `al_console`,
 * Path=/console; a request carrying more than one is refused), read again on every request with the
 * principal's grants; or, when `api.console.trusted_header` is set, the header an authenticating proxy adds,
 * believed only when the peer address is one of the configured proxies (from any other peer the header is
 * ignored and logged). Every state change carries the session's CSRF token in its form: a keyed hash of the
 * session secret, compared in constant time, so it needs no storage and a page of one session is useless in
 * another. Cross-site requests are refused besides (Sec-Fetch-Site, then Origin), as a second line.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../core/errors.js';
import type { ConsoleSession, ConsoleSessions } from '../../principals/index.js';
import type { ApiDeps, Caller } from '../api/types.js';

/** The session cookie's name over plain HTTP (Path=/console). */
export const COOKIE = 'al_console';
/**
 * Its name over TLS: the `__Host-` prefix makes a browser accept it only when Secure, with Path=/ and no
 * Domain, so a sibling host or a plain-HTTP page cannot plant one the console would read.
 */
export const TLS_COOKIE = `__Host-${COOKIE}`;

export interface SignedIn {
  session: ConsoleSession;
  csrf: string;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The console's signed-in person (console routes only). */
    signedIn?: SignedIn;
  }
}

/** The CSRF token of a session secret. */
export function csrfOf(sessionSecret: string): string {
  return createHash('sha256').update(`actionledger-console-csrf\0${sessionSecret}`, 'utf8').digest('base64url');
}

/**
 * The session cookie the request carries, if any. More than one (a cookie planted from a sibling host or
 * another path besides the console's own) is refused, never resolved in favour of one of them: throws
 * `unauthenticated` (details.reason `duplicate_cookie`).
 */
export function cookieOf(request: FastifyRequest): string | undefined {
  const header = request.headers.cookie;
  if (typeof header !== 'string') return undefined;
  const name = cookieName(request);
  const found: string[] = [];
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) found.push(part.slice(eq + 1).trim());
  }
  if (found.length > 1)
    throw new ActionLedgerError(
      'unauthenticated',
      'this browser sent more than one console session cookie, so which one is yours is unclear: sign in again',
      { details: { reason: 'duplicate_cookie' } },
    );
  return found[0];
}

function overTls(request: FastifyRequest): boolean {
  return (request.raw.socket as Partial<TLSSocket>).encrypted === true;
}

function cookieName(request: FastifyRequest): string {
  return overTls(request) ? TLS_COOKIE : COOKIE;
}

/** The cookie's attributes: `__Host-` rules under TLS (Secure, Path=/), Path=/console over plain HTTP. */
function attributes(request: FastifyRequest, maxAgeS: number): string {
  const where = overTls(request) ? 'Path=/' : 'Path=/console';
  return `${where}; HttpOnly; SameSite=Strict; Max-Age=${maxAgeS}${overTls(request) ? '; Secure' : ''}`;
}

export function setSessionCookie(request: FastifyRequest, reply: FastifyReply, token: string, maxAgeS: number): void {
  reply.header('set-cookie', `${cookieName(request)}=${token}; ${attributes(request, maxAgeS)}`);
}

export function clearSessionCookie(request: FastifyRequest, reply: FastifyReply): void {
  reply.header('set-cookie', `${cookieName(request)}=; ${attributes(request, 0)}`);
}

/** The `onRequest` hook of the console's signed-in routes. Throws `unauthenticated`. */
export function sessionHook(deps: ApiDeps, sessions: ConsoleSessions) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    if (request.routeOptions.config.console !== 'session') return;
    const trusted = deps.config.api.console.trustedHeader;
    let token: string | undefined;
    try {
      token = cookieOf(request);
    } catch (err) {
      clearSessionCookie(request, reply);
      throw err;
    }
    if (trusted !== null) {
      const named = request.headers[trusted.name];
      if (typeof named === 'string' && named !== '') {
        const peer = request.raw.socket.remoteAddress ?? '';
        if (!trusted.proxies.has(peer)) {
          deps.log.warn(
            { peer, header: trusted.name, request_id: request.id },
            'console: trusted header from a peer that is not a configured proxy, ignored',
          );
        } else {
          const current = token === undefined ? undefined : await sessions.authenticate(token).catch(() => undefined);
          if (current === undefined || current.principal_id !== named) {
            // Without any cookie (a cookieless client, or a cross-site navigation that leaves the SameSite cookie
            // behind) the person's live trusted-header session is reused rather than another one started; a
            // browser whose cookie no longer works gets a session of its own.
            const started = await sessions.startTrusted(named, token === undefined);
            token = started.token;
            setSessionCookie(request, reply, token, deps.config.api.console.sessionTtlS);
          }
        }
      }
    }
    if (token === undefined)
      throw new ActionLedgerError('unauthenticated', 'you are not signed in', { details: { reason: 'missing' } });
    try {
      request.signedIn = { session: await sessions.authenticate(token), csrf: csrfOf(token) };
    } catch (err) {
      clearSessionCookie(request, reply);
      throw err;
    }
  };
}

/** The host of an Origin header; null for one that is not a URL. */
function originHost(origin: string): string | null {
  try {
    return new URL(origin).host;
  } catch {
    return null;
  }
}

/** Whether the browser says the request was sent from another site (Sec-Fetch-Site, then Origin). */
function isCrossSite(request: FastifyRequest): boolean {
  const site = request.headers['sec-fetch-site'];
  const origin = request.headers.origin;
  const host = request.headers.host;
  return (
    (typeof site === 'string' && site !== 'same-origin' && site !== 'none') ||
    (typeof origin === 'string' && origin !== 'null' && host !== undefined && originHost(origin) !== host)
  );
}

/**
 * Refuses a sign-in sent from another site (`csrf_token_invalid`, details.reason `cross_site`), so no other
 * site can sign a browser in to an account of its choosing.
 */
export function checkSameSite(request: FastifyRequest): void {
  if (isCrossSite(request))
    throw new ActionLedgerError('csrf_token_invalid', 'a sign-in must be sent from the console’s own page', {
      details: { reason: 'cross_site' },
    });
}

/** Refuses a state change without this session's CSRF token, or one sent from another site: `csrf_token_invalid`. */
export function checkCsrf(request: FastifyRequest, sent: string | undefined): void {
  const expected = request.signedIn?.csrf;
  const crossSite = isCrossSite(request);
  // timingSafeEqual needs buffers of one length: compare byte lengths, not string lengths (a multi-byte
  // character keeps the string length and changes the byte length).
  const sentBytes = typeof sent === 'string' ? Buffer.from(sent, 'utf8') : null;
  const expectedBytes = expected === undefined ? null : Buffer.from(expected, 'utf8');
  const ok =
    !crossSite &&
    sentBytes !== null &&
    expectedBytes !== null &&
    sentBytes.length === expectedBytes.length &&
    timingSafeEqual(sentBytes, expectedBytes);
  if (!ok)
    throw new ActionLedgerError(
      'csrf_token_invalid',
      'this change did not come from a console page of your session: reload the page and try again',
      {
        details: { reason: crossSite ? 'cross_site' : 'token' },
      },
    );
}

/** The signed-in person acting in one tenant, as the API's caller type; a tenant they hold no role in is `not_found`. */
export function callerIn(request: FastifyRequest, tenant: string): Caller {
  const s = request.signedIn?.session;
  if (s === undefined) throw new ActionLedgerError('unauthenticated', 'you are not signed in');
  const roles = s.grants.get(tenant);
  if (roles === undefined) throw new ActionLedgerError('not_found', 'you hold no role in that tenant');
  return {
    token_id: `console:${s.session_id}`,
    principal_id: s.principal_id,
    tenant_id: tenant,
    kind: s.kind,
    roles,
    requests: 0,
    window_left_s: 0,
  };
}

/** The tenants the person holds roles in, in order. */
export function tenantsOf(request: FastifyRequest): string[] {
  return [...(request.signedIn?.session.grants.keys() ?? [])];
}
