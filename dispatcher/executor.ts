/**
 * One provider call, and the classification of what came back (docs/architecture.md, "Operation states and who
 * moves them"): 2xx with a receipt -> succeeded; 2xx without -> needs_review; a status the contract declares
 * definitive -> failed; anything else once the request may have left (other statuses, timeout, reset, oversized
 * or malformed body, redirect) -> unknown; a connection that failed before any byte was sent -> not sent, which
 * the dispatch batch gives back to the queue (dispatcher/completer.ts `settleUnsent`: the same effect key is
 * claimed again after a backoff, or goes to review once the release limit is spent).
 */
import type { Agent } from 'undici';
import type { ToolRoute } from '../config/index.js';
import type { ErrorCode } from '../core/errors.js';
import { canonicalJson, type JsonValue } from '../core/json.js';
import type { Secret } from '../core/secret.js';
import type { OperationStatus } from '../core/types.js';
import { postJson, type HttpOutcome } from '../transport/index.js';
import type { DispatchProfile } from '../protocol/index.js';
import type { ClaimedOperation } from './types.js';
import { ROOT_CONTEXT, withSpan } from '../core/tracing.js';

export interface Outcome {
  status: Extract<OperationStatus, 'succeeded' | 'unknown' | 'needs_review' | 'failed'>;
  receipt: string | null;
  /** What is stored: status code, body sha256, receipt source, error code. Never the body or credential. */
  result: Record<string, JsonValue>;
  code: ErrorCode | null;
  reason: string;
}

const RECEIPT = /^[\x21-\x7e]{1,256}$/;

export async function callProvider(
  agent: Agent,
  profile: DispatchProfile,
  op: ClaimedOperation,
  credential: Secret | null,
  signal?: AbortSignal,
): Promise<HttpOutcome> {
  const headers: Record<string, string> = { [op.idempotency_header]: op.effect_key };
  if (credential !== null) headers.authorization = `Bearer ${credential.reveal().toString('utf8')}`;
  // In the operation's own span (dispatcher/pipeline.ts): a batch sends many operations from one context.
  return withSpan(
    op.span,
    () =>
      postJson(agent, op.provider_endpoint, {
        headers,
        spanName: 'provider',
        urlTemplate: op.provider_endpoint,
        // The stored arguments, in the canonical form their hash was taken of: never re-supplied ones.
        body: canonicalJson(op.arguments_json as JsonValue),
        timeoutMs: profile.providerHttpTimeoutMs,
        maxBytes: profile.providerResponseMaxBytes,
        ...(signal === undefined ? {} : { signal }),
      }),
    ROOT_CONTEXT,
  );
}

export function classify(outcome: HttpOutcome, route: Pick<ToolRoute, 'definitiveFailureStatuses'>): Outcome {
  if (outcome.kind === 'not_sent') {
    return {
      status: 'needs_review',
      receipt: null,
      result: { transport: outcome.code },
      code: 'provider_unreachable',
      reason: `provider:provider_unreachable:${outcome.code}`,
    };
  }
  if (outcome.kind === 'unknown') {
    const result: Record<string, JsonValue> = { transport: outcome.code };
    if (outcome.status !== undefined) result.http_status = outcome.status;
    return {
      status: 'unknown',
      receipt: null,
      result,
      code: 'provider_outcome_unknown',
      reason: `provider_outcome_unknown:${outcome.code}`,
    };
  }
  const result: Record<string, JsonValue> = { http_status: outcome.status, body_sha256: outcome.bodySha256 };
  if (outcome.status >= 200 && outcome.status < 300) {
    const fromBody = outcome.json?.operation_id;
    const fromHeader = outcome.headers['x-request-id'];
    const receipt =
      typeof fromBody === 'string' && RECEIPT.test(fromBody)
        ? fromBody
        : fromHeader !== undefined && RECEIPT.test(fromHeader)
          ? fromHeader
          : null;
    if (receipt === null)
      return {
        status: 'needs_review',
        receipt: null,
        result,
        code: 'provider_no_receipt',
        reason: 'provider:provider_no_receipt',
      };
    result.receipt_source = receipt === fromBody ? 'body' : 'header';
    return { status: 'succeeded', receipt, result, code: null, reason: 'provider_receipt' };
  }
  if (route.definitiveFailureStatuses.has(outcome.status)) {
    return {
      status: 'failed',
      receipt: null,
      result,
      code: 'provider_rejected',
      reason: `provider_rejected:${outcome.status}`,
    };
  }
  return {
    status: 'unknown',
    receipt: null,
    result,
    code: 'provider_outcome_unknown',
    reason: `provider_outcome_unknown:http_${outcome.status}`,
  };
}
