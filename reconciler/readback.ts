/**
 * Readback: asks the provider, by effect key, whether an effect was applied. The provider contract (the
 * table below; `tools.<name>.readback.url` in docs/configuration.md), over the same mTLS agent,
 * timeouts, byte cap and strict JSON as dispatch:
 *
 * | answer                                                     | outcome      |
 * |------------------------------------------------------------|--------------|
 * | 2xx `{"state":"applied", "operation_id" or "request_id"}`  | applied      |
 * | 404 or 2xx `{"state":"no_effect"}`                         | no_effect    |
 * | 2xx `{"state":"applied"}` with a `body_sha256` that is not the stored arguments' | mismatch |
 * | 2xx with any other state, or applied without a receipt     | inconclusive |
 * | 404 without that body (a wrong URL is not "no effect"), other statuses, bad body | failing |
 * | no answer (refused, TLS, timeout, reset)                    | unreachable  |
 *
 * Only `applied` (with the provider's receipt) and `no_effect` are evidence; everything else is retried later.
 */
import type { Agent } from 'undici';
import { EFFECT_KEY_PLACEHOLDER, type ToolRoute } from '../config/index.js';
import type { JsonValue } from '../core/json.js';
import type { Secret } from '../core/secret.js';
import { guardExternalWrite } from '../transport/index.js';
import { getJson, type HttpOutcome } from '../transport/index.js';
import type { DispatchProfile } from '../protocol/index.js';

export type ReadbackOutcome = 'applied' | 'no_effect' | 'mismatch' | 'inconclusive' | 'failing' | 'unreachable';

export interface Readback {
  outcome: ReadbackOutcome;
  receipt: string | null;
  /** What is stored in the check row: status, state, body sha256, transport code. Never the body. */
  detail: Record<string, JsonValue>;
}

const RECEIPT = /^[\x21-\x7e]{1,256}$/;
const DIGEST = /^[0-9a-f]{64}$/;

export function readbackUrl(route: Pick<ToolRoute, 'readback'>, effectKey: string): string | null {
  return route.readback === null
    ? null
    : route.readback.urlTemplate.replace(EFFECT_KEY_PLACEHOLDER, encodeURIComponent(effectKey));
}

export interface ReadbackTarget {
  effect_key: string;
  canonical_args_sha256: string;
}

/** The readback GET; refused with `ungated_external_write` outside an external-write scope. */
export const gatedGetJson = guardExternalWrite(getJson);

export async function readback(
  agent: Agent,
  profile: DispatchProfile,
  url: string,
  op: ReadbackTarget,
  credential: Secret | null,
  urlTemplate?: string,
): Promise<Readback> {
  const headers: Record<string, string> = {};
  if (credential !== null) headers.authorization = `Bearer ${credential.reveal().toString('utf8')}`;
  const http = await gatedGetJson(agent, url, {
    headers,
    spanName: 'readback',
    // The span records the template (`{effect_key}` unexpanded), never the key in the URL.
    ...(urlTemplate === undefined ? {} : { urlTemplate }),
    timeoutMs: profile.providerHttpTimeoutMs,
    maxBytes: profile.providerResponseMaxBytes,
  });
  return classifyReadback(http, op);
}

export function classifyReadback(http: HttpOutcome, op: ReadbackTarget): Readback {
  if (http.kind === 'not_sent') return { outcome: 'unreachable', receipt: null, detail: { transport: http.code } };
  if (http.kind === 'unknown') {
    const detail: Record<string, JsonValue> = { transport: http.code };
    if (http.status !== undefined) detail.http_status = http.status;
    return {
      outcome:
        http.status === undefined && (http.code === 'timeout' || http.code === 'reset') ? 'unreachable' : 'failing',
      receipt: null,
      detail,
    };
  }
  const detail: Record<string, JsonValue> = { http_status: http.status, body_sha256: http.bodySha256 };
  const state = http.json?.state;
  if (typeof state === 'string' && state.length <= 64) detail.state = state;
  const ok = http.status >= 200 && http.status < 300;
  if ((ok || http.status === 404) && state === 'no_effect') return { outcome: 'no_effect', receipt: null, detail };
  if (!ok) return { outcome: 'failing', receipt: null, detail };
  if (state !== 'applied') return { outcome: 'inconclusive', receipt: null, detail };
  const reported = http.json?.body_sha256;
  if (reported !== undefined) {
    if (typeof reported !== 'string' || !DIGEST.test(reported))
      return { outcome: 'failing', receipt: null, detail: { ...detail, problem: 'body_sha256_malformed' } };
    detail.effect_body_sha256 = reported;
    if (reported !== op.canonical_args_sha256) return { outcome: 'mismatch', receipt: null, detail };
  }
  const fromId = http.json?.operation_id;
  const fromRequest = http.json?.request_id;
  const receipt =
    typeof fromId === 'string' && RECEIPT.test(fromId)
      ? fromId
      : typeof fromRequest === 'string' && RECEIPT.test(fromRequest)
        ? fromRequest
        : null;
  if (receipt === null)
    return { outcome: 'inconclusive', receipt: null, detail: { ...detail, problem: 'applied_without_receipt' } };
  return { outcome: 'applied', receipt, detail };
}
