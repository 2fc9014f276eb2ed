/**
 * The review queue of one tenant, grouped by reason, with the actions each operation's state allows: retry
 * only when its recorded provider contact proves it safe (and only if nothing moved since the page was
 * rendered: the attempt and reason shown are sent back as the expectation), resolve as succeeded with the
 * provider's receipt, resolve as failed, compensate; each with a reason, and each refused when the attempt or
 * reason shown no longer holds. A bulk retry for one reason retries the safe operations the page showed with
 * that reason (their ids and attempts are in the form), one by one through the same `Review` calls, each
 * checked again under its row lock; anything not shown, or moved since, is left.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { listInReview, type Expectation, type InReview, type Review } from '../../../reconciler/index.js';
import { holds } from '../../api/auth.js';
import type { ApiDeps, Caller } from '../../api/types.js';
import { href, html } from '../html.js';
import { csrfField, doneNotice, page, send, tenantPicker } from '../layout.js';
import { form } from '../form.js';
import { callerIn, tenantsOf } from '../session.js';
import { pickTenant } from './operations.js';

const ACTIONS = ['retry', 'resolve-succeeded', 'resolve-failed', 'compensate'] as const;
type Action = (typeof ACTIONS)[number];

function reviewOf(deps: ApiDeps): Review {
  if (deps.review === undefined) throw new ActionLedgerError('internal', 'review actions are not configured here');
  return deps.review;
}

function reviewer(deps: ApiDeps, request: FastifyRequest, tenant: string): Caller {
  const caller = callerIn(request, tenant);
  if (!holds(deps, caller, 'review'))
    throw new ActionLedgerError('permission_denied', 'none of your roles may review', {
      details: { capability: 'review' },
    });
  request.caller = caller;
  return caller;
}

function row(request: FastifyRequest, tenant: string, o: InReview, mayReview: boolean) {
  // Every action carries the attempt and review reason shown, checked again under the row lock.
  const act = (a: Action, label: string, extra: ReturnType<typeof html> | string = '') =>
    html`<form method="post" action="${href(['review', tenant, o.operation_id, a])}">
      ${csrfField(request)}<input type="hidden" name="attempt" value="${o.attempt}" /><input
        type="hidden"
        name="review_reason"
        value="${o.review_reason}"
      />${extra}
      <label>Reason <input name="reason" required maxlength="2000" /></label>
      <button type="submit">${label}</button>
    </form>`;
  const actions = !mayReview
    ? html``
    : html`${o.retry_safe ? act('retry', 'Retry') : html`<p>Retry is not safe: the provider may have received it.</p>`}
        <details>
          <summary>Resolve or compensate</summary>
          ${act('resolve-succeeded', 'Resolve succeeded', html`<label>Provider receipt <input name="receipt" required maxlength="256" /></label>`)}
          ${act('resolve-failed', 'Resolve failed')} ${act('compensate', 'Compensate')}
        </details>`;
  return html`<tr>
    <td data-label="Operation"><a href="${href(['operations', tenant, o.operation_id])}">${o.operation_id}</a></td>
    <td data-label="Tool">${o.tool_name}</td>
    <td data-label="In review since">${o.entered_review_at} (attempt ${o.attempt})</td>
    <td data-label="Provider contact">${o.provider_contact}</td>
    <td data-label="Actions">${actions}</td>
  </tr>`;
}

export function registerReviewPages(app: FastifyInstance, deps: ApiDeps): void {
  registerQueue(app, deps);
  registerBulkRetry(app, deps);
  registerAction(app, deps);
}

/** The notices a review action may leave on the queue, by code. */
const DONE: Readonly<Record<string, string>> = {
  retried: 'retry: the operation moved from needs_review to pending; it will be dispatched again.',
  succeeded: 'resolve-succeeded: the operation is recorded as succeeded.',
  failed: 'resolve-failed: the operation is recorded as failed; earlier steps of its task are compensated.',
  compensating: 'compensate: a compensation operation was started; the operation is compensating.',
  escalated: 'compensate: no compensation could be started; the operation is back in review with the cause.',
  bulk_retried:
    'Bulk retry: every shown operation still safe and unchanged was retried; anything else stays in review below.',
  bulk_none: 'Bulk retry: nothing was retried (each shown operation had moved on or was not safe).',
};

function doneCode(action: Action, to: string): string {
  if (action === 'retry') return 'retried';
  if (action === 'compensate') return to === 'compensating' ? 'compensating' : 'escalated';
  return action === 'resolve-succeeded' ? 'succeeded' : 'failed';
}

