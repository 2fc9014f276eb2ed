/**
 * The `review_policies` section: reviewed authorization given ahead of time. A person writes, per tool, which
 * review reasons a reconciliation pass may retry on its own (the same reviewed retry a person makes: same
 * effect key, back to pending, a fresh authorization at dispatch), how often per operation, and signs it with
 * who authorized it and when. Everything else in review waits for a person.
 *
 * Only reasons whose outcome is proven to have no effect, and that no decision refused, can be named
 * ({@link REVIEW_POLICY_REASONS}): a policy naming any other reason is refused at compile, and the retry checks
 * the operation's recorded provider contact again under its row lock (reconciler/review-policy.ts). An outcome
 * that is not proven (`unknown`, spent readbacks, a mismatch, no readback contract, a provider that may have
 * been called) is never retried by a policy, and neither is a decision (a denial, a kill switch, a revoked
 * role, a changed route): those are a person's to judge.
 */
import { canonicalJson, sha256Hex, type JsonValue } from '../core/json.js';
import { isObject, nearest, pointer, type ConfigProblems } from '../core/config-problems.js';

/** What the provider contact must say for a class of reasons (ledger/transitions.ts `ProviderContact`). */
export type ProvenContact = 'not_called' | 'no_effect_confirmed';

/** How one class of review reasons is recognised: exact reasons, prefixes, and the contact that proves it. */
export interface ReviewReasonClass {
  readonly exact: readonly string[];
  readonly prefixes: readonly string[];
  /** The recorded provider contact the operation must have; any other and the policy does not touch it. */
  readonly contact: ProvenContact;
}

/**
 * The reasons a policy may name, each with the review reasons it covers and the contact that proves no effect:
 *
 * - `no_effect_confirmed`: the provider's readback by effect key said authoritatively that it holds no effect.
 * - `provider_unreachable`: the connection failed before any byte of the request was written (or the
 *   operation was released for that as often as its tool allows); the provider never saw it.
 * - `authorization_unavailable`: the authorization service could not be reached or failed; no decision was
 *   made, and the retried attempt asks for a fresh one like every dispatch.
 * - `internal`: an unexpected failure before the send (provider not called).
 */
export const REVIEW_POLICY_REASONS = Object.freeze({
  no_effect_confirmed: Object.freeze({
    exact: Object.freeze(['no_effect_confirmed']),
    prefixes: Object.freeze([]),
    contact: 'no_effect_confirmed',
  }),
  provider_unreachable: Object.freeze({
    exact: Object.freeze(['provider:provider_unreachable']),
    prefixes: Object.freeze(['provider:provider_unreachable:']),
    contact: 'not_called',
  }),
  authorization_unavailable: Object.freeze({
    exact: Object.freeze(['authorization:authorization_unavailable']),
    prefixes: Object.freeze([]),
    contact: 'not_called',
  }),
  internal: Object.freeze({ exact: Object.freeze([]), prefixes: Object.freeze(['internal:']), contact: 'not_called' }),
} as const satisfies Record<string, ReviewReasonClass>);

export type ReviewPolicyReason = keyof typeof REVIEW_POLICY_REASONS;

/** Reasons a policy must never retry, each with why: named back to an operator who writes one. */
const NEVER_RETRIED: Readonly<Record<string, string>> = {
  unknown: 'the outcome is unknown: the provider may have the effect',
  reconcile_attempts_exhausted: 'the readback never answered: the outcome is not proven',
  readback_mismatch: 'the provider holds an effect with other arguments',
  no_readback_contract: 'nothing can prove the provider has no effect',
  readback_unavailable: 'the outcome is not proven',
  provider_no_receipt: 'the provider accepted the request: the effect may exist',
  maybe_called: 'the provider may have been called',
  route_changed: 'the route was changed by a person: a decision',
  authorization_denied: 'a decision refused it',
  authorization_invalid: 'a decision refused it',
  authorization_stale: 'a decision refused it',
  tool_disabled: 'a kill switch refused it: a decision',
  role_revoked: 'a revoked role refused it: a decision',
  resource_version_changed: 'a resource changed since it was approved: a decision',
  worker_lost: 'the operation may stop every worker that takes it',
  compensation_unknown: 'a compensation outcome is not proven',
  compensation_needs_review: 'a compensation waits for a person',
};

