/**
 * The pipeline of one claimed operation: route check -> fresh authorization -> evidence and final check under the
 * row lock -> one provider call -> fenced outcome.
 *
 * States of one operation (the crash points' names in brackets):
 *   claimed       - [after_claim] its route, arguments hash and credential checked against today's config;
 *                   a mismatch is refused (`needs_review`), nothing sent
 *   authorizing   - a fresh decision from the authorizer over mTLS; a denial or an unusable answer is refused,
 *                   no answer (unreachable, timed out, not a 200 decision) releases it to the queue
 *   dispatching   - [after_authorization_request] in a dispatch batch (dispatcher/dispatch-batch.ts): the
 *                   decision recorded as evidence (a lost claim ends here, a refusal goes to review), locks,
 *                   final check, [after_evidence_commit] once per item the batch locked,
 *                   [after_provider_request_sent] the call, [after_response_before_outcome] the outcome write,
 *                   [after_outcome_commit]
 *   recovering    - anything it could not finish: released (never sent, transient), `unknown` (possibly sent) or
 *                   `needs_review` (dispatcher/completer.ts `recover`)
 *   done          - settled; the producer frees its slot and drops its claim from the heartbeat listing
 */
import { isActionLedgerError } from '../core/errors.js';
import { canonicalJson, sha256Hex, type JsonValue } from '../core/json.js';
import { authorizationRequest, type AuthorizationDecision } from '../protocol/index.js';
import { fetchAuthorization } from './authorize.js';
import type { Completer } from './completer.js';
import type { DispatchContext } from './context.js';
import type { DispatchBatch } from './dispatch-batch.js';
import { WorkerHalted } from './persist.js';
import type { ClaimedOperation } from './types.js';
import {
  contextOf,
  resumeSpan,
  ROOT_CONTEXT,
  SpanKind,
  startSpan,
  tracingOn,
  withSpan,
  type Span,
} from '../core/tracing.js';

export class Pipeline {
  readonly #ctx: DispatchContext;
  readonly #dispatches: DispatchBatch;
  readonly #completer: Completer;

  constructor(ctx: DispatchContext, dispatches: DispatchBatch, completer: Completer) {
    this.#ctx = ctx;
    this.#dispatches = dispatches;
    this.#completer = completer;
  }

