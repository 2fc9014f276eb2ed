/**
 * `actionledger verify`: an independent pass over the whole ledger that trusts nothing the writers computed.
 *
 * - every operation's canonical arguments hash, recomputed from its stored arguments;
 * - every effect key unique and equal to the HMAC this service mints for its operation id;
 * - every operation's history a legal path (ledger/transitions.ts LEGAL_TRANSITIONS, the table the database's
 *   trigger enforces too, where a dispatcher's release of a claim it never sent, `executing -> pending`, needs
 *   a `released:` reason) from the reservation to its current state;
 * - every operation that reached the provider (receipt from dispatch or readback) has authorization evidence
 *   bound to its stored arguments hash;
 * - for tools whose provider lists its effects by key: every provider effect maps to exactly one ledger
 *   operation of that provider, with the stored arguments' bytes, and no ledger state that denies it; and
 *   every succeeded (or compensated) operation has exactly one effect;
 * - the claim listing (operation_claims, kept by the transition trigger) names exactly the executing operations,
 *   under the worker that holds each: the reconciler and the kill switch find claims only through it, so a
 *   write that skipped the triggers (a replica role, a restore without that table) would hide a claim from them.
 */
import type { Agent } from 'undici';
import type { Config } from '../config/index.js';
import { bindQueries, type Pool } from '../db/index.js';
import { canonicalJson, sha256Hex, type JsonValue } from '../core/json.js';
import type { Secret } from '../core/secret.js';
import type { OperationStatus } from '../core/types.js';
import { withExternalWrites } from '../transport/index.js';
import type { DispatchProfile } from '../protocol/index.js';
import { isLegalTransition, type EffectKeyer, type ProviderContact } from '../ledger/index.js';
import { gatedGetJson } from './readback.js';
import { retryIsSafe } from './review.js';

export type DiscrepancyKind =
  | 'args_hash_mismatch'
  | 'effect_key_invalid'
  | 'effect_key_duplicate'
  | 'illegal_transition'
  | 'history_broken'
  | 'claim_listing_mismatch'
  | 'evidence_missing'
  | 'provider_effect_unknown'
  | 'provider_effect_duplicated'
  | 'provider_effect_body_mismatch'
  | 'provider_effect_contradicts_ledger'
  | 'provider_effect_missing'
  | 'listing_unavailable';

export interface Discrepancy {
  kind: DiscrepancyKind;
  operation_id?: string;
  effect_key?: string;
  detail: string;
}

export interface VerifyReport {
  ok: boolean;
  operations: number;
  history_rows: number;
  listings: number;
  provider_effects: number;
  discrepancies: Discrepancy[];
}

export interface VerifyOptions {
  config: Config;
  pool: Pool;
  keyer: EffectKeyer;
  /** Without these the provider listings are not read (and the report says so). */
  provider?: { agent: Agent; profile: DispatchProfile; credentials: ReadonlyMap<string, Secret> };
  batchSize?: number;
}

const LISTING_MAX_BYTES = 64 * 1024 * 1024;
/** History reasons that mean a request may have reached the provider (so evidence must exist). */
function reachedProvider(reason: string): boolean {
  return (
    reason === 'provider_receipt' ||
    reason === 'readback_applied' ||
    reason.startsWith('provider_rejected:') ||
    reason.startsWith('provider_outcome_unknown:') ||
    reason === 'provider:provider_no_receipt'
  );
}

