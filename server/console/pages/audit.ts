/**
 * The audit log of one tenant (capability `audit`), newest first, filtered (by the query string, on the server)
 * and paged; refusals included. One line a row: the JSON detail is folded into a `<details>`, its first
 * characters in the summary, the whole of it, indented, on demand.
 */
import type { FastifyInstance } from 'fastify';
import { ISO_TIME_PATTERN, listAudit } from '../../../gate/index.js';
import { ActionLedgerError } from '../../../core/errors.js';
import { holds } from '../../api/auth.js';
import type { ApiDeps } from '../../api/types.js';
import { href, html, visible, type SafeHtml } from '../html.js';
import { ago, page, send, tenantPicker } from '../layout.js';
import { tenantsOf } from '../session.js';
import { pickTenant } from './operations.js';

const FIELDS = ['action', 'outcome', 'tool', 'principal_id', 'subject_id', 'since'] as const;
type Query = Partial<Record<(typeof FIELDS)[number] | 'tenant' | 'cursor', string>>;

export function registerAuditPages(app: FastifyInstance, deps: ApiDeps): void {
  app.get<{ Querystring: Query }>('/audit', { config: { console: 'session' } }, async (request, reply) => {
    const q = request.query;
    const caller = pickTenant(deps, request, q.tenant, (c) => holds(deps, c, 'audit'));
    const filters: Record<string, string> = {};
    for (const f of FIELDS) {
      const v = q[f];
      if (v === undefined || v === '') continue;
      if (v.length > 256 || v.includes('\u0000'))
        throw new ActionLedgerError('invalid_request', `${f} is too long or malformed`, { details: { field: f } });
      filters[f] = v;
    }
    if (filters.since !== undefined && !new RegExp(ISO_TIME_PATTERN).test(filters.since))
      throw new ActionLedgerError('invalid_request', 'since must be an ISO 8601 time with its offset', {
        details: { field: 'since' },
      });
    const result = await listAudit(deps.pool, deps.config.schemaQuoted, {
      ...filters,
      tenant_id: caller.tenant_id,
      limit: 100,
      ...(q.cursor === undefined || q.cursor === '' ? {} : { cursor: q.cursor }),
    });
    const form = html`<form class="filters" method="get" action="/console/audit">
      <input type="hidden" name="tenant" value="${caller.tenant_id}" />
      ${FIELDS.map((f) => html`<label>${f.replace('_id', '')} <input name="${f}" value="${filters[f] ?? ''}" ${f === 'since' ? html`placeholder="2026-01-31T09:00:00Z"` : ''} /></label>`)}
      <button type="submit">Filter</button>
    </form>`;
    const rows = result.rows.map(
      (r) =>
        html`<tr>
          <td data-label="At">${ago(r.at)}</td>
          <td data-label="Action">${r.action}</td>
          <td data-label="Outcome">${r.outcome}</td>
          <td data-label="Who">${r.principal_id ?? ''}${r.role === null ? '' : ` (${r.role})`}</td>
          <td data-label="Tool">${r.tool_name ?? ''}</td>
          <td data-label="Subject">${r.subject_id ?? ''}</td>
          <td data-label="Detail" class="detail">${detailCell(r.detail)}</td>
        </tr>`,
    );
    const next =
      result.next_cursor === null
        ? ''
        : html`<p>
            <a href="${href(['audit'], { ...filters, tenant: caller.tenant_id, cursor: result.next_cursor })}"
              >Older rows</a
            >
          </p>`;
    const body = html`${tenantPicker(tenantsOf(request), caller.tenant_id, 'audit')}${form}
      <section id="audit">
        ${
          rows.length === 0
            ? html`<p>No row matches.</p>`
            : html`<table class="audit">
                <thead>
                  <tr>
                    <th>At</th>
                    <th>Action</th>
                    <th>Outcome</th>
                    <th>Who</th>
                    <th>Tool</th>
                    <th>Subject</th>
                    <th>Detail</th>
                  </tr>
                </thead>
                <tbody>
                  ${rows}
                </tbody>
              </table>`
        }${next}
      </section>`;
    return send(reply, 200, page(request, 'Audit log', body));
  });
}

/** A row's detail: a one-line preview that opens onto the whole JSON. */
function detailCell(detail: unknown): SafeHtml {
  if (detail === null || detail === undefined) return html``;
  const flat = JSON.stringify(detail);
  if (flat === '{}') return html`<span class="muted">{}</span>`;
  const preview = flat.length > 60 ? `${flat.slice(0, 60)}…` : flat;
  return html`<details>
    <summary>${visible(preview)}</summary>
    <pre>${visible(JSON.stringify(detail, null, 2))}</pre>
  </details>`;
}
