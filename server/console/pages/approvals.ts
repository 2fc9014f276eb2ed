/**
 * Approvals: the pending list of every tenant the person may see approvals in (newest first, refreshed in
 * place), one approval with its exact stored envelope, and the decisions. "Approve" posts the sha256 of the
 * envelope rendered on the page (computed from the very object displayed, and checked equal to the stored
 * hash before the button is offered); the gate approves only when it matches what is stored. Whether the
 * person may decide, and whether the approval still holds today, is shown before they try.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { canonicalJson, sha256Hex, type JsonObject } from '../../../core/json.js';
import { hiddenInJson } from '../../../core/visible-text.js';
import { listApprovals, type ApprovalBlocker, type ApprovalSummary, type GateResult } from '../../../gate/index.js';
import { TenantLedgerView } from '../../../ledger/index.js';
import { holds } from '../../api/auth.js';
import { httpStatus } from '../../api/errors.js';
import type { ApiDeps, Caller } from '../../api/types.js';
import { explain } from '../explain.js';
import { href, html, text, visible, type SafeHtml } from '../html.js';
import { ago, csrfField, notice, page, send } from '../layout.js';
import { money, type Money } from '../money.js';
import { form } from '../form.js';
import { callerIn, tenantsOf } from '../session.js';

type Params = { tenant: string; id: string };

/** The tools whose approvals the caller may see in its tenant: null for all (`read`). */
function visibleTools(deps: ApiDeps, caller: Caller): string[] | null {
  if (holds(deps, caller, 'read')) return null;
  return decidable(deps, caller);
}

function decidable(deps: ApiDeps, caller: Caller): string[] {
  return [...deps.config.gate.tools.values()]
    .filter((t) => caller.roles.some((r) => t.approverRoles.has(r)))
    .map((t) => t.name);
}

/** The role the person decides a tool's approvals with: the first they hold among its approver roles. */
function approverRole(deps: ApiDeps, caller: Caller, tool: string): string | undefined {
  const t = deps.config.gate.tools.get(tool);
  return t === undefined ? undefined : caller.roles.find((r) => t.approverRoles.has(r));
}

/** The amount of the tool's value argument (minor units) in its currency, or null for a tool without one. */
function amountOf(deps: ApiDeps, tool: string, envelope: JsonObject): Money | null {
  const value = deps.config.gate.tools.get(tool)?.value;
  if (value == null) return null;
  const args = (envelope.arguments ?? {}) as JsonObject;
  const currency = value.currencyArgument === null ? (value.currency ?? '') : text(args[value.currencyArgument] ?? '');
  return money(args[value.argument], currency);
}

function moneyCell(m: Money | null): SafeHtml {
  if (m === null) return html``;
  return html`<span class="money">${visible(m.major)} <small>(${m.minor})</small></span>`;
}

function timeLeft(expires: string | Date): string {
  const s = Math.round((new Date(expires).getTime() - Date.now()) / 1000);
  if (s <= 0) return 'expired';
  return s >= 3600
    ? `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`
    : `${Math.floor(s / 60)} min ${s % 60} s`;
}

export function registerApprovalPages(app: FastifyInstance, deps: ApiDeps): void {
  registerPendingList(app, deps);
  registerApprovalShow(app, deps);
  registerApprove(app, deps);
  registerReject(app, deps);
}

