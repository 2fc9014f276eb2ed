/**
 * The overview (capability `read` in the tenant shown): the fleet at a glance, for the morning look. The queue,
 * dispatch latency, approvals waiting, the review backlog, kill switches and live workers as numbers and tables
 * (refreshed in place by the live-region module), and the operations per minute by state as a chart, drawn by
 * the overview's module from `/console/overview.json`, the same reading as JSON. Everything is read from the
 * database (overview-data.ts), so one page answers for every process of the fleet.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { holds } from '../../api/auth.js';
import type { ApiDeps, Caller } from '../../api/types.js';
import { href, html, visible, type SafeHtml } from '../html.js';
import { ago, page, send, tenantPicker } from '../layout.js';
import { WINDOWS, overviewReader, type Overview } from '../overview-data.js';
import { uplotBase } from '../static.js';
import { tenantsOf, callerIn } from '../session.js';
import { pickTenant } from './operations.js';

type Query = { tenant?: string; minutes?: string };

function minutesOf(q: Query): number {
  if (q.minutes === undefined || q.minutes === '') return 15;
  const n = Number(q.minutes);
  if (!(WINDOWS as readonly number[]).includes(n))
    throw new ActionLedgerError('invalid_request', `minutes must be one of ${WINDOWS.join(', ')}`, {
      details: { field: 'minutes' },
    });
  return n;
}

function reader(deps: ApiDeps, request: FastifyRequest, q: Query): Caller {
  return pickTenant(deps, request, q.tenant, (c) => holds(deps, c, 'read'));
}

/** Seconds as a person reads a wait: `42 s`, `3 min 5 s`, `2 h 10 min`; `none` for null. */
export function duration(s: number | null): string {
  if (s === null) return 'none';
  if (s < 10) return `${s.toFixed(2)} s`;
  const r = Math.round(s);
  if (r < 60) return `${r} s`;
  if (r < 3600) return `${Math.floor(r / 60)} min ${r % 60} s`;
  return `${Math.floor(r / 3600)} h ${Math.floor((r % 3600) / 60)} min`;
}

export function registerOverviewPages(app: FastifyInstance, deps: ApiDeps): void {
  // One reading per tenant and window shared by the page, its JSON and every tab, one at a time on one connection.
  const overview = overviewReader(deps.pool, deps.config);
  app.get<{ Querystring: Query }>('/overview.json', { config: { console: 'session' } }, async (request, reply) => {
    const caller = reader(deps, request, request.query);
    const o = await overview.read(caller.tenant_id, minutesOf(request.query));
    return reply
      .header('cache-control', 'no-store')
      .header('x-content-type-options', 'nosniff')
      .type('application/json; charset=utf-8')
      .send(o);
  });
  app.get<{ Querystring: Query }>('/overview', { config: { console: 'session' } }, async (request, reply) => {
    const caller = reader(deps, request, request.query);
    const minutes = minutesOf(request.query);
    const o = await overview.read(caller.tenant_id, minutes);
    const readable = tenantsOf(request).filter((t) => holds(deps, callerIn(request, t), 'read'));
    const body = html`${tenantPicker(readable, caller.tenant_id, 'overview')}
      <p class="windows">
        Window:
        ${WINDOWS.map((w) =>
          w === minutes
            ? html`<strong aria-current="true">${w} min</strong> `
            : html`<a href="${href(['overview'], { tenant: caller.tenant_id, minutes: w })}">${w} min</a> `,
        )}
      </p>
      <section id="tiles" class="tiles" data-live aria-live="polite">${tiles(o)}</section>
      <h2>Operations per minute, by state</h2>
      <p class="muted">
        Operations reserved in each minute of the last ${minutes} minutes (this one so far), by the state they are in
        now; redrawn every few seconds while the page is shown.
      </p>
      <div
        id="chart"
        class="chart"
        data-src="${href(['overview.json'], { tenant: caller.tenant_id, minutes })}"
        role="img"
        aria-label="operations per minute by state"
      >
        <p class="muted">The chart needs JavaScript; the totals are in the table below.</p>
      </div>
      <section id="details" data-live>${details(o, caller.tenant_id)}</section>`;
    return send(
      reply,
      200,
      page(request, 'Overview', body, {
        scripts: ['/console/static/overview.js'],
        styles: [`${uplotBase()}/uPlot.min.css`],
      }),
    );
  });
}

function tile(id: string, label: string, value: string | number, note: SafeHtml | string = ''): SafeHtml {
  return html`<div class="tile">
    <span class="label">${label}</span>
    <strong id="${id}">${value}</strong>
    <span class="note">${note}</span>
  </div>`;
}

