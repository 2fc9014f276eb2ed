/**
 * Review policies at work: reviewed authorization a person gave ahead of time (config/review-policies.ts),
 * applied by the reconciliation pass. Each retry is the review action's own retry (reconciler/review.ts: same
 * effect key, back to pending, a new outbox attempt, a fresh authorization at dispatch), fenced on the status,
 * attempt and review reason the selection read, and audited like a person's, with the policy as actor:
 * `policy:<name> (authorized_by <who>)`, the policy's sha256 in the history and audit rows.
 *
 * Under the row lock the guard checks again what the selection assumed: the policy covers the operation's tool
 * and review reason, the provider contact is exactly the one that proves no effect for that reason (and
 * `retryIsSafe` agrees), and fewer than `max_retries` retries by policies were made of it (counted from its
 * history). Past that the operation stays in review for a person, and `review list` says why.
 *
 * It runs at the end of every reconciliation pass, inside the pass lock (reconciler/reconciler.ts): an
 * operation the pass itself sent to review (`no_effect_confirmed`) is retried in the same pass, one the
 * dispatcher sent there by the next pass. Several fleets never run it at once (the pass lock), and a retry
 * that races anything else is refused by its fence.
 */
import type { Config } from '../config/index.js';
import {
  REVIEW_POLICY_REASONS,
  coveringPolicy,
  reasonInClass,
  type ReviewPolicy,
  type ReviewPolicyReason,
} from '../config/index.js';
import { bindQueries, type Pool } from '../db/index.js';
import { ActionLedgerError, isActionLedgerError } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import type { ProviderContact } from '../ledger/index.js';
import type { ReconcileMetrics } from './metrics.js';
import { policyQueries } from './policy-queries.js';
import { retryIsSafe, type RetryGuard, type Review } from './review.js';

export interface ReviewPolicyOptions {
  config: Config;
  pool: Pool;
  review: Review;
  log: Logger;
  metrics?: ReconcileMetrics;
}

export interface PolicyRunSummary {
  /** Operations sent back to pending by a policy. */
  retried: number;
  /** Retries refused under the row lock (the operation moved on since it was selected). */
  refused: number;
  /** Retries that failed unexpectedly (logged with their ids; tried again by the next pass). */
  errors: number;
}

type Candidate = {
  operation_id: string;
  tool_name: string;
  review_reason: string;
  provider_contact: ProviderContact;
  attempt: number;
  policy_retries: number;
};

/** The policy's reasons as the candidate query's parallel arrays: exact reasons and prefixes, each with its contact. */
function matchers(policy: ReviewPolicy): [string[], string[], string[], string[]] {
  const m: [string[], string[], string[], string[]] = [[], [], [], []];
  for (const r of policy.reasons) {
    const cls = REVIEW_POLICY_REASONS[r];
    for (const e of cls.exact) {
      m[0].push(e);
      m[1].push(cls.contact);
    }
    for (const p of cls.prefixes) {
      m[2].push(p);
      m[3].push(cls.contact);
    }
  }
  return m;
}

/** A guard refusal: nothing changed, the operation waits for a person (or the next pass). */
function refused(policy: ReviewPolicy, why: string, message: string, details: Record<string, unknown> = {}) {
  return new ActionLedgerError('review_policy_refused', `review policy ${policy.name}: ${message}`, {
    details: { review_policy: policy.name, why, ...details },
  });
}

/**
 * The guard a policy's retry runs under the row lock (see the file comment); its detail goes into the history
 * row: the policy, its sha256, who authorized it and when, the reason that covered the operation, and which
 * retry of how many this is.
 */
export function policyGuard(policy: ReviewPolicy, reason: ReviewPolicyReason, q: typeof policyQueries): RetryGuard {
  const audit = {
    review_policy: policy.name,
    policy_sha256: policy.sha256,
    authorized_by: policy.authorizedBy,
    authorized_at: policy.authorizedAt,
    policy_reason: reason,
  };
  return {
    audit,
    async check(c, op) {
      const cls = REVIEW_POLICY_REASONS[reason];
      if (!policy.tools.has(op.tool_name) || op.review_reason === null || !reasonInClass(op.review_reason, cls))
        throw refused(policy, 'not_covered', `does not cover ${op.tool_name} in review for ${op.review_reason}`);
      if (op.provider_contact !== cls.contact || !retryIsSafe(op.provider_contact))
        throw new ActionLedgerError(
          'retry_not_safe',
          `review policy ${policy.name}: ${reason} needs provider contact ${cls.contact}; this operation has ${op.provider_contact}`,
          { details: { review_reason: op.review_reason, provider_contact: op.provider_contact } },
        );
      const { rows } = await c.query<{ n: number }>(q.retriesOf, [op.operation_id]);
      const spent = rows[0]?.n ?? 0;
      if (spent >= policy.maxRetries)
        throw refused(policy, 'retries_spent', `its retries are spent (${spent} of ${policy.maxRetries})`, {
          retries: spent,
          max_retries: policy.maxRetries,
        });
      return { ...audit, policy_retry: spent + 1, policy_max_retries: policy.maxRetries };
    },
  };
}

export class ReviewPolicyRunner {
  readonly #o: ReviewPolicyOptions;
  readonly #q: Readonly<typeof policyQueries>;