function registerPendingList(app: FastifyInstance, deps: ApiDeps): void {
  app.get('/approvals', { config: { console: 'session' } }, async (request, reply) => {
    const rows: (ApprovalSummary & { tenant: string; amount: Money | null })[] = [];
    for (const tenant of tenantsOf(request)) {
      const caller = callerIn(request, tenant);
      const tools = visibleTools(deps, caller);
      if (tools !== null && tools.length === 0) continue;
      const listed = await listApprovals(deps.pool, deps.config.schemaQuoted, {
        tenant_id: tenant,
        status: 'pending',
        tools,
        limit: 200,
      });
      for (const a of listed.approvals) {
        const view = await deps.gate.approvals.show(a.approval_id, caller);
        rows.push({ ...a, tenant, amount: amountOf(deps, a.tool_name, view.envelope) });
      }
    }
    rows.sort((a, b) => b.created_at.localeCompare(a.created_at));
    const table =
      rows.length === 0
        ? html`<p>Nothing waits for your decision.</p>`
        : html`<table>
            <thead>
              <tr>
                <th>Asked</th>
                <th>Tenant</th>
                <th>Who asked</th>
                <th>Tool</th>
                <th>Effect</th>
                <th>Amount</th>
                <th>Time left</th>
              </tr>
            </thead>
            <tbody>
              ${rows.map(
                (a) =>
                  html`<tr>
                    <td data-label="Asked">
                      <a href="${href(['approvals', a.tenant, a.approval_id])}">${ago(a.created_at)}</a>
                    </td>
                    <td data-label="Tenant">${a.tenant}</td>
                    <td data-label="Who asked">${a.requester_id} (${a.requester_role})</td>
                    <td data-label="Tool">${a.tool_name}</td>
                    <td data-label="Effect">${visible(text(a.effect))}</td>
                    <td data-label="Amount">${moneyCell(a.amount)}</td>
                    <td data-label="Time left">${a.past_ttl ? 'expired' : timeLeft(a.expires_at)}</td>
                  </tr>`,
              )}
            </tbody>
          </table>`;
    return send(
      reply,
      200,
      page(request, 'Pending approvals', html`<section id="approvals" data-live aria-live="polite">${table}</section>`),
    );
  });
}

function registerApprovalShow(app: FastifyInstance, deps: ApiDeps): void {
  app.get<{ Params: Params; Querystring: { done?: string } }>(
    '/approvals/:tenant/:id',
    { config: { console: 'session' } },
    async (request, reply) => send(reply, 200, await approvalPage(deps, request, request.params, request.query.done)),
  );
}

function registerApprove(app: FastifyInstance, deps: ApiDeps): void {
  app.post<{ Params: Params }>(
    '/approvals/:tenant/:id/approve',
    { config: { console: 'session' } },
    async (request, reply) => {
      const f = form(request);
      const { caller, role } = await decider(deps, request, request.params);
      const hash = f.envelope_sha256 ?? '';
      if (!/^[0-9a-f]{64}$/.test(hash))
        throw new ActionLedgerError('invalid_request', 'the approval form carries no envelope hash', {
          details: { field: 'envelope_sha256' },
        });
      const r = await deps.gate.approve(
        request.params.id,
        hash,
        { tenant_id: caller.tenant_id, principal_id: caller.principal_id, role },
        { acknowledgeHiddenCharacters: f.acknowledge_hidden_characters === 'yes' },
      );
      return decided(deps, request, reply, r);
    },
  );
}

function registerReject(app: FastifyInstance, deps: ApiDeps): void {
  app.post<{ Params: Params }>(
    '/approvals/:tenant/:id/reject',
    { config: { console: 'session' } },
    async (request, reply) => {
      const f = form(request);
      const { caller, role } = await decider(deps, request, request.params);
      const reason = (f.reason ?? '').trim();
      if (reason === '')
        throw new ActionLedgerError('invalid_request', 'a rejection needs a reason', { details: { field: 'reason' } });
      const r = await deps.gate.reject(
        request.params.id,
        { tenant_id: caller.tenant_id, principal_id: caller.principal_id, role },
        reason,
      );
      return decided(deps, request, reply, r);
    },
  );
}

/** The caller and the approver role it decides this approval's tool with; `permission_denied` without one. */
async function decider(deps: ApiDeps, request: FastifyRequest, p: Params): Promise<{ caller: Caller; role: string }> {
  const caller = callerIn(request, p.tenant);
  request.caller = caller; // the API's audit hook records this request with its principal
  // The tool is read with the approval (same tenant only); the gate checks the role again under its lock.
  const view = await deps.gate.approvals.show(p.id, caller);
  const role = approverRole(deps, caller, text(view.envelope.tool));
  if (role === undefined)
    throw new ActionLedgerError('permission_denied', `none of your roles here may decide ${text(view.envelope.tool)}`, {
      details: { reason: 'no_approver_role' },
    });
  return { caller, role };
}