function tiles(o: Overview): SafeHtml {
  const inReview = o.review.reduce((a, r) => a + r.count, 0);
  return html`${tile('queue-depth', 'Queue depth', o.queue.depth, html`oldest <span id="queue-oldest">${duration(o.queue.oldest_age_s)}</span>`)}
  ${tile(
    'latency-p50',
    'Dispatch latency p50',
    duration(o.latency.p50_s),
    html`p99 <span id="latency-p99">${duration(o.latency.p99_s)}</span> over ${o.latency.count} succeeded`,
  )}
  ${tile('approvals-pending', 'Approvals waiting', o.approvals.pending, o.approvals.overdue > 0 ? html`<span class="bad">${o.approvals.overdue} past their time</span>` : 'none past their time')}
  ${tile('review-backlog', 'In review', inReview, `${o.review.length} reason${o.review.length === 1 ? '' : 's'}`)}
  ${tile('kill-switches-engaged', 'Kill switches engaged', o.kill_switches.length, o.kill_switches.length > 0 ? html`<span class="bad">calls refused</span>` : 'none')}
  ${tile('workers-alive', 'Workers alive', o.workers.length, o.workers.length === 0 ? html`<span class="bad">no dispatcher heartbeat</span>` : `newest heartbeat ${duration(Math.min(...o.workers.map((w) => w.heartbeat_age_s)))} ago`)}`;
}

function lists(o: Overview, tenant: string): Record<'review' | 'approvals', SafeHtml> {
  const review =
    o.review.length === 0
      ? html`<p>Nothing is in review.</p>`
      : html`<table>
          <thead>
            <tr>
              <th>Reason</th>
              <th>Operations</th>
            </tr>
          </thead>
          <tbody>
            ${o.review.map(
              (r) =>
                html`<tr>
                  <td data-label="Reason">${visible(r.reason)}</td>
                  <td data-label="Operations">${r.count}</td>
                </tr>`,
            )}
          </tbody>
        </table>`;
  const approvals =
    o.approvals.next.length === 0
      ? html`<p>No approval waits.</p>`
      : html`<table>
          <thead>
            <tr>
              <th>Tool</th>
              <th>Who asked</th>
              <th>Expires</th>
            </tr>
          </thead>
          <tbody>
            ${o.approvals.next.map(
              (a) =>
                html`<tr>
                  <td data-label="Tool"><a href="${href(['approvals', tenant, a.approval_id])}">${a.tool_name}</a></td>
                  <td data-label="Who asked">${a.requester_id}</td>
                  <td data-label="Expires">
                    ${ago(a.expires_at)}
                    (${a.expires_in_s <= 0 ? html`<span class="bad">expired</span>` : `in ${duration(a.expires_in_s)}`})
                  </td>
                </tr>`,
            )}
          </tbody>
        </table>`;
  return { review, approvals };
}

function fleetLists(o: Overview): Record<'switches' | 'workers', SafeHtml> {
  const switches =
    o.kill_switches.length === 0
      ? html`<p>No kill switch is engaged.</p>`
      : html`<ul>
          ${o.kill_switches.map(
            (k) =>
              html`<li>
                <strong>${k.tool_name === '*' ? 'every tool' : k.tool_name}</strong> in
                ${k.tenant_id === '*' ? 'every tenant' : k.tenant_id}, since ${ago(k.engaged_at)} by ${k.engaged_by}:
                ${visible(k.reason)}
              </li>`,
          )}
        </ul>`;
  const workers =
    o.workers.length === 0
      ? html`<p>No dispatcher worker heartbeated within the last hour.</p>`
      : html`<ul>
          ${o.workers.map((w) => html`<li>${w.worker}: heartbeat ${duration(w.heartbeat_age_s)} ago</li>`)}
        </ul>`;
  return { switches, workers };
}

/** A state-by-count table, each count's cell named `PREFIX-STATE`. */
function counts(prefix: string, values: Readonly<Record<string, number>>): SafeHtml {
  return html`<table class="counts">
    <tbody>
      ${Object.entries(values).map(
        ([k, n]) =>
          html`<tr>
            <th scope="row">${k}</th>
            <td id="${prefix}-${k}">${n}</td>
          </tr>`,
      )}
    </tbody>
  </table>`;
}

function details(o: Overview, tenant: string): SafeHtml {
  const { review, approvals } = lists(o, tenant);
  const { switches, workers } = fleetLists(o);
  return html`<div class="columns">
    <div>
      <h2>In the window, by state</h2>
      ${counts('window', o.window_totals)}
      <h2>Open now</h2>
      ${counts('open', o.open)}
    </div>
    <div>
      <h2><a href="${href(['review'], { tenant })}">Review backlog</a> by reason</h2>
      ${review}
      <h2><a href="/console/approvals">Pending approvals</a>, next to expire</h2>
      ${approvals}
      <h2>Kill switches</h2>
      ${switches}
      <h2>Workers</h2>
      ${workers}
    </div>
  </div>`;
}