export const MAX_POLICY_RETRIES = 10;

const TEXT = '^[^\\s\\u0000-\\u001f\\u007f]([^\\u0000-\\u001f\\u007f]*[^\\s\\u0000-\\u001f\\u007f])?$';

/** The `review_policies` section's schema: a list, empty by default (nothing heals without a person). */
export const reviewPoliciesSchema = {
  type: 'array',
  default: [],
  maxItems: 100,
  items: {
    type: 'object',
    additionalProperties: false,
    required: ['name', 'tools', 'reasons', 'max_retries', 'authorized_by', 'authorized_at'],
    properties: {
      /** Named in the actor of every retry it makes: `policy:<name> (authorized_by <who>)`. */
      name: { type: 'string', pattern: '^[a-z][a-z0-9-]{0,63}$' },
      tools: {
        type: 'array',
        minItems: 1,
        uniqueItems: true,
        items: { type: 'string', pattern: '^[a-z][a-z0-9_]{0,63}$' },
      },
      /** Checked at compile against REVIEW_POLICY_REASONS, so a refused reason is named with why. */
      reasons: {
        type: 'array',
        minItems: 1,
        uniqueItems: true,
        items: { type: 'string', minLength: 1, maxLength: 128 },
      },
      /** Retries by any policy per operation; past it the operation stays for a person. */
      max_retries: { type: 'integer', minimum: 1, maximum: MAX_POLICY_RETRIES },
      /**
       * Who authorized the policy: recorded in every history and audit row of its retries. At most 160
       * characters, so the actor `policy:<name> (authorized_by <who>)` fits the review actions' 256.
       */
      authorized_by: { type: 'string', maxLength: 160, pattern: TEXT },
      /** When: a date (`2026-12-01`) or a date and time with its offset. */
      authorized_at: {
        type: 'string',
        pattern: '^\\d{4}-\\d{2}-\\d{2}(T\\d{2}:\\d{2}(:\\d{2}(\\.\\d{1,9})?)?(Z|[+-]\\d{2}:\\d{2}))?$',
      },
      note: { type: 'string', maxLength: 1000 },
    },
  },
} as const;

/** One compiled policy. */
export interface ReviewPolicy {
  readonly name: string;
  readonly tools: ReadonlySet<string>;
  readonly reasons: readonly ReviewPolicyReason[];
  readonly maxRetries: number;
  readonly authorizedBy: string;
  readonly authorizedAt: string;
  readonly note: string | null;
  /**
   * sha256 of the policy's canonical JSON as written (RFC 8785): stored with every retry it makes, so a changed
   * policy is a different policy and each retry names the exact text that authorized it.
   */
  readonly sha256: string;
  /** Who its retries are recorded as: `policy:<name> (authorized_by <who>)`. */
  readonly actor: string;
}

interface RawPolicy {
  name: string;
  tools: string[];
  reasons: string[];
  max_retries: number;
  authorized_by: string;
  authorized_at: string;
  note?: string;
}

/** Whether a review reason belongs to a class (exactly, or by one of its prefixes). */
export function reasonInClass(reviewReason: string, cls: ReviewReasonClass): boolean {
  return cls.exact.includes(reviewReason) || cls.prefixes.some((p) => reviewReason.startsWith(p));
}

/** The policy reason covering `reviewReason` for a tool, with its policy, or undefined: nothing covers it. */
export function coveringPolicy(
  policies: readonly ReviewPolicy[],
  tool: string,
  reviewReason: string,
): { policy: ReviewPolicy; reason: ReviewPolicyReason } | undefined {
  for (const policy of policies) {
    if (!policy.tools.has(tool)) continue;
    const reason = policy.reasons.find((r) => reasonInClass(reviewReason, REVIEW_POLICY_REASONS[r]));
    if (reason !== undefined) return { policy, reason };
  }
  return undefined;
}