async function decided(deps: ApiDeps, request: FastifyRequest<{ Params: Params }>, reply: FastifyReply, r: GateResult) {
  if (r.ok)
    return reply.redirect(href(['approvals', request.params.tenant, request.params.id], { done: r.status }), 303);
  const status = httpStatus(r.error);
  return send(
    reply,
    status,
    await approvalPage(deps, request, request.params, undefined, {
      html: explain({ code: r.error, message: r.message, details: r.details }),
      code: r.error,
    }),
  );
}

/**
 * The notice after one's own decision (the redirect's `done`), and the status the approval must have now for it
 * to be shown: a `done` the approval's state does not bear out (a link edited by hand, or a state that moved on
 * since) is not shown, so the page never says more than the status does.
 */
const DONE: Record<string, { text: string; status: string }> = {
  reserved: { text: 'Approved: the operation is reserved and will be dispatched.', status: 'executed' },
  pending_approvals: { text: 'Your approval is recorded; more approvers are needed.', status: 'pending' },
  approved: { text: 'Approved.', status: 'approved' },
  rejected: { text: 'Rejected.', status: 'rejected' },
};

async function approvalPage(
  deps: ApiDeps,
  request: FastifyRequest,
  p: Params,
  done?: string,
  refusal?: { html: SafeHtml; code: string },
): Promise<SafeHtml> {
  const caller = callerIn(request, p.tenant);
  const view = await deps.gate.approvals.show(p.id, caller);
  const env = view.envelope as JsonObject & {
    tool: string;
    requester: { principal_id: string; role: string };
    subject: { account_id: string; conversation_id: string };
    identity: { task_id: string; workflow_step_id: string };
    resources: { type: string; id: string; version: string }[];
  };
  const tools = visibleTools(deps, caller);
  if (tools !== null && !tools.includes(env.tool)) throw new ActionLedgerError('not_found', 'no such approval');
  const displayedHash = sha256Hex(canonicalJson(view.envelope));
  const blockers = await blockersOf(deps, caller, p.id, view.status);
  const said = notices(view.status, done, refusal, blockers, p.tenant, env.tool);
  // The gate's own check (gate/approvals.ts), on the envelope itself: the box is shown exactly when approving
  // without it would be refused (JSON text would hide a control character behind its escape).
  const hidden = hiddenInJson(view.envelope).length > 0;
  const decide =
    blockers.length > 0 || view.status !== 'pending' ? html`` : decideForms(request, p, displayedHash, hidden);
  const op = view.operation_id === null ? null : await operationStatus(deps, caller, view.operation_id);
  const amount = amountOf(deps, env.tool, view.envelope);
  const body = html` ${said.top} ${hidden ? hiddenWarning() : ''}
    <dl>
      <dt>Status</dt>
      <dd id="status">${view.status}${view.reason === null ? '' : html` (${visible(view.reason)})`}</dd>
      <dt>Tool</dt>
      <dd>${visible(env.tool)}</dd>
      <dt>Effect</dt>
      <dd>${visible(text(env.effect ?? ''))}</dd>
      ${
        amount === null
          ? ''
          : html`<dt>Amount</dt>
              <dd id="amount">${moneyCell(amount)}</dd>`
      }
      <dt>Who asked</dt>
      <dd>${visible(env.requester.principal_id)} as ${visible(env.requester.role)}</dd>
      <dt>Conversation</dt>
      <dd>${visible(env.subject.conversation_id)} (account ${visible(env.subject.account_id)})</dd>
      <dt>Task / step</dt>
      <dd>${visible(env.identity.task_id)} / ${visible(env.identity.workflow_step_id)}</dd>
      <dt>Plan version</dt>
      <dd>${visible(text(env.plan_version ?? ''))}</dd>
      <dt>Policy version</dt>
      <dd>${visible(text(env.policy_version ?? ''))}</dd>
      <dt>Bound resources</dt>
      <dd>
        ${env.resources.length === 0 ? 'none' : env.resources.map((r) => html`${visible(r.type)} ${visible(r.id)} at version ${visible(r.version)}<br />`)}
      </dd>
      <dt>Approvers</dt>
      <dd>${view.approvers.join(', ') || 'none yet'} (needs ${text(env.required_approvals ?? 1)})</dd>
      <dt>Expires</dt>
      <dd>${text(env.expires_at ?? '')} (${timeLeft(text(env.expires_at))})</dd>
      <dt>Envelope sha256</dt>
      <dd class="hash" id="hash">${view.envelope_sha256}</dd>
      ${
        op === null
          ? ''
          : html`<dt>Operation</dt>
              <dd>
                <a href="${href(['operations', p.tenant, view.operation_id ?? ''])}">${view.operation_id}</a>:
                <span id="operation-status">${op}</span>
              </dd>`
      }
    </dl>
    <h2>Arguments, exactly as stored</h2>
    <pre id="arguments">${visible(JSON.stringify(env.arguments, null, 2))}</pre>
    ${said.blockers} ${decide}
    <details>
      <summary>The whole envelope (what the hash covers)</summary>
      <pre id="envelope">${visible(JSON.stringify(view.envelope, null, 2))}</pre>
    </details>`;
  return page(request, `Approval ${p.id}`, html`<section id="approval" data-live>${body}</section>`);
}