const queries = {
  operations: `
    SELECT operation_id, effect_key, status, tool_name, provider_id, canonical_args_sha256, arguments_json
    FROM @schema.operations WHERE operation_id > $1 ORDER BY operation_id LIMIT $2`,
  history: `
    SELECT operation_id, from_status, to_status, reason, id
    FROM @schema.operation_history WHERE operation_id = ANY($1::uuid[]) ORDER BY operation_id, id`,
  evidence: `
    SELECT DISTINCT operation_id FROM @schema.authorization_evidence e
    JOIN @schema.operations o USING (operation_id)
    WHERE e.operation_id = ANY($1::uuid[]) AND e.args_sha256 = o.canonical_args_sha256`,
  claimListing: `
    SELECT l.operation_id, 'executing under ' || coalesce(l.claimed_by, 'no worker') || ', not in the claim listing' AS detail
    FROM @schema.operations l
    WHERE l.status = 'executing'
      AND NOT EXISTS (SELECT 1 FROM @schema.operation_claims c WHERE c.operation_id = l.operation_id)
    UNION ALL
    SELECT c.operation_id,
           'listed as claimed by ' || coalesce(c.claimed_by, 'no worker') || ', but ' || CASE
             WHEN l.operation_id IS NULL THEN 'there is no such operation'
             WHEN l.status <> 'executing' THEN 'the operation is ' || l.status
             ELSE 'the operation is claimed by ' || coalesce(l.claimed_by, 'no worker') END AS detail
    FROM @schema.operation_claims c
    LEFT JOIN @schema.operations l ON l.operation_id = c.operation_id
    WHERE l.operation_id IS NULL OR l.status <> 'executing' OR l.claimed_by IS DISTINCT FROM c.claimed_by`,
  duplicateKeys: `SELECT effect_key, count(*)::int AS n FROM @schema.operations GROUP BY effect_key HAVING count(*) > 1`,
  byKeys: `
    SELECT operation_id, effect_key, status, provider_id, canonical_args_sha256, review_reason, provider_contact
    FROM @schema.operations WHERE effect_key = ANY($1::text[])`,
  expectingEffects: `
    SELECT operation_id, effect_key FROM @schema.operations
    WHERE tool_name = ANY($1::text[]) AND status IN ('succeeded', 'compensating', 'compensated')`,
} as const;

type OpRow = {
  operation_id: string;
  effect_key: string;
  status: OperationStatus;
  tool_name: string;
  provider_id: string;
  canonical_args_sha256: string;
  arguments_json: JsonValue;
};
type HistRow = {
  operation_id: string;
  from_status: OperationStatus | null;
  to_status: OperationStatus;
  reason: string;
};

export async function verifyLedger(o: VerifyOptions): Promise<VerifyReport> {
  const q = bindQueries(queries, o.config.schemaQuoted);
  const report: VerifyReport = {
    ok: true,
    operations: 0,
    history_rows: 0,
    listings: 0,
    provider_effects: 0,
    discrepancies: [],
  };
  const add = (d: Discrepancy): void => void report.discrepancies.push(d);
  const batch = o.batchSize ?? 1000;

  let last = '00000000-0000-0000-0000-000000000000';
  for (;;) {
    const { rows: ops } = await o.pool.query<OpRow>(q.operations, [last, batch]);
    if (ops.length === 0) break;
    last = (ops[ops.length - 1] as OpRow).operation_id;
    report.operations += ops.length;
    const ids = ops.map((r) => r.operation_id);
    const { rows: hist } = await o.pool.query<HistRow>(q.history, [ids]);
    report.history_rows += hist.length;
    const { rows: ev } = await o.pool.query<{ operation_id: string }>(q.evidence, [ids]);
    const withEvidence = new Set(ev.map((r) => r.operation_id));
    const byOp = new Map<string, HistRow[]>();
    for (const h of hist) (byOp.get(h.operation_id) ?? byOp.set(h.operation_id, []).get(h.operation_id))?.push(h);
    for (const op of ops) {
      const recomputed = sha256Hex(canonicalJson(op.arguments_json));
      if (recomputed !== op.canonical_args_sha256) {
        add({
          kind: 'args_hash_mismatch',
          operation_id: op.operation_id,
          detail: `stored arguments hash to ${recomputed}, the ledger bound ${op.canonical_args_sha256}`,
        });
      }
      if (!o.keyer.verify(op.operation_id, op.effect_key)) {
        add({
          kind: 'effect_key_invalid',
          operation_id: op.operation_id,
          effect_key: op.effect_key,
          detail:
            'the effect key is not the HMAC this service mints for the operation id (or its key id has no secret)',
        });
      }
      const h = byOp.get(op.operation_id) ?? [];
      for (const problem of historyProblems(h, op.status))
        add({ kind: problem.kind, operation_id: op.operation_id, detail: problem.detail });
      if (h.some((r) => reachedProvider(r.reason)) && !withEvidence.has(op.operation_id)) {
        add({
          kind: 'evidence_missing',
          operation_id: op.operation_id,
          detail: 'the provider applied this operation but no authorization evidence is bound to its arguments hash',
        });
      }
    }
  }
  const { rows: listing } = await o.pool.query<{ operation_id: string; detail: string }>(q.claimListing);
  for (const r of listing) add({ kind: 'claim_listing_mismatch', operation_id: r.operation_id, detail: r.detail });
  const { rows: dups } = await o.pool.query<{ effect_key: string; n: number }>(q.duplicateKeys);
  for (const d of dups)
    add({ kind: 'effect_key_duplicate', effect_key: d.effect_key, detail: `${d.n} operations share this effect key` });

  if (o.provider !== undefined) await verifyListings(o, q, report, add);
  report.ok = report.discrepancies.length === 0;
  return report;
}