  constructor(options: ReviewPolicyOptions) {
    this.#o = options;
    this.#q = bindQueries(policyQueries, options.config.schemaQuoted);
  }

  /**
   * Retries what the configured policies cover, up to `reconciler.batch_size` operations per policy, oldest in
   * review first. Never throws: a failed selection or retry is counted and logged, and the next pass tries
   * again. Once `signal` is aborted it takes no new operation.
   */
  async run(signal?: AbortSignal): Promise<PolicyRunSummary> {
    const summary: PolicyRunSummary = { retried: 0, refused: 0, errors: 0 };
    // A function, not a narrowed property: the signal may be aborted while a retry is awaited.
    const aborted = (): boolean => signal?.aborted === true;
    for (const policy of this.#o.config.reviewPolicies) {
      if (aborted()) break;
      let rows: Candidate[];
      try {
        ({ rows } = await this.#o.pool.query<Candidate>(this.#q.candidates, [
          [...policy.tools],
          ...matchers(policy),
          policy.maxRetries,
          this.#o.config.reconciler.batchSize,
        ]));
      } catch (err) {
        // The rest of the pass (compensation, the gate's expiries) must not wait on a policy: logged, tried again.
        summary.errors++;
        this.#o.log.error(
          { err, review_policy: policy.name },
          'review policy selection failed; the next pass tries again',
        );
        continue;
      }
      for (const op of rows) {
        if (aborted()) break;
        await this.#one(policy, op, summary);
      }
    }
    return summary;
  }

  async #one(policy: ReviewPolicy, op: Candidate, summary: PolicyRunSummary): Promise<void> {
    const reason = policy.reasons.find((r) => reasonInClass(op.review_reason, REVIEW_POLICY_REASONS[r]));
    if (reason === undefined) return;
    const fields = {
      operation_id: op.operation_id,
      tool: op.tool_name,
      review_policy: policy.name,
      authorized_by: policy.authorizedBy,
      policy_sha256: policy.sha256,
      review_reason: op.review_reason,
    };
    try {
      const r = await this.#o.review.retryGuarded(
        op.operation_id,
        {
          actor: policy.actor,
          reason: `reviewed retry authorized ahead of time by ${policy.authorizedBy} (${policy.authorizedAt}) in review policy ${policy.name} for ${reason}`,
          expect: { attempt: op.attempt, reviewReason: op.review_reason },
        },
        policyGuard(policy, reason, this.#q),
      );
      summary.retried++;
      this.#o.metrics?.policyRetries.inc({ policy: policy.name, reason });
      this.#o.log.info(
        { ...fields, attempt: r.attempt, retry: op.policy_retries + 1, max_retries: policy.maxRetries },
        'review policy retried an operation',
      );
    } catch (err) {
      if (isActionLedgerError(err)) {
        summary.refused++;
        this.#o.log.warn({ ...fields, code: err.code, err }, 'review policy retry refused; nothing changed');
      } else {
        summary.errors++;
        this.#o.log.error({ ...fields, err }, 'review policy retry failed; the next pass tries again');
      }
    }
  }
}

/** What a policy means for one operation in review, as `review list` shows it. */
export interface PolicyState {
  name: string;
  authorized_by: string;
  /** The policy reason covering the operation's review reason. */
  reason: ReviewPolicyReason;
  /** Retries by policies so far, and how many this policy allows. */
  retries: number;
  max_retries: number;
  /** `due`: the next pass retries it; `spent`: retries spent; `not_proven`: its provider contact proves nothing. */
  state: 'due' | 'spent' | 'not_proven';
  /** The same in words. */
  why: string;
}

/** For each operation a policy covers, what the policy does with it; the others are absent from the map. */
export async function policyStates(
  config: Pick<Config, 'schemaQuoted' | 'reviewPolicies'>,
  db: Pick<Pool, 'query'>,
  ops: readonly { operation_id: string; tool_name: string; review_reason: string; provider_contact: string }[],
): Promise<Map<string, PolicyState>> {
  const out = new Map<string, PolicyState>();
  const covered = ops.flatMap((o) => {
    const c = coveringPolicy(config.reviewPolicies, o.tool_name, o.review_reason);
    return c === undefined ? [] : [{ op: o, ...c }];
  });
  if (covered.length === 0) return out;
  const q = bindQueries(policyQueries, config.schemaQuoted);
  const { rows } = await db.query<{ operation_id: string; n: number }>(q.retriesOfEach, [
    covered.map((c) => c.op.operation_id),
  ]);
  const spent = new Map(rows.map((r) => [r.operation_id, r.n]));
  for (const { op, policy, reason } of covered) {
    const retries = spent.get(op.operation_id) ?? 0;
    const proven = op.provider_contact === REVIEW_POLICY_REASONS[reason].contact;
    const state = !proven ? 'not_proven' : retries >= policy.maxRetries ? 'spent' : 'due';
    const why =
      state === 'due'
        ? `retried by the next reconciliation pass (${retries} of ${policy.maxRetries} retries spent)`
        : state === 'spent'
          ? `policy retries spent (${retries} of ${policy.maxRetries}): waits for a person`
          : `provider contact ${op.provider_contact} does not prove no effect: waits for a person`;
    out.set(op.operation_id, {
      name: policy.name,
      authorized_by: policy.authorizedBy,
      reason,
      retries,
      max_retries: policy.maxRetries,
      state,
      why,
    });
  }
  return out;
}