/**
 * Compiles the section: names unique, tools routed, reasons from the allowed set (a never-retried one is named
 * with why), one policy per tool and reason (two would make which one acted ambiguous), a real date.
 */
export function compileReviewPolicies(
  raw: unknown,
  tools: ReadonlySet<string>,
  problems: ConfigProblems,
): readonly ReviewPolicy[] {
  if (!Array.isArray(raw)) return Object.freeze([]);
  const out: ReviewPolicy[] = [];
  const names = new Set<string>();
  const covered = new Map<string, string>();
  raw.forEach((p: unknown, i) => {
    if (!isObject(p) || problems.malformed(pointer('review_policies', i))) return;
    const at = (...rest: (string | number)[]): string => pointer('review_policies', i, ...rest);
    const policy = p as unknown as RawPolicy;
    if (names.has(policy.name)) problems.add(at('name'), 'is the name of another policy', { got: policy.name });
    names.add(policy.name);
    policy.tools.forEach((tool, j) => {
      if (tools.has(tool)) return;
      const suggestion = nearest(tool, tools);
      problems.add(at('tools', j), 'names a tool with no route in /tools', {
        got: tool,
        allowed: [...tools],
        ...(suggestion === undefined ? {} : { suggestion }),
      });
    });
    const reasons = policy.reasons.filter((reason, j) => reasonProblem(reason, at('reasons', j), problems));
    for (const tool of policy.tools)
      for (const reason of reasons) {
        const other = covered.get(`${tool}\u0000${reason}`);
        if (other !== undefined)
          problems.add(at('reasons'), `covers ${reason} for ${tool}, which policy ${other} covers already`);
        covered.set(`${tool}\u0000${reason}`, policy.name);
      }
    if (Number.isNaN(Date.parse(policy.authorized_at)) || !realDate(policy.authorized_at))
      problems.add(at('authorized_at'), 'is not a real date', { got: policy.authorized_at });
    out.push(compiled(policy, reasons as ReviewPolicyReason[]));
  });
  return Object.freeze(out);
}

/** Adds the problem with a reason a policy may not name; true when it may. */
function reasonProblem(reason: string, at: string, problems: ConfigProblems): boolean {
  if (Object.hasOwn(REVIEW_POLICY_REASONS, reason)) return true;
  const allowed = Object.keys(REVIEW_POLICY_REASONS);
  const bare = reason.split(':').filter((s) => s !== '');
  const why = NEVER_RETRIED[reason] ?? bare.map((s) => NEVER_RETRIED[s]).find((w) => w !== undefined);
  if (why !== undefined) {
    problems.add(at, `is never retried by a policy: ${why}; only a person decides it`, { got: reason, allowed });
    return false;
  }
  const suggestion = nearest(reason, allowed);
  problems.add(at, 'is not a reason a policy may retry (only outcomes proven to have no effect)', {
    got: reason,
    allowed,
    ...(suggestion === undefined ? {} : { suggestion }),
  });
  return false;
}

/** The date part names a day that exists (`2026-02-30` does not). */
function realDate(s: string): boolean {
  const [y, m, d] = s.slice(0, 10).split('-').map(Number) as [number, number, number];
  const day = new Date(Date.UTC(y, m - 1, d));
  return day.getUTCFullYear() === y && day.getUTCMonth() === m - 1 && day.getUTCDate() === d;
}

function compiled(p: RawPolicy, reasons: ReviewPolicyReason[]): ReviewPolicy {
  return Object.freeze({
    name: p.name,
    tools: Object.freeze(new Set(p.tools)),
    reasons: Object.freeze(reasons),
    maxRetries: p.max_retries,
    authorizedBy: p.authorized_by,
    authorizedAt: p.authorized_at,
    note: p.note ?? null,
    sha256: sha256Hex(canonicalJson(p as unknown as JsonValue)),
    actor: `policy:${p.name} (authorized_by ${p.authorized_by})`,
  });
}