function legal(r: Pick<HistRow, 'from_status' | 'to_status'> & { reason?: string }): boolean {
  return isLegalTransition(r.from_status, r.to_status, r.reason);
}

/**
 * The history of one operation as a legal path ending in its current state. A row without its `reason` is
 * judged by the state table alone (so a release, which needs its reason, counts as illegal there).
 */
export function historyProblems(
  h: readonly (Pick<HistRow, 'from_status' | 'to_status'> & { reason?: string })[],
  status: OperationStatus,
): { kind: 'illegal_transition' | 'history_broken'; detail: string }[] {
  const out: { kind: 'illegal_transition' | 'history_broken'; detail: string }[] = [];
  if (h.length === 0) return [{ kind: 'history_broken', detail: 'no history rows' }];
  let at: OperationStatus | null = null;
  h.forEach((r, i) => {
    if (r.from_status !== at)
      out.push({
        kind: 'history_broken',
        detail: `row ${i + 1} starts from ${r.from_status ?? 'nothing'}, but the previous row ended in ${at ?? 'nothing'}`,
      });
    if (!legal(r)) {
      out.push({
        kind: 'illegal_transition',
        detail: `row ${i + 1}: ${r.from_status ?? 'reservation'} -> ${r.to_status} is not a legal transition`,
      });
    }
    at = r.to_status;
  });
  if (at !== status)
    out.push({ kind: 'history_broken', detail: `history ends in ${at ?? 'nothing'}, the operation is ${status}` });
  return out;
}

