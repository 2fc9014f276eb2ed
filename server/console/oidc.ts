/**
 * Console sign-in through an OpenID Connect provider (`api.console.oidc`), authorization code with PKCE, `state`
 * and `nonce`, through openid-client (which checks the provider's answer: the state, the code exchange, the ID
 * token's signature, issuer, audience, expiry and nonce).
 *
 *   GET /console/oidc/start     refuses a cross-site request; sets a signed state cookie (state, nonce, PKCE
 *                               verifier, expiry) and redirects to the provider
 *   GET /console/oidc/callback  checks the cookie and the provider's answer, maps the claims (config/console-
 *                               oidc.ts) to a principal and roles, starts a console session
 *
 * The state cookie is signed with a key derived from the client secret and the redirect URL, so every process
 * of a fleet (and the one the callback reaches) can check it without shared storage, nobody without the secret
 * can make one, and another console sharing the client secret (a staging one, at another redirect URL) cannot
 * make one this console accepts. Whether it is a `__Host-` cookie (Secure, Path=/) is decided by the configured
 * redirect URL, not by the connection: behind a proxy that ends TLS the connection is plain HTTP, but the
 * browser is on https, and a cookie without the prefix could be planted by a sibling subdomain or a plain-HTTP
 * answer (login CSRF: the victim's browser finishing the attacker's sign-in). It is SameSite=Lax: the callback is a navigation from the provider's site, which a Strict cookie would miss.
 * For the same reason the callback answers a page that moves on by itself rather than a redirect: the Strict
 * session cookie is not sent along a redirect chain that began on another site.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Configuration } from 'openid-client';
import { ActionLedgerError } from '../../core/errors.js';
import type { ConsoleOidcConfig } from '../../config/index.js';
import { oidcMapping } from '../../config/index.js';
import type { ConsoleSessions } from '../../principals/index.js';
import type { ApiDeps } from '../api/types.js';
import { html, type SafeHtml } from './html.js';
import { page, send } from './layout.js';
import { checkSameSite, setSessionCookie } from './session.js';

/** How long a sign-in may take at the provider. */
const STATE_TTL_MS = 10 * 60 * 1000;
const STATE_COOKIE = 'al_oidc';

interface Pending {
  /** state, nonce, PKCE verifier, expiry (ms since the epoch) */
  s: string;
  n: string;
  v: string;
  e: number;
}

/** A thrown error's `code` when it is a string (openid-client's and node's are), else `unknown`. */
function codeOf(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : 'unknown';
}

function failed(reason: string, message: string, details: Record<string, unknown> = {}): ActionLedgerError {
  return new ActionLedgerError('oidc_sign_in_failed', message, { details: { reason, ...details } });
}

function notMapped(reason: string, message: string, details: Record<string, unknown> = {}): ActionLedgerError {
  return new ActionLedgerError('oidc_not_mapped', message, { details: { reason, ...details } });
}

/** The client secret, read once at start. Throws `secret_missing`. */
export function oidcClientSecret(oidc: ConsoleOidcConfig, env: NodeJS.ProcessEnv): string {
  let secret: string | undefined;
  if (oidc.clientSecretEnv !== null) secret = env[oidc.clientSecretEnv];
  else if (oidc.clientSecretFile !== null) {
    try {
      secret = readFileSync(oidc.clientSecretFile, 'utf8').trim();
    } catch {
      secret = undefined;
    }
  }
  if (secret === undefined || secret === '')
    throw new ActionLedgerError(
      'secret_missing',
      oidc.clientSecretEnv !== null
        ? `console OIDC client secret: environment variable ${oidc.clientSecretEnv} is not set`
        : `console OIDC client secret: file ${oidc.clientSecretFile ?? ''} cannot be read or is empty`,
      { details: { setting: 'api.console.oidc' } },
    );
  return secret;
}

/** The sign-in page's button, or nothing when single sign-on is off. */
export function oidcButton(deps: ApiDeps): SafeHtml | '' {
  const oidc = deps.config.api.console.oidc;
  if (oidc === null) return '';
  return html`<p>
    <a class="button" id="oidc-sign-in" href="/console/oidc/start">Sign in with ${oidc.displayName}</a>
  </p>`;
}

type OpenId = typeof import('openid-client');
let openIdLoaded: Promise<OpenId> | undefined;
/**
 * openid-client (with jose), loaded by the first sign-in rather than by every worker's start. A failed import is
 * not kept: the next sign-in tries again.
 */
const openId = (): Promise<OpenId> =>
  (openIdLoaded ??= import('openid-client').catch((err: unknown) => {
    openIdLoaded = undefined;
    throw err;
  }));

/** The console's OpenID Connect client: the provider's metadata, read at the first sign-in and kept. */
export class OidcClient {
  readonly #oidc: ConsoleOidcConfig;
  readonly #secret: string;
  readonly #stateKey: Buffer;
  #discovered: Promise<Configuration> | undefined;

