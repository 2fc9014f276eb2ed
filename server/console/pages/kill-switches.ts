/**
 * Kill switches (capability `kill_switch`): the switches engaged in the person's tenants with what each holds,
 * engage (tool and tenant picked from the configured ones: a list, never free text, and the gate refuses a
 * target no route declares anyway) and lift, each with a reason. Engaging and lifting are the gate's calls,
 * audited there; the reason of a lift is recorded in this request's audit row.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { KillSwitchRow } from '../../../gate/index.js';
import { ActionLedgerError } from '../../../core/errors.js';
import { TenantLedgerView } from '../../../ledger/index.js';
import { listInReview } from '../../../reconciler/index.js';
import { holds } from '../../api/auth.js';
import type { ApiDeps } from '../../api/types.js';
import { href, html, type SafeHtml } from '../html.js';
import { ago, csrfField, doneNotice, notice, page, send } from '../layout.js';
import { form } from '../form.js';
import { callerIn, tenantsOf } from '../session.js';

/** The tools routed for a tenant (the switch targets the gate accepts), and `*` for all of them. */
function targets(deps: ApiDeps, tenant: string): string[] {
  return [...deps.config.tools.values()].filter((r) => r.allowedTenants.has(tenant)).map((r) => r.tool);
}

export function registerKillSwitchPages(app: FastifyInstance, deps: ApiDeps): void {
  registerSwitchList(app, deps);
  registerSwitchChanges(app, deps);
}

/** The notices a change may leave on the list, by code. */
const DONE = {
  engaged: 'The kill switch is engaged: calls of that tool are refused and its pending operations are held.',
  lifted: 'The kill switch is lifted.',
  not_engaged: 'No such kill switch was engaged; nothing changed.',
} as const;

function registerSwitchList(app: FastifyInstance, deps: ApiDeps): void {
  app.get<{ Querystring: { done?: string } }>(
    '/kill-switches',
    { config: { console: 'session' } },
    async (request, reply) => {
      const tenants = tenantsOf(request).filter((t) => holds(deps, callerIn(request, t), 'kill_switch'));
      if (tenants.length === 0)
        throw new ActionLedgerError('permission_denied', 'none of your roles may use kill switches');
      const all = await deps.gate.killSwitches();
      const engaged = all.filter((s) => s.tenant_id === '*' || tenants.includes(s.tenant_id));
      const held = new Map<string, number>();
      for (const t of tenants) {
        const l = await listInReview(deps.config, deps.pool, {
          tenant: t,
          reason: 'final_check:tool_disabled',
          limit: 1,
        });
        held.set(t, l.total);
      }
      const rows = switchRows(request, engaged, await holdings(deps, engaged, tenants));
      const body = html`${doneNotice(DONE, request.query.done)}
        <section id="switches" data-live>
          ${
            rows.length === 0
              ? html`<p>No kill switch is engaged.</p>`
              : html`<table>
                  <thead>
                    <tr>
                      <th>Tenant</th>
                      <th>Tool</th>
                      <th>Engaged</th>
                      <th>Reason</th>
                      <th>Holds</th>
                      <th>Lift</th>
                    </tr>
                  </thead>
                  <tbody>
                    ${rows}
                  </tbody>
                </table>`
          }
          <p>
            Held in review by a switch (final_check:tool_disabled):
            ${tenants.map((t) => html`${t}: ${held.get(t) ?? 0} `)}
          </p>
        </section>
        <h2>Engage</h2>
        <form method="post" action="/console/kill-switches/engage">
          ${csrfField(request)}
          <label
            >Tenant
            <select name="tenant" required>
              ${tenants.length > 1 ? html`<option value="" selected disabled>Choose the tenant</option>` : ''}
              ${tenants.map((t) => html`<option>${t}</option>`)}
            </select></label
          >
          <label
            >Tool
            <select name="tool" required>
              <option value="" selected disabled>Choose the tool to stop</option>
              ${[...new Set(tenants.flatMap((t) => targets(deps, t)))].map((t) => html`<option>${t}</option>`)}
              <option value="*">* (every tool of the tenant)</option>
            </select></label
          >
          <label>Reason <input name="reason" required maxlength="1000" /></label>
          <p class="muted">The next page says what it stops and asks you to confirm; nothing is engaged before.</p>
          <button type="submit" class="danger">Engage…</button>
        </form>`;
      return send(reply, 200, page(request, 'Kill switches', body));
    },
  );
}