// eslint-disable-next-line max-lines-per-function -- one pass per provider listing: page through it, then compare it with the ledger in both directions
async function verifyListings(
  o: VerifyOptions,
  q: Readonly<typeof queries>,
  report: VerifyReport,
  add: (d: Discrepancy) => void,
): Promise<void> {
  const provider = o.provider;
  if (provider === undefined) return;
  const listings = new Map<string, { tools: string[]; providers: Set<string>; credentialTool: string | null }>();
  for (const route of o.config.tools.values()) {
    if (route.effectsListingUrl === null) continue;
    const l = listings.get(route.effectsListingUrl) ?? {
      tools: [],
      providers: new Set<string>(),
      credentialTool: null,
    };
    l.tools.push(route.tool);
    l.providers.add(route.providerId);
    if (route.credentialEnv !== null && l.credentialTool === null) l.credentialTool = route.tool;
    listings.set(route.effectsListingUrl, l);
  }
  for (const [url, l] of listings) {
    // Read the operations that must have an effect before the listing: one that succeeds in between is then
    // in the listing but not in this set, never the other way round (no false "missing" on a running fleet).
    const { rows: expecting } = await o.pool.query<{ operation_id: string; effect_key: string }>(q.expectingEffects, [
      l.tools,
    ]);
    const credential = l.credentialTool === null ? undefined : provider.credentials.get(l.credentialTool);
    const headers: Record<string, string> =
      credential === undefined ? {} : { authorization: `Bearer ${credential.reveal().toString('utf8')}` };
    const http = await withExternalWrites(
      () =>
        gatedGetJson(provider.agent, url, {
          headers,
          timeoutMs: Math.max(30_000, provider.profile.providerHttpTimeoutMs),
          maxBytes: LISTING_MAX_BYTES,
        }),
      'verify',
    );
    const effects = http.kind === 'response' && http.status === 200 ? http.json?.effects : undefined;
    if (effects === undefined || effects === null || typeof effects !== 'object' || Array.isArray(effects)) {
      add({
        kind: 'listing_unavailable',
        detail: `${url}: ${http.kind === 'response' ? `HTTP ${http.status}, or no "effects" object` : `${http.kind} (${http.code})`}`,
      });
      continue;
    }
    report.listings++;
    const entries = Object.entries(effects as Record<string, JsonValue>);
    const seen = new Set<string>();
    for (let i = 0; i < entries.length; i += 1000) {
      const chunk = entries.slice(i, i + 1000);
      const { rows } = await o.pool.query<{
        operation_id: string;
        effect_key: string;
        status: string;
        provider_id: string;
        canonical_args_sha256: string;
        review_reason: string | null;
        provider_contact: ProviderContact;
      }>(q.byKeys, [chunk.map(([k]) => k)]);
      const byKey = new Map(rows.map((r) => [r.effect_key, r]));
      for (const [key, list] of chunk) {
        const items = Array.isArray(list) ? list : [];
        report.provider_effects += items.length;
        seen.add(key);
        const op = byKey.get(key);
        if (op === undefined || !l.providers.has(op.provider_id)) {
          add({
            kind: 'provider_effect_unknown',
            effect_key: key,
            detail: `${url} lists an effect no ledger operation of ${[...l.providers].join(', ')} owns`,
          });
          continue;
        }
        if (items.length !== 1)
          add({
            kind: 'provider_effect_duplicated',
            operation_id: op.operation_id,
            effect_key: key,
            detail: `${items.length} provider effects for one operation`,
          });
        for (const it of items) {
          const sha = it !== null && typeof it === 'object' && !Array.isArray(it) ? it.body_sha256 : undefined;
          if (typeof sha === 'string' && sha !== op.canonical_args_sha256) {
            add({
              kind: 'provider_effect_body_mismatch',
              operation_id: op.operation_id,
              effect_key: key,
              detail: `the provider applied a body hashing to ${sha}, not the stored arguments`,
            });
          }
        }
        // States that say the provider has no effect: never sent, definitively rejected, confirmed absent, or
        // in review for a reason that allows a retry (which would then apply it a second time).
        if (
          op.status === 'pending' ||
          op.status === 'failed' ||
          (op.status === 'needs_review' && retryIsSafe(op.provider_contact))
        ) {
          add({
            kind: 'provider_effect_contradicts_ledger',
            operation_id: op.operation_id,
            effect_key: key,
            detail: `the provider has the effect but the ledger says ${op.status}${op.review_reason === null ? '' : ` (${op.review_reason})`}`,
          });
        }
      }
    }
    for (const op of expecting) {
      if (!seen.has(op.effect_key))
        add({
          kind: 'provider_effect_missing',
          operation_id: op.operation_id,
          effect_key: op.effect_key,
          detail: `the ledger says the effect happened, ${url} does not list it`,
        });
    }
  }
}