/**
 * What the gate says stands in the way, by the approval's status: while it waits for votes, every reason the
 * person cannot decide it; once approved and not yet executed, only why it has not run (a kill switch, its time,
 * what it binds), since nobody votes on it any more; once final (executed, rejected, expired, invalidated) none:
 * the status says it, and "this approval is executed" beside it would only repeat it.
 */
/**
 * What the page says above the approval (the notice of one's own decision, when the status bears it out, or the
 * refusal of it) and the gate's blockers below it, none of them twice: not the refusal just shown again as a
 * blocker, nor "you approved this already" under the notice of that vote.
 */
function notices(
  status: string,
  done: string | undefined,
  refusal: { html: SafeHtml; code: string } | undefined,
  blockers: ApprovalBlocker[],
  tenant: string,
  tool: string,
): { top: SafeHtml; blockers: SafeHtml[] } {
  const shownDone = done === undefined ? undefined : DONE[done];
  const doneShown = shownDone !== undefined && shownDone.status === status;
  return {
    top: html`${doneShown ? notice('ok', html`<p id="done">${shownDone.text}</p>`) : ''} ${refusal?.html ?? ''}`,
    blockers: blockers
      .filter((b) => b.code !== refusal?.code && !(doneShown && b.details.reason === 'already_approved'))
      .map((b) => blockerNotice(b, tenant, tool)),
  };
}

/** Blockers about the person (who asked, who voted, which roles): moot once nobody votes on the approval. */
const PERSONAL: ReadonlySet<string> = new Set(['self_approval_forbidden', 'permission_denied']);

async function blockersOf(deps: ApiDeps, caller: Caller, id: string, status: string): Promise<ApprovalBlocker[]> {
  if (status !== 'pending' && status !== 'approved') return [];
  const all = await deps.gate.approvals.blockers(id, caller);
  return status === 'pending' ? all : all.filter((b) => !PERSONAL.has(b.code));
}

/** A warning when what is to be approved holds characters a browser would hide or reorder (see visible()). */
function hiddenWarning(): SafeHtml {
  return notice(
    'warn',
    html`<p id="hidden-chars">
      <span class="code">hidden_characters</span>: what you are asked to approve holds characters a browser would draw
      as nothing or that reorder the text around them, or text written right to left, which reorders the digits and
      words around it. Each hidden character is shown below as its code in a marked box (a control character inside the
      arguments as its JSON escape), and text with right-to-left letters left to right in the order it is stored (in a
      dashed frame); the stored value, and what would be sent, is exactly that. Approving it takes a second yes: the box
      beside Approve.
    </p>`,
  );
}