  constructor(oidc: ConsoleOidcConfig, secret: string) {
    this.#oidc = oidc;
    this.#secret = secret;
    this.#stateKey = createHmac('sha256', secret)
      .update(`actionledger-console-oidc-state\n${oidc.redirectUrl}`)
      .digest();
  }

  /** The provider's configuration; a failed discovery is tried again at the next sign-in. */
  async configuration(): Promise<Configuration> {
    this.#discovered ??= openId()
      .then((client) =>
        client.discovery(
          new URL(this.#oidc.issuer),
          this.#oidc.clientId,
          undefined,
          client.ClientSecretBasic(this.#secret),
          // config/console-oidc.ts allows http only to a loopback issuer.
          new URL(this.#oidc.issuer).protocol === 'http:' ? { execute: [client.allowInsecureRequests] } : {},
        ),
      )
      .catch((err: unknown) => {
        this.#discovered = undefined;
        throw failed('discovery', `the identity provider at ${this.#oidc.issuer} could not be read`, {
          cause: codeOf(err),
        });
      });
    return this.#discovered;
  }

  sign(p: Pending): string {
    const body = Buffer.from(JSON.stringify(p), 'utf8').toString('base64url');
    return `${body}.${createHmac('sha256', this.#stateKey).update(body).digest('base64url')}`;
  }

  /** The pending sign-in a state cookie carries; throws `oidc_sign_in_failed` unless it is ours and fresh. */
  verify(cookie: string | undefined): Pending {
    if (cookie === undefined)
      throw failed('no_state', 'this browser has no sign-in in progress (it expired, or began in another browser)');
    const [body = '', mac = ''] = cookie.split('.');
    const expected = createHmac('sha256', this.#stateKey).update(body).digest();
    const sent = Buffer.from(mac, 'base64url');
    if (sent.length !== expected.length || !timingSafeEqual(sent, expected))
      throw failed('state_cookie_invalid', 'the sign-in state this browser sent was not made by this console');
    const p = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as Pending;
    if (!(p.e > Date.now())) throw failed('expired', 'the sign-in took too long: start again');
    return p;
  }
}

/**
 * Whether the browser reaches the console over https, by the configured redirect URL (config/console-oidc.ts
 * allows http only to a loopback host): not by the connection, which is plain HTTP behind a proxy ending TLS.
 */
function httpsConsole(oidc: ConsoleOidcConfig): boolean {
  return new URL(oidc.redirectUrl).protocol === 'https:';
}

/** The state cookie: `__Host-` rules for an https console (Secure, Path=/), Path=/console/oidc on loopback http. */
function stateCookie(oidc: ConsoleOidcConfig, value: string, maxAgeS: number): string {
  const tls = httpsConsole(oidc);
  const where = tls ? 'Path=/; Secure' : 'Path=/console/oidc';
  return `${tls ? '__Host-' : ''}${STATE_COOKIE}=${value}; ${where}; HttpOnly; SameSite=Lax; Max-Age=${maxAgeS}`;
}

/** The state cookie's value, under its one name (a cookie under the other name is not looked at). */
function stateCookieOf(request: FastifyRequest, oidc: ConsoleOidcConfig): string | undefined {
  const name = `${httpsConsole(oidc) ? '__Host-' : ''}${STATE_COOKIE}`;
  const found = (request.headers.cookie ?? '')
    .split(';')
    .map((part) => part.trim())
    .filter((part) => part.startsWith(`${name}=`));
  if (found.length > 1) throw failed('state_cookie_invalid', 'this browser sent more than one sign-in state');
  return found[0]?.slice(name.length + 1);
}

/** The provider's groups claim as a list: a string is a list of one, anything else none. */
function groupsOf(value: unknown): string[] {
  if (typeof value === 'string') return [value];
  return Array.isArray(value) ? value.filter((g): g is string => typeof g === 'string') : [];
}

/** The principal id: a subject rule's, else the configured claim's value (an email only when verified). */
function principalOf(oidc: ConsoleOidcConfig, named: string | null, claims: Record<string, unknown>): string {
  if (named !== null) return named;
  const value = claims[oidc.principalClaim];
  if (typeof value !== 'string' || (oidc.principalClaim === 'email' && claims.email_verified !== true))
    throw notMapped('no_principal_claim', `the identity provider did not give a usable ${oidc.principalClaim} claim`, {
      claim: oidc.principalClaim,
    });
  // Email addresses are compared without case (Bob@x is bob@x): one address, one principal.
  return oidc.principalClaim === 'email' ? value.toLowerCase() : value;
}

/**
 * The console's OpenID Connect client when `api.console.oidc` is set, else null. Reads the client secret now,
 * while the API is built: throws `secret_missing`, so a service without it does not start.
 */
export function consoleOidcClient(deps: ApiDeps): OidcClient | null {
  const oidc = deps.config.api.console.oidc;
  return oidc === null ? null : new OidcClient(oidc, oidcClientSecret(oidc, deps.env ?? {}));
}

/** Registers `/oidc/start` and `/oidc/callback` (under /console) for the client, if there is one. */
export function registerOidc(
  app: FastifyInstance,
  deps: ApiDeps,
  sessions: ConsoleSessions,
  oidcClient: OidcClient | null,
): void {
  const oidc = deps.config.api.console.oidc;
  if (oidc === null || oidcClient === null) return;
  app.get('/oidc/start', { config: { console: 'public' } }, async (request, reply) => {
    // A sign-in begins on the console's own page: another site cannot start one in this browser.
    checkSameSite(request);
    const config = await oidcClient.configuration();
    const client = await openId();
    const verifier = client.randomPKCECodeVerifier();
    const pending = { s: client.randomState(), n: client.randomNonce(), v: verifier, e: Date.now() + STATE_TTL_MS };
    const url = client.buildAuthorizationUrl(config, {
      redirect_uri: oidc.redirectUrl,
      scope: oidc.scopes.join(' '),
      code_challenge: await client.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
      state: pending.s,
      nonce: pending.n,
    });
    reply.header('set-cookie', stateCookie(oidc, oidcClient.sign(pending), STATE_TTL_MS / 1000));
    return reply.redirect(url.href, 303);
  });
  app.get('/oidc/callback', { config: { console: 'public' } }, async (request, reply) =>
    callback(request, reply, deps, oidc, oidcClient, sessions),
  );
}

async function callback(
  request: FastifyRequest,
  reply: FastifyReply,
  deps: ApiDeps,
  oidc: ConsoleOidcConfig,
  oidcClient: OidcClient,
  sessions: ConsoleSessions,
): Promise<FastifyReply> {
  // Whatever happens next, this sign-in attempt is over: its state goes.
  reply.header('set-cookie', stateCookie(oidc, '', 0));
  const pending = oidcClient.verify(stateCookieOf(request, oidc));
  const query = new URL(request.url, 'http://callback.invalid').searchParams;
  // The answer must be this browser's before anything in it is believed, the provider's refusal included.
  if (query.get('state') !== pending.s)
    throw failed('state_mismatch', 'the identity provider’s answer does not belong to this browser’s sign-in');
  const providerError = query.get('error');
  if (providerError !== null)
    throw failed('provider_error', 'the identity provider refused the sign-in', {
      error: /^[\x20-\x7E]{1,64}$/.test(providerError) ? providerError : 'invalid',
    });
  const config = await oidcClient.configuration();
  const client = await openId();
  const current = new URL(oidc.redirectUrl);
  current.search = query.toString();
  let claims: Record<string, unknown>;
  try {
    const tokens = await client.authorizationCodeGrant(config, current, {
      pkceCodeVerifier: pending.v,
      expectedState: pending.s,
      expectedNonce: pending.n,
      idTokenExpected: true,
    });
    claims = { ...(tokens.claims() ?? {}) };
  } catch (err) {
    const code = codeOf(err);
    deps.log.warn({ code, message: (err as Error).message, request_id: request.id }, 'console: OIDC answer refused');
    throw failed('answer_rejected', `the identity provider’s answer did not pass its checks (${code})`, {
      check: code,
    });
  }
  const subject = String(claims.sub);
  const groups = groupsOf(claims[oidc.groupsClaim]);
  const mapping = oidcMapping(oidc, { subject, groups });
  if (mapping.grants.size === 0)
    throw notMapped('no_rule', 'no rule of the console’s mapping gives you a role: ask an operator to add one', {
      subject,
    });
  const principal = principalOf(oidc, mapping.principal, claims);
  const name = typeof claims.name === 'string' ? claims.name : principal;
  const who = { issuer: oidc.issuer, claims: { subject, groups }, named: mapping.principal !== null };
  const started = await sessions.startOidc(principal, name, who).catch((err: unknown) => {
    if ((err as ActionLedgerError).code === 'invalid_context')
      throw notMapped('principal_invalid', 'the identity provider’s claim is not a usable principal id', { subject });
    throw err;
  });
  // fastify adds a second set-cookie header beside the cleared state's.
  setSessionCookie(request, reply, started.token, deps.config.api.console.sessionTtlS);
  // To the landing page, as a link sign-in goes: the first page the person's roles open.
  const body = html`<meta http-equiv="refresh" content="0;url=/console/" />
    <p>You are signed in. <a id="continue" href="/console/">Continue to the console</a>.</p>`;
  return send(reply, 200, page(request, 'Signed in', body));
}
