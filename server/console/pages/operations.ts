/**
 * Operations of one tenant (capability `read`): the list, newest first, filtered by state, tool, principal
 * and task and paged with the ledger's cursor; one operation with its history as a timeline (each entry's
 * recorded detail: authorization evidence, dispatch outcomes, the reconciler's readbacks), its stored
 * arguments and the provider's receipt. Reads go through the ledger's tenant view, as the API's do.
 */
import type { FastifyInstance } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { identifier } from '../../../core/identifier.js';
import { OPERATION_STATUSES, type OperationStatus } from '../../../core/types.js';
import { operationCursorBefore, TenantLedgerView, type OperationRecords } from '../../../ledger/index.js';
import { holds } from '../../api/auth.js';
import type { ApiDeps, Caller } from '../../api/types.js';
import { href, html, text, visible, type SafeHtml } from '../html.js';
import { ago, page, send, tenantPicker } from '../layout.js';
import { callerIn, tenantsOf } from '../session.js';

type Query = {
  tenant?: string;
  status?: string;
  tool?: string;
  principal?: string;
  task?: string;
  since?: string;
  before?: string;
  cursor?: string;
};

/** The tenant a page shows: the one asked for, else the first the person may use the capability in. */
export function pickTenant(
  deps: ApiDeps,
  request: Parameters<typeof callerIn>[0],
  asked: string | undefined,
  ok: (c: Caller) => boolean,
): Caller {
  if (asked !== undefined && asked !== '') {
    const c = callerIn(request, asked);
    if (!ok(c)) throw new ActionLedgerError('permission_denied', `none of your roles in ${asked} may see this`);
    return c;
  }
  for (const t of tenantsOf(request)) {
    const c = callerIn(request, t);
    if (ok(c)) return c;
  }
  throw new ActionLedgerError('permission_denied', 'none of your roles in any tenant may see this');
}

/** A `datetime-local` value (or a full ISO time), read as UTC; absent stays absent. Throws `invalid_request`. */
function utcTime(field: string, v: string | undefined): Date | undefined {
  if (v === undefined || v === '') return undefined;
  const m = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,3})?)?(Z|[+-]\d{2}:\d{2})?$/.exec(v);
  const d = m === null ? null : new Date(m[3] === undefined ? `${v}Z` : v);
  if (d === null || Number.isNaN(d.getTime()))
    throw new ActionLedgerError('invalid_request', `${field} must be a time like 2026-01-31T09:00 (UTC)`, {
      details: { field },
    });
  return d;
}

const opt = (field: string, v: string | undefined) => (v === undefined || v === '' ? undefined : identifier(field, v));

export function registerOperationPages(app: FastifyInstance, deps: ApiDeps): void {
  const view = new TenantLedgerView(deps.pool, deps.config.schemaQuoted);
  registerList(app, deps, view);
  registerShow(app, deps, view);
}

function registerList(app: FastifyInstance, deps: ApiDeps, view: TenantLedgerView): void {
  app.get<{ Querystring: Query }>('/operations', { config: { console: 'session' } }, async (request, reply) => {
    const q = request.query;
    const caller = pickTenant(deps, request, q.tenant, (c) => holds(deps, c, 'read'));
    const status = q.status === undefined || q.status === '' ? undefined : (q.status as OperationStatus);
    if (status !== undefined && !OPERATION_STATUSES.includes(status))
      throw new ActionLedgerError('invalid_request', 'no such state', { details: { field: 'status' } });
    const since = utcTime('since', q.since);
    const before = utcTime('before', q.before);
    const cursor =
      q.cursor !== undefined && q.cursor !== ''
        ? q.cursor
        : before === undefined
          ? undefined
          : operationCursorBefore(before);
    const pageOf = await view.list(
      caller.tenant_id,
      { status, tool: opt('tool', q.tool), principal_id: opt('principal', q.principal), task_id: opt('task', q.task) },
      { limit: 50, cursor },
    );
    // Newest first: once a row is older than `since`, so is every row after it.
    if (since !== undefined && pageOf.operations.some((o) => new Date(o.created_at) < since)) {
      pageOf.operations = pageOf.operations.filter((o) => new Date(o.created_at) >= since);
      pageOf.next_cursor = null;
    }
    const filters = filterForm(deps, caller.tenant_id, q, status);
    const rows = pageOf.operations.map(
      (o) =>
        html`<tr>
          <td data-label="Reserved">
            <a href="${href(['operations', caller.tenant_id, o.operation_id])}">${ago(o.created_at)}</a>
          </td>
          <td data-label="State">${o.status}${o.review_reason === null ? '' : ` (${o.review_reason})`}</td>
          <td data-label="Tool">${o.tool_name}</td>
          <td data-label="Principal">${o.principal_id}</td>
          <td data-label="Task / step">${o.task_id} / ${o.workflow_step_id}</td>
          <td data-label="Attempt">${o.attempt}</td>
        </tr>`,
    );
    const next =
      pageOf.next_cursor === null
        ? ''
        : html`<p>
            <a href="${href(['operations'], { ...q, tenant: caller.tenant_id, cursor: pageOf.next_cursor })}"
              >Older operations</a
            >
          </p>`;
    const body = html`${tenantPicker(tenantsOf(request), caller.tenant_id, 'operations')}${filters}
      <section id="operations" data-live>
        ${
          rows.length === 0
            ? html`<p>No operation matches.</p>`
            : html`<table>
                <thead>
                  <tr>
                    <th>Reserved</th>
                    <th>State</th>
                    <th>Tool</th>
                    <th>Principal</th>
                    <th>Task / step</th>
                    <th>Attempt</th>
                  </tr>
                </thead>
                <tbody>
                  ${rows}
                </tbody>
              </table>`
        }${next}
      </section>`;
    return send(reply, 200, page(request, 'Operations', body));
  });
}