async function operationStatus(deps: ApiDeps, caller: Caller, id: string): Promise<string | null> {
  const found = await new TenantLedgerView(deps.pool, deps.config.schemaQuoted)
    .show(caller.tenant_id, id)
    .catch(() => null);
  return found === null ? null : text(found.operation.status);
}

/**
 * One reason the gate gives why the person cannot approve this now (gate/approval-blockers.ts), as the page
 * explains it: the approval's own state (`#freshness`), the requester (`#self`) or a second vote, the role
 * (`#role`), an envelope that does not hash to its record.
 */
function blockerNotice(b: ApprovalBlocker, tenant: string, tool: string): SafeHtml {
  const d = b.details;
  switch (b.code) {
    case 'reapproval_required': {
      const resources = (d.resources ?? []) as {
        type: string;
        id: string;
        approved_version: string;
        current_version: string | null;
      }[];
      return notice(
        'bad',
        html`<p>
            <span class="code" id="freshness">reapproval_required</span>: what this approval binds no longer holds
            (<span class="code">${text(d.reason)}</span>). Approving is not possible; the requester must ask again.
          </p>
          ${resources.map((r) => html`<p>${r.type} ${r.id}: approved at version ${r.approved_version}, now ${r.current_version ?? 'gone'}.</p>`)}`,
      );
    }
    case 'invalid_state_transition':
    case 'approval_expired':
    case 'tool_disabled':
    case 'config_invalid':
      return notice('bad', html`<p><span class="code" id="freshness">${b.code}</span>: ${b.message}.</p>`);
    case 'self_approval_forbidden':
      return d.reason === 'requester'
        ? notice(
            'warn',
            html`<p id="self">
              <span class="code">self_approval_forbidden</span>: you asked for this yourself (as
              ${text(d.requester_id)}). The person who asks never approves their own request; another approver must
              decide it.
            </p>`,
          )
        : notice(
            'warn',
            html`<p>
              <span class="code">self_approval_forbidden</span>: you approved this already; nobody counts twice. It
              waits for another approver.
            </p>`,
          );
    case 'permission_denied':
      return notice(
        'warn',
        html`<p id="role">
          <span class="code">permission_denied</span>: your roles in ${tenant} (${(d.roles as string[]).join(', ')}) may
          not decide ${tool}; it needs one of:
          ${(d.approver_roles as string[]).join(', ') || 'nobody (no approver role is configured)'}.
        </p>`,
      );
    default:
      return notice('bad', html`<p><span class="code">${b.code}</span>: ${b.message}.</p>`);
  }
}

/**
 * The approve form (carrying the hash of the envelope displayed; with hidden characters, a required box that
 * says the person read them by their codes) and the reject form (a reason required).
 */
function decideForms(request: FastifyRequest, p: Params, displayedHash: string, hidden: boolean): SafeHtml {
  return html`<section aria-label="Decide" class="decide">
    <h2>Decide</h2>
    <form method="post" action="${href(['approvals', p.tenant, p.id, 'approve'])}">
      ${csrfField(request)}
      <input type="hidden" name="envelope_sha256" value="${displayedHash}" />
      ${
        hidden
          ? html`<label
              ><input
                type="checkbox"
                id="acknowledge-hidden"
                name="acknowledge_hidden_characters"
                value="yes"
                required
              />
              I read the hidden characters above by their codes, and approve exactly what they say</label
            >`
          : ''
      }
      <button type="submit" id="approve" class="primary">
        Approve exactly this (sha256 ${displayedHash.slice(0, 12)}…)
      </button>
    </form>
    <form method="post" action="${href(['approvals', p.tenant, p.id, 'reject'])}">
      ${csrfField(request)}
      <label>Reason for rejecting <textarea name="reason" required maxlength="1000" rows="2"></textarea></label>
      <button type="submit" id="reject" class="danger">Reject</button>
    </form>
  </section>`;
}
