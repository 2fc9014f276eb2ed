/**
 * Asking for the fresh authorization decision: POST the binding fields (protocol/authorization.ts) to the
 * profile's authorization URL over mTLS, read at most the profile's byte cap, parse strictly, and check the
 * answer there. Every way it can fail is an `authorization_*` error, and the provider is never called then.
 */
import type { Agent } from 'undici';
import { ActionLedgerError } from '../core/errors.js';
import { postJson } from '../transport/index.js';
import {
  checkDecision,
  type AuthorizationDecision,
  type AuthorizationRequest,
  type DispatchProfile,
} from '../protocol/index.js';

function fail(
  code: 'authorization_invalid' | 'authorization_unavailable',
  message: string,
  details?: Record<string, unknown>,
): ActionLedgerError {
  return new ActionLedgerError(code, message, details === undefined ? {} : { details });
}

/** Asks for a decision; throws `authorization_*` for every way it can fail (the provider is never called then). */
export async function fetchAuthorization(
  agent: Agent,
  profile: DispatchProfile,
  request: AuthorizationRequest,
  signal?: AbortSignal,
): Promise<AuthorizationDecision> {
  const outcome = await postJson(agent, profile.authorizationUrl, {
    body: JSON.stringify(request),
    spanName: 'authorize',
    urlTemplate: profile.authorizationUrl,
    timeoutMs: profile.authorizationHttpTimeoutMs,
    maxBytes: profile.authorizationResponseMaxBytes,
    ...(signal === undefined ? {} : { signal }),
  });
  if (outcome.kind === 'not_sent')
    throw fail('authorization_unavailable', `authorization service unreachable (${outcome.code})`, {
      transport: outcome.code,
    });
  if (outcome.kind === 'unknown') {
    const code =
      outcome.code === 'oversized' || outcome.code === 'malformed_json' || outcome.code === 'redirect'
        ? 'authorization_invalid'
        : 'authorization_unavailable';
    throw fail(code, `authorization response unusable (${outcome.code})`, { transport: outcome.code });
  }
  if (outcome.status !== 200) {
    // No decision. Its code, when the answer names one (the built-in service's `tool_disabled` for a kill switch,
    // `storage_full`, ...), is kept for the log and the release's history; it never turns into a decision.
    const named = outcome.json?.error;
    throw fail('authorization_unavailable', `authorization service answered ${outcome.status}`, {
      status: outcome.status,
      ...(typeof named === 'string' && /^[a-z][a-z0-9_]{0,63}$/.test(named) ? { error: named } : {}),
    });
  }
  if (outcome.json === null) throw fail('authorization_invalid', 'authorization response has no body');
  return checkDecision(outcome.json, request, profile, new Date());
}