function registerSwitchChanges(app: FastifyInstance, deps: ApiDeps): void {
  app.post('/kill-switches/:verb', { config: { console: 'session' } }, async (request, reply) => {
    const verb = (request.params as { verb: string }).verb;
    if (verb !== 'engage' && verb !== 'lift') throw new ActionLedgerError('not_found', 'no such action');
    const f = form(request);
    const caller = callerIn(request, f.tenant ?? '');
    if (!holds(deps, caller, 'kill_switch'))
      throw new ActionLedgerError('permission_denied', 'none of your roles may use kill switches');
    request.caller = caller;
    const tool = f.tool ?? '';
    if (tool !== '*' && !targets(deps, caller.tenant_id).includes(tool))
      throw new ActionLedgerError('unknown_tool', 'there is no such tool for this tenant (or * for every tool)', {
        details: { field: 'tool' },
      });
    const reason = (f.reason ?? '').trim();
    if (reason === '' || /[\p{Cc}\p{Cf}]/u.test(reason))
      throw new ActionLedgerError('invalid_request', 'give a reason (no control characters)', {
        details: { field: 'reason' },
      });
    if (verb === 'engage' && f.confirm !== 'yes')
      return confirmEngage(deps, request, reply, caller.tenant_id, tool, reason);
    let done: keyof typeof DONE;
    if (verb === 'engage') {
      await deps.gate.engageKillSwitch(caller.tenant_id, tool, caller.principal_id, reason);
      done = 'engaged';
    } else {
      const lifted = await deps.gate.liftKillSwitch(caller.tenant_id, tool, caller.principal_id);
      await deps.audit.after({
        action: 'kill_switch',
        outcome: lifted ? 'lift_reason' : 'not_engaged',
        context: { tenant_id: caller.tenant_id, principal_id: caller.principal_id, trace_id: request.id },
        tool,
        detail: { reason },
      });
      done = lifted ? 'lifted' : 'not_engaged';
    }
    return reply.redirect(href(['kill-switches'], { done }), 303);
  });
}

/**
 * The step between choosing and engaging: what the switch would stop (the tool, or every tool, in the tenant)
 * and how many pending operations it would hold now, with the same fields and `confirm=yes` to engage it.
 */
async function confirmEngage(
  deps: ApiDeps,
  request: FastifyRequest,
  reply: FastifyReply,
  tenant: string,
  tool: string,
  reason: string,
): Promise<FastifyReply> {
  const [held] = await holdings(deps, [{ tenant_id: tenant, tool_name: tool } as KillSwitchRow], [tenant]);
  const what = tool === '*' ? html`<strong>every tool</strong>` : html`the tool <strong>${tool}</strong>`;
  const body = html`<section class="confirm" id="confirm">
    <p>
      Engaging stops ${what} in the tenant <strong>${tenant}</strong>: its calls are refused at once, and the
      <strong id="confirm-held">${held ?? '0 pending'}</strong> operation(s) waiting to be dispatched are held (put in
      review as final_check:tool_disabled when a dispatcher reaches them) until the switch is lifted.
    </p>
    <p>Reason: ${reason}</p>
    <form method="post" action="/console/kill-switches/engage">
      ${csrfField(request)}<input type="hidden" name="tenant" value="${tenant}" /><input
        type="hidden"
        name="tool"
        value="${tool}"
      /><input type="hidden" name="reason" value="${reason}" /><input type="hidden" name="confirm" value="yes" />
      <button type="submit" id="confirm-engage" class="danger">
        Engage: stop ${tool === '*' ? 'every tool' : tool} in ${tenant}
      </button>
      <a href="/console/kill-switches">Cancel</a>
    </form>
  </section>`;
  return send(
    reply,
    200,
    page(request, 'Engage a kill switch?', html`${notice('warn', 'Nothing is engaged yet.')}${body}`),
  );
}

/**
 * What each switch holds: the pending operations of its tool (every tool for `*`) in its tenant (the person's
 * tenants for a `*` tenant switch), counted up to 200 a tenant.
 */
async function holdings(deps: ApiDeps, engaged: KillSwitchRow[], tenants: string[]): Promise<string[]> {
  const view = new TenantLedgerView(deps.pool, deps.config.schemaQuoted);
  const out: string[] = [];
  for (const s of engaged) {
    let n = 0;
    let more = false;
    for (const t of s.tenant_id === '*' ? tenants : [s.tenant_id]) {
      const page = await view.list(
        t,
        { status: 'pending', tool: s.tool_name === '*' ? undefined : s.tool_name },
        { limit: 200 },
      );
      n += page.operations.length;
      more ||= page.next_cursor !== null;
    }
    out.push(`${n}${more ? '+' : ''} pending`);
  }
  return out;
}

function switchRows(request: FastifyRequest, engaged: KillSwitchRow[], holds: string[]): SafeHtml[] {
  return engaged.map(
    (s, i) =>
      html`<tr>
        <td data-label="Tenant">${s.tenant_id}</td>
        <td data-label="Tool">${s.tool_name}</td>
        <td data-label="Engaged">${ago(s.engaged_at)} by ${s.engaged_by}</td>
        <td data-label="Reason">${s.reason}</td>
        <td data-label="Holds">${holds[i] ?? ''}</td>
        <td data-label="Lift">
          ${
            s.tenant_id === '*'
              ? 'the operator’s (command line)'
              : html`<form method="post" action="/console/kill-switches/lift">
                  ${csrfField(request)}<input type="hidden" name="tenant" value="${s.tenant_id}" /><input
                    type="hidden"
                    name="tool"
                    value="${s.tool_name}"
                  />
                  <label>Reason <input name="reason" required maxlength="1000" /></label
                  ><button type="submit">Lift</button>
                </form>`
          }
        </td>
      </tr>`,
  );
}
