/**
 * The operator console, registered on the API's fastify instance as one encapsulated plugin under /console:
 * server-rendered pages (every interpolation escaped by html.ts), a stylesheet and one small ES module, HTML
 * forms posted as application/x-www-form-urlencoded (parsed strictly: a repeated field is refused). Its pages
 * call the same library functions the /v1 routes call, with the signed-in person as the caller, so every
 * decision is checked, refused and audited exactly as over the API.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ConsoleSessions } from '../../principals/index.js';
import { httpStatus } from '../api/errors.js';
import { FORM_BODY, frameworkError } from '../api/framework-errors.js';
import type { ApiDeps } from '../api/types.js';
import { CONSOLE_CSS, CONSOLE_JS } from './assets.js';
import { html } from './html.js';
import { notice, page, send } from './layout.js';
import { registerApprovalPages } from './pages/approvals.js';
import { registerAuditPages } from './pages/audit.js';
import { registerKillSwitchPages } from './pages/kill-switches.js';
import { registerOverviewPages } from './pages/overview.js';
import { navHook } from './nav.js';
import { registerFavicon, registerStatic } from './static.js';
import { registerOperationPages } from './pages/operations.js';
import { registerReviewPages } from './pages/review.js';
import { form, parseForm, type Form } from './form.js';
import { checkSameSite, clearSessionCookie, cookieOf, sessionHook, setSessionCookie } from './session.js';
import { explain } from './explain.js';
import { consoleOidcClient, oidcButton, registerOidc } from './oidc.js';

/**
 * The command an operator runs to make a person's one-time sign-in link, as it runs without a token: the
 * operator names themself with --break-glass (with ACTIONLEDGER_TOKEN set, the token acts and --break-glass is
 * refused). The capitals are filled in: the person's principal id, the operator's own name.
 */
export const LOGIN_LINK_COMMAND = 'actionledger principal login-link PRINCIPAL_ID --break-glass OPERATOR_NAME';

const LOGIN_LINK_HOW = html`They run <code>${LOGIN_LINK_COMMAND}</code> with your principal id and their own name (with
  their <code>ACTIONLEDGER_TOKEN</code> set, without <code>--break-glass</code>).`;

/** Registers the console on the API's app (before it is ready). */
export function registerConsole(app: FastifyInstance, deps: ApiDeps): void {
  const sessions = new ConsoleSessions(deps.config, deps.pool, deps.audit);
  // Read here, not in the plugin: a missing client secret must refuse the build (`secret_missing`).
  const oidc = consoleOidcClient(deps);
  // `/` is the address a person types: it leads to the console, which asks for a sign-in when there is none.
  // It needs no session and answers nothing but the redirect; every other path is the API's, as before.
  app.get('/', { config: { console: 'public' } }, (_request, reply) => reply.redirect('/console', 302));
  registerFavicon(app);
  void app.register(
    (child, _opts, done) => {
      child.addContentTypeParser(
        'application/x-www-form-urlencoded',
        { parseAs: 'string', bodyLimit: 65536 },
        (_request, body, next) => {
          try {
            next(null, parseForm(body as string));
          } catch (err) {
            next(err as Error, undefined);
          }
        },
      );
      child.addHook('onRequest', sessionHook(deps, sessions));
      child.addHook('preHandler', navHook(deps));
      child.setErrorHandler((err: FastifyError, request, reply) => errorPage(deps, request, reply, err));
      child.setNotFoundHandler((request, reply) =>
        send(reply, 404, page(request, 'Not found', notice('bad', 'There is no such console page.'))),
      );
      registerEntry(child, deps, sessions);
      registerOidc(child, deps, sessions, oidc);
      registerStatic(child);
      registerOverviewPages(child, deps);
      registerApprovalPages(child, deps);
      registerOperationPages(child, deps);
      registerReviewPages(child, deps);
      registerKillSwitchPages(child, deps);
      registerAuditPages(child, deps);
      done();
    },
    { prefix: '/console' },
  );
}

function registerEntry(app: FastifyInstance, deps: ApiDeps, sessions: ConsoleSessions): void {
  app.get('/static/console.js', { config: { console: 'public' } }, (_request, reply) =>
    reply.header('content-type', 'text/javascript; charset=utf-8').header('cache-control', 'no-cache').send(CONSOLE_JS),
  );
  app.get('/static/console.css', { config: { console: 'public' } }, (_request, reply) =>
    reply.header('content-type', 'text/css; charset=utf-8').header('cache-control', 'no-cache').send(CONSOLE_CSS),
  );
  // The landing page: the first the person's roles open (the overview, for anyone who may read).
  app.get('/', { config: { console: 'session' } }, (request, reply) =>
    reply.redirect(`/console/${request.consolePages?.[0] ?? 'approvals'}`, 303),
  );
  // Opening the link shows a button; only the POST uses it, so a link preview or prefetch cannot spend it.
  app.get<{ Querystring: { link?: string } }>('/login', { config: { console: 'public' } }, (request, reply) => {
    const link = typeof request.query.link === 'string' ? request.query.link : '';
    const body =
      link === ''
        ? html`${oidcButton(deps)}
            <p>Ask an operator for a sign-in link. ${LOGIN_LINK_HOW}</p>`
        : html`<form method="post" action="/console/login">
            <input type="hidden" name="link" value="${link}" />
            <p>This link signs you in once.</p>
            <button type="submit">Sign in</button>
          </form>`;
    return send(reply, 200, page(request, 'Sign in', body));
  });
  app.post('/login', { config: { console: 'public' } }, async (request, reply) => {
    checkSameSite(request);
    const link = ((request.body ?? {}) as Form).link ?? '';
    const started = await sessions.redeemLink(link);
    // A new sign-in replaces whatever session this browser had: the old one ends, it is not left usable.
    let previous: string | undefined;
    try {
      previous = cookieOf(request);
    } catch {
      previous = undefined; // several cookies: none is trusted, and the new one replaces the console's own
    }
    if (previous !== undefined) {
      const old = await sessions.authenticate(previous).catch(() => undefined);
      if (old !== undefined) await sessions.end(old.session_id, 'replaced');
    }
    setSessionCookie(request, reply, started.token, deps.config.api.console.sessionTtlS);
    return reply.redirect('/console/', 303);
  });
  app.post('/logout', { config: { console: 'session' } }, async (request, reply) => {
    form(request);
    const s = request.signedIn?.session;
    if (s !== undefined) await sessions.end(s.session_id);
    clearSessionCookie(request, reply);
    request.signedIn = undefined;
    return send(reply, 200, page(request, 'Signed out', notice('ok', 'You are signed out.')));
  });
}

function errorPage(deps: ApiDeps, request: FastifyRequest, reply: FastifyReply, raw: FastifyError): FastifyReply {
  const err = frameworkError(raw, FORM_BODY);
  const status = httpStatus(err.code);
  if (status >= 500) deps.log.error({ err: raw, code: err.code, request_id: request.id }, 'console request failed');
  if (err.code === 'unauthenticated') {
    const body = html`${notice('bad', html`<span class="code">unauthenticated</span>: ${err.message}`)}
      ${oidcButton(deps)}
      <p>Sign in with a one-time link from an operator. ${LOGIN_LINK_HOW}</p>`;
    request.signedIn = undefined;
    return send(reply, 401, page(request, 'Sign in', body));
  }
  return send(reply, status, page(request, 'Refused', explain(err, status)));
}