function registerQueue(app: FastifyInstance, deps: ApiDeps): void {
  app.get<{ Querystring: { tenant?: string; done?: string } }>(
    '/review',
    { config: { console: 'session' } },
    async (request, reply) => {
      const caller = pickTenant(
        deps,
        request,
        request.query.tenant,
        (c) => holds(deps, c, 'read') || holds(deps, c, 'review'),
      );
      const mayReview = holds(deps, caller, 'review');
      const listing = await listInReview(deps.config, deps.pool, { tenant: caller.tenant_id, limit: 500 });
      const groups = new Map<string, InReview[]>();
      for (const o of listing.operations) groups.set(o.review_reason, [...(groups.get(o.review_reason) ?? []), o]);
      const sections = [...groups].map(
        ([reason, ops]) =>
          html`<section class="group">
            <h2>${reason} <small>(${ops.length})</small></h2>
            ${
              mayReview && ops.some((o) => o.retry_safe)
                ? html`<form method="post" action="${href(['review', caller.tenant_id, 'bulk-retry'])}">
                    ${csrfField(request)}<input type="hidden" name="review_reason" value="${reason}" /><input
                      type="hidden"
                      name="operations"
                      value="${ops.map((o) => `${o.operation_id}:${o.attempt}`).join(' ')}"
                    />
                    <label>Reason <input name="reason" required maxlength="2000" /></label>
                    <button type="submit">
                      Retry every safe one with this reason (${ops.filter((o) => o.retry_safe).length})
                    </button>
                  </form>`
                : ''
            }
            <table>
              <thead>
                <tr>
                  <th>Operation</th>
                  <th>Tool</th>
                  <th>In review since</th>
                  <th>Provider contact</th>
                  <th>Actions</th>
                </tr>
              </thead>
              <tbody>
                ${ops.map((o) => row(request, caller.tenant_id, o, mayReview))}
              </tbody>
            </table>
          </section>`,
      );
      const body = html`${tenantPicker(tenantsOf(request), caller.tenant_id, 'review')}
        ${doneNotice(DONE, request.query.done)}
        <section id="review" data-live>
          ${sections.length === 0 ? html`<p>Nothing is in review.</p>` : sections}
          ${listing.truncated ? html`<p>Only the first ${listing.operations.length} of ${listing.total} are shown.</p>` : ''}
        </section>`;
      return send(reply, 200, page(request, 'Review', body));
    },
  );
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * The operations a bulk-retry form showed, as `ID:ATTEMPT` separated by spaces (at most 500, each once).
 * Throws `invalid_request` (details.field `operations`).
 */
function shownOperations(raw: string | undefined): { id: string; attempt: number }[] {
  const bad = (why: string) =>
    new ActionLedgerError('invalid_request', `the operations shown ${why}`, { details: { field: 'operations' } });
  const parts = (raw ?? '').split(' ').filter((p) => p !== '');
  if (parts.length === 0) throw bad('are missing: reload the page and try again');
  if (parts.length > 500) throw bad('are more than 500');
  const out = new Map<string, number>();
  for (const p of parts) {
    const m = /^([0-9a-f-]{36}):([1-9][0-9]{0,8})$/.exec(p);
    if (m === null || !UUID.test(m[1] ?? '') || out.has(m[1] ?? '')) throw bad('are malformed');
    out.set(m[1] ?? '', Number(m[2]));
  }
  return [...out].map(([id, attempt]) => ({ id, attempt }));
}

function registerBulkRetry(app: FastifyInstance, deps: ApiDeps): void {
  app.post<{ Params: { tenant: string } }>(
    '/review/:tenant/bulk-retry',
    { config: { console: 'session' } },
    async (request, reply) => {
      const f = form(request);
      const caller = reviewer(deps, request, request.params.tenant);
      const reason = (f.reason ?? '').trim();
      const which = f.review_reason ?? '';
      if (reason === '' || which === '')
        throw new ActionLedgerError('invalid_request', 'a bulk retry needs the review reason and your reason', {
          details: { field: 'reason' },
        });
      const shown = shownOperations(f.operations);
      const listing = await listInReview(deps.config, deps.pool, { tenant: caller.tenant_id, limit: 500 });
      const now = new Map(listing.operations.map((o) => [o.operation_id, o]));
      let retried = 0;
      for (const { id, attempt } of shown) {
        const o = now.get(id);
        // Only what the page showed, as it showed it; anything that moved since is left for a person.
        if (o === undefined || !o.retry_safe || o.attempt !== attempt || o.review_reason !== which) continue;
        try {
          await reviewOf(deps).retry(id, {
            actor: caller.principal_id,
            tenant: caller.tenant_id,
            requestId: request.id,
            reason,
            expect: { attempt, reviewReason: which },
          });
          retried++;
        } catch {
          // moved on since it was listed, or refused: it stays for a person to look at
        }
      }
      return reply.redirect(
        href(['review'], { tenant: caller.tenant_id, done: retried > 0 ? 'bulk_retried' : 'bulk_none' }),
        303,
      );
    },
  );
}

/** The attempt and review reason a review form showed. Throws `invalid_request` when either is missing or malformed. */
function expectationOf(f: Record<string, string>): Expectation {
  const attempt = f.attempt ?? '';
  const reviewReason = f.review_reason ?? '';
  if (!/^[1-9][0-9]{0,8}$/.test(attempt))
    throw new ActionLedgerError('invalid_request', 'the form must say which attempt it shows', {
      details: { field: 'attempt' },
    });
  if (reviewReason === '')
    throw new ActionLedgerError('invalid_request', 'the form must say which review reason it shows', {
      details: { field: 'review_reason' },
    });
  return { attempt: Number(attempt), reviewReason };
}

function registerAction(app: FastifyInstance, deps: ApiDeps): void {
  app.post<{ Params: { tenant: string; id: string; action: string } }>(
    '/review/:tenant/:id/:action',
    { config: { console: 'session' } },
    async (request, reply) => {
      const f = form(request);
      const caller = reviewer(deps, request, request.params.tenant);
      const action = request.params.action as Action;
      if (!ACTIONS.includes(action)) throw new ActionLedgerError('not_found', 'no such review action');
      const input = {
        actor: caller.principal_id,
        tenant: caller.tenant_id,
        requestId: request.id,
        reason: f.reason ?? '',
      };
      const r = reviewOf(deps);
      const id = request.params.id;
      const expect = expectationOf(f);
      const result =
        action === 'retry'
          ? await r.retry(id, { ...input, expect })
          : action === 'resolve-succeeded'
            ? await r.resolveSucceeded(id, { ...input, expect, receipt: f.receipt ?? '' })
            : action === 'resolve-failed'
              ? await r.resolveFailed(id, { ...input, expect })
              : await r.compensate(id, { ...input, expect });
      return reply.redirect(href(['review'], { tenant: caller.tenant_id, done: doneCode(action, result.to) }), 303);
    },
  );
}