  /** Carries `op` to its end. Never rejects: a failure it cannot record is logged, and the reconciler takes the claim. */
  async run(op: ClaimedOperation): Promise<void> {
    const { log } = this.#ctx.o;
    const progress = { sent: false };
    const span = tracingOn() ? this.#resume(op) : undefined;
    await withSpan(span, () => this.#process(op, progress), ROOT_CONTEXT)
      .catch((err: unknown) => this.#completer.recover(op, progress.sent, err))
      .catch((err: unknown) => {
        if (err instanceof WorkerHalted) {
          log.warn(
            { operation_id: op.operation_id, sent: progress.sent },
            'worker stopped with a write owed; the operation stays executing for the reconciler',
          );
          return;
        }
        log.error(
          { err, operation_id: op.operation_id, sent: progress.sent },
          'could not record the failure; the claim is no longer listed, so the reconciler takes it',
        );
      });
    span?.setAttribute('actionledger.sent', progress.sent);
    span?.end();
  }

  /**
   * The operation's dispatch span, resuming the trace it was reserved under (a child of the stored context, and
   * linked to it: the messaging conventions' "process" span), from the claim statement's send to the outcome,
   * with the claim itself as its first child. Its provider and authorization requests are its children.
   */
  #resume(op: ClaimedOperation): Span | undefined {
    const span = resumeSpan(
      'process outbox',
      SpanKind.CONSUMER,
      op.trace_context,
      () => ({
        'messaging.system': 'actionledger',
        'messaging.operation.type': 'process',
        'messaging.operation.name': 'process',
        'messaging.destination.name': 'outbox',
        'messaging.message.id': op.operation_id,
        'messaging.consumer.group.name': this.#ctx.o.workerId,
        'actionledger.operation_id': op.operation_id,
        'actionledger.tool': op.tool_name,
        'actionledger.tenant': op.tenant_id,
        'actionledger.attempt': op.attempt,
      }),
      op.claim_sent_at,
    );
    if (span === undefined) return undefined;
    op.span = span;
    const claim = startSpan(
      'receive outbox',
      SpanKind.CLIENT,
      () => ({
        'messaging.system': 'actionledger',
        'messaging.operation.type': 'receive',
        'messaging.operation.name': 'claim',
        'messaging.destination.name': 'outbox',
        'db.system.name': 'postgresql',
        'db.operation.name': 'UPDATE',
        'db.collection.name': 'operations',
        'db.query.summary': 'claim outbox',
      }),
      { parent: contextOf(span), ...(op.claim_sent_at === undefined ? {} : { startTime: op.claim_sent_at }) },
    );
    claim?.end(op.claim_answered_at);
    return span;
  }

  async #process(op: ClaimedOperation, progress: { sent: boolean }): Promise<void> {
    const { o } = this.#ctx;
    const { crash } = o;
    const completer = this.#completer;
    crash.reach('after_claim');
    const route = o.config.tools.get(op.tool_name);
    if (
      route === undefined ||
      route.providerId !== op.provider_id ||
      route.endpoint !== op.provider_endpoint ||
      route.idempotencyHeader !== op.idempotency_header ||
      !route.allowedTenants.has(op.tenant_id)
    ) {
      return completer.refuse(op, 'route', 'route_changed');
    }
    if (sha256Hex(canonicalJson(op.arguments_json as JsonValue)) !== op.canonical_args_sha256)
      return completer.refuse(op, 'arguments', 'args_hash_mismatch');
    const credential = route.credentialEnv === null ? null : (o.credentials.get(op.tool_name) ?? null);
    if (route.credentialEnv !== null && credential === null)
      return completer.refuse(op, 'credential', 'credential_missing');

    let decision: AuthorizationDecision;
    const endAuth = o.metrics.authorizationSeconds.startTimer();
    try {
      decision = await fetchAuthorization(this.#ctx.agent('authorizer'), o.profile, authorizationRequest(op));
      o.metrics.authorizations.inc({ result: 'allow' });
    } catch (err) {
      if (err instanceof WorkerHalted) throw err;
      const code = isActionLedgerError(err) ? err.code : 'authorization_unavailable';
      o.metrics.authorizations.inc({ result: code });
      // No decision came (unreachable, timed out, answered anything but a 200 decision): nothing was decided
      // against the operation, so it goes back to the queue. A denial, or an answer that breaks the protocol,
      // is a person's to look at.
      if (code === 'authorization_unavailable') {
        // "Not now, a kill switch" (the built-in service's answer) is not counted when the switch is really
        // engaged here: the claim leaves the operation in the queue until it is lifted, so it cannot cycle. An
        // authorizer that says so with no switch engaged counts like any other answer that is not a decision.
        const killed =
          isActionLedgerError(err) && err.details?.error === 'tool_disabled' && (await this.#killSwitchCovers(op));
        return killed
          ? completer.release(op, 'authorization', 'tool_disabled', err, { counted: false })
          : completer.release(op, 'authorization', code, err);
      }
      return completer.refuse(op, 'authorization', code, err);
    } finally {
      endAuth();
    }
    crash.reach('after_authorization_request');
    await this.#dispatches.dispatch({ op, decision, route, credential, progress });
  }

  /** Whether a kill switch covers the operation's tenant and tool in the database now. */
  async #killSwitchCovers(op: ClaimedOperation): Promise<boolean> {
    const { o, q } = this.#ctx;
    const { rows } = await o.pool.query<{ covered: boolean }>(q.killSwitchCovers, [op.tenant_id, op.tool_name]);
    return rows[0]?.covered === true;
  }
}