/** The list's filters, as a GET form (so a filtered list is a link). */
function filterForm(deps: ApiDeps, tenant: string, q: Query, status: OperationStatus | undefined): SafeHtml {
  const tools = [...deps.config.tools.keys()];
  return html`<form class="filters" method="get" action="/console/operations">
    <input type="hidden" name="tenant" value="${tenant}" />
    <label
      >State
      <select name="status">
        <option value="">any</option>
        ${OPERATION_STATUSES.map((s) => html`<option ${s === status ? html`selected` : ''}>${s}</option>`)}
      </select></label
    >
    <label
      >Tool
      <select name="tool">
        <option value="">any</option>
        ${tools.map((t) => html`<option ${t === q.tool ? html`selected` : ''}>${t}</option>`)}
      </select></label
    >
    <label>Principal <input name="principal" value="${q.principal ?? ''}" /></label>
    <label>Task <input name="task" value="${q.task ?? ''}" /></label>
    <label>Reserved since (UTC) <input type="datetime-local" name="since" value="${q.since ?? ''}" /></label>
    <label>Reserved before (UTC) <input type="datetime-local" name="before" value="${q.before ?? ''}" /></label>
    <button type="submit">Filter</button>
  </form>`;
}

/** The authorization evidence recorded before each send, and the reconciler's readbacks. */
function recordsOf(r: OperationRecords): SafeHtml {
  return html`<h2>Authorization evidence</h2>
    ${
      r.evidence.length === 0
        ? html`<p id="evidence">None recorded (never sent to the provider).</p>`
        : html`<ul id="evidence">
            ${r.evidence.map(
              (e) =>
                html`<li>
                  attempt ${e.attempt}: allowed at ${ago(e.authorized_at)} until ${ago(e.expires_at)}, approval
                  ${e.approval_id}, policy ${e.policy_version}, arguments sha256
                  <span class="hash">${e.args_sha256}</span>, decision sha256
                  <span class="hash">${e.decision_sha256}</span>
                </li>`,
            )}
          </ul>`
    }
    <h2>Reconciliation checks</h2>
    ${
      r.checks.length === 0
        ? html`<p id="checks">None: the provider was never asked to read this back.</p>`
        : html`<ul id="checks">
            ${r.checks.map(
              (c) =>
                html`<li>
                  ${ago(c.at)}, attempt ${c.attempt}, from ${c.from_status}: <strong>${c.outcome}</strong> by ${c.actor}
                  ${text(c.detail) === '{}' ? '' : html`<pre>${visible(JSON.stringify(c.detail, null, 2))}</pre>`}
                </li>`,
            )}
          </ul>`
    }`;
}

function registerShow(app: FastifyInstance, deps: ApiDeps, view: TenantLedgerView): void {
  app.get<{ Params: { tenant: string; id: string } }>(
    '/operations/:tenant/:id',
    { config: { console: 'session' } },
    async (request, reply) => {
      const caller = callerIn(request, request.params.tenant);
      const found = await view.show(caller.tenant_id, request.params.id);
      if (!holds(deps, caller, 'read') && found.operation.principal_id !== caller.principal_id)
        throw new ActionLedgerError('not_found', 'no such operation');
      const op = found.operation;
      const records = await view.records(caller.tenant_id, request.params.id);
      const body = html`<section id="operation" data-live>
        <dl>
          <dt>State</dt>
          <dd id="op-status">${text(op.status)}</dd>
          <dt>Review reason</dt>
          <dd>${op.review_reason == null ? '—' : text(op.review_reason)}</dd>
          <dt>Tool / provider</dt>
          <dd>${text(op.tool_name)} → ${text(op.provider_id)} (${text(op.provider_endpoint)})</dd>
          <dt>Principal</dt>
          <dd>${text(op.principal_id)}</dd>
          <dt>Task / step</dt>
          <dd>${text(op.task_id)} / ${text(op.workflow_step_id)}</dd>
          <dt>Approval / policy</dt>
          <dd>${text(op.current_approval_id)} / ${text(op.current_policy_version)}</dd>
          <dt>Effect key</dt>
          <dd class="hash">${text(op.effect_key)}</dd>
          <dt>Arguments sha256</dt>
          <dd class="hash">${text(op.canonical_args_sha256)}</dd>
          <dt>Attempt</dt>
          <dd>${text(op.attempt)}</dd>
          <dt>Provider receipt</dt>
          <dd id="receipt">${op.provider_receipt == null ? 'none' : text(op.provider_receipt)}</dd>
        </dl>
        <h2>Arguments, as stored and sent</h2>
        <pre>${visible(JSON.stringify(op.arguments_json, null, 2))}</pre>
        <h2>Timeline</h2>
        <ol class="timeline">
          ${found.history.map(
            (h) =>
              html`<li>
                <strong>${ago(h.at)}</strong> ${h.from_status ?? 'reserved'} → <strong>${h.to_status}</strong> by
                ${h.actor}: ${h.reason}
                ${h.detail === null || (typeof h.detail === 'object' && Object.keys(h.detail).length === 0) ? '' : html`<pre>${visible(JSON.stringify(h.detail, null, 2))}</pre>`}
              </li>`,
          )}
        </ol>
        ${recordsOf(records)}
        <h2>Result</h2>
        <pre>${visible(op.result_json == null ? 'none' : JSON.stringify(op.result_json, null, 2))}</pre>
      </section>`;
      return send(reply, 200, page(request, `Operation ${request.params.id}`, body));
    },
  );
}
