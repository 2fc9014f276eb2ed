/** The page shell every console page shares: the navigation, the person, sign-out, the stylesheet and module. */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { html, type SafeHtml } from './html.js';
import type { ConsolePage } from './nav.js';

/** No inline script or style anywhere: everything comes from this origin, nothing may frame the console. */
export const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

const NAV: readonly [ConsolePage, string][] = [
  ['overview', 'Overview'],
  ['approvals', 'Approvals'],
  ['operations', 'Operations'],
  ['review', 'Review'],
  ['kill-switches', 'Kill switches'],
  ['audit', 'Audit'],
];

/** A page's own files beyond the console's stylesheet and module (served from this origin, as the CSP wants). */
export interface PageFiles {
  scripts?: readonly string[];
  styles?: readonly string[];
}

export function page(request: FastifyRequest, title: string, body: SafeHtml, files: PageFiles = {}): SafeHtml {
  const signed = request.signedIn;
  const who =
    signed === undefined
      ? html``
      : html`<div class="who">
          <span>Signed in as <strong>${signed.session.principal_id}</strong></span>
          <form class="inline" method="post" action="/console/logout">
            <input type="hidden" name="csrf" value="${signed.csrf}" /><button type="submit">Sign out</button>
          </form>
        </div>`;
  const nav =
    signed === undefined
      ? html``
      : html`<nav aria-label="Console">
          ${NAV.filter(([p]) => request.consolePages?.includes(p) ?? false).map(([p, label]) => html`<a href="/console/${p}">${label}</a>`)}
        </nav>`;
  return html`<!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>${title} · actionledger</title>
        <link rel="icon" href="/favicon.ico" />
        <link rel="stylesheet" href="/console/static/console.css" />
        ${(files.styles ?? []).map((h) => html`<link rel="stylesheet" href="${h}" />`)}
        <script type="module" src="/console/static/console.js"></script>
        ${(files.scripts ?? []).map((h) => html`<script type="module" src="${h}"></script>`)}
      </head>
      <body>
        <header><strong>actionledger</strong>${nav}${who}</header>
        <main id="main">
          <h1>${title}</h1>
          ${body}
        </main>
      </body>
    </html>`;
}

/** Sends a page with the console's security headers. */
export function send(reply: FastifyReply, status: number, body: SafeHtml): FastifyReply {
  return reply
    .code(status)
    .header('content-type', 'text/html; charset=utf-8')
    .header('content-security-policy', CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('x-frame-options', 'DENY')
    .send(body.toString());
}

export function notice(kind: 'ok' | 'bad' | 'warn', body: SafeHtml | string): SafeHtml {
  return html`<div class="notice ${kind}" role="${kind === 'bad' ? 'alert' : 'status'}">${body}</div>`;
}

/** A hidden CSRF field for the signed-in session. */
export function csrfField(request: FastifyRequest): SafeHtml {
  return html`<input type="hidden" name="csrf" value="${request.signedIn?.csrf ?? ''}" />`;
}

/** A tenant picker as links (the current one marked), for pages that show one tenant at a time. */
export function tenantPicker(tenants: readonly string[], current: string, path: string): SafeHtml {
  if (tenants.length < 2) return html`<p>Tenant: <strong>${current}</strong></p>`;
  return html`<p>
    Tenant:
    ${tenants.map((t) =>
      t === current
        ? html`<strong aria-current="page">${t}</strong> `
        : html`<a href="/console/${path}?tenant=${encodeURIComponent(t)}">${t}</a> `,
    )}
  </p>`;
}

export function ago(d: Date | string): string {
  return new Date(d)
    .toISOString()
    .replace('T', ' ')
    .replace(/\.\d+Z$/, 'Z');
}

/**
 * The success notice after a change, chosen by a fixed code in `?done=`: only the page's own messages can be
 * shown, so nobody can put words in the console's mouth with a crafted link. An unknown code shows nothing.
 */
export function doneNotice(messages: Readonly<Record<string, string>>, code: string | undefined): SafeHtml | '' {
  if (code === undefined || !Object.hasOwn(messages, code)) return '';
  return notice('ok', html`<p id="done">${messages[code]}</p>`);
}
