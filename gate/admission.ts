/**
 * The admission of one tool call: everything the pipeline decides from the database before the reservation, in
 * one statement (`gateAdmit`, gate/queries.ts), inside the call's transaction:
 *
 *   revoked   -> the principal's role in the tenant is revoked           (permission_denied)
 *   killed    -> a kill switch covers the tenant and tool                 (tool_disabled)
 *   rate      -> one call taken from the principal's window, if open     (rate_limited, with retry_after_s)
 *   prior     -> the step already reserved with these arguments: a replay takes nothing from the caps
 *   caps      -> one unit (and the value) on every configured cap, each by a conditional upsert (limit_exceeded)
 *   plan      -> the task's plan version recorded; approvals bound to another one invalidated
 *
 * A part runs only when the parts before it passed (a revoked role takes no rate; a spent window takes no cap).
 * The refusals are then answered in the pipeline's order (gate/gate.ts), with the checks that need no database
 * (the arguments, the value) and the business validator in their places between them; whatever refuses,
 * the transaction rolls back, so a refused call consumes no rate and no cap. One statement instead of up to
 * seven (the role, the switch, the window, its retry-after, the replay lookup, three caps, the plan): each of
 * those was a round trip with its own parse and plan, which cost PostgreSQL more than the rows they touched.
 * A call that takes no budget (no rate, no cap, no plan version) reads the first two alone (`gateAdmitAccess`):
 * the whole statement's plan and executor start-up, with every table it could write, cost more than its reads.
 *
 * Both are named statements (`prepared`, db/db.ts): each pool connection parses and plans them once. Their plans
 * are key lookups and keyed upserts, whatever the table sizes; unnamed, the whole statement's plan alone took
 * about 0.4 ms of PostgreSQL CPU a call (pg_stat_statements' plan time), more than the statements it replaced.
 * A session that lost the name (26000) or a plan that cannot run after a migration (0A000) fails the call's
 * transaction, which Gate.call runs once more with `named` null (unnamed text).
 */
import type { GateTool } from '../config/index.js';
import type { Queryable } from '../db/index.js';
import type { Value } from './checks.js';
import type { GateNamedStatements, gateQueries } from './queries.js';
import { refuse, type Refused } from './refusal.js';
import type { GateContext } from './types.js';

/** The cap scopes, in the order they are taken (and locked) and named in a refusal. */
const CAP_SCOPES = ['principal_day', 'account_day', 'conversation'] as const;

/** What the call brings to its admission once its arguments passed: the canonical hash and the value. */
export interface AdmissionArgs {
  sha256: string;
  value: Value | null;
  /** Whether a replay of the step with these arguments takes nothing (auto-approved tools). */
  replayFree: boolean;
}

/** What the admission statement found and took. */
export interface Admission {
  /** permission_denied (revoked), tool_disabled or rate_limited, the first that applies, or null. */
  readonly access: Refused | null;
  /** `limit_exceeded` naming the first cap that would be exceeded, or null. */
  readonly caps: Refused | null;
  /** The step was reserved before with these arguments (nothing was taken from the caps). */
  readonly replay: boolean;
  /** The counters a cap unit was taken from. */
  readonly counters: string[];
  /** Approvals the plan version change invalidated (each gets its audit row). */
  readonly invalidated: string[];
}

interface AdmitRow {
  revoked: boolean;
  kill_reason: string | null;
  rate_used?: number | null;
  retry_after_s?: number | null;
  replay?: boolean;
  cap_scopes?: string[] | null;
  counter_ids?: string[] | null;
  invalidated?: string[] | null;
}

/** One configured cap of the tool, with the key this call counts under. */
interface Cap {
  scope: (typeof CAP_SCOPES)[number];
  cap: { maxCount: number | null; maxValue: number | null } | null;
  key: string;
}

/**
 * Runs the admission statement for a call whose role the role table grants. `args` is null when the arguments
 * were refused (or carry no value the caps can take): the caps and the replay lookup are then left out, and
 * the call is refused before they would matter. Throws only what PostgreSQL throws.
 */
export async function admit(
  db: Queryable,
  q: Readonly<typeof gateQueries>,
  tool: GateTool,
  ctx: GateContext,
  args: AdmissionArgs | null,
  named: GateNamedStatements | null,
): Promise<Admission> {
  const configured: Cap[] = CAP_SCOPES.map((scope) => ({ scope, cap: capOf(tool, scope), key: keyOf(ctx, scope) }));
  const caps = args === null ? [] : configured.filter((c) => c.cap !== null);
  const row =
    tool.rate === null && caps.length === 0 && ctx.plan_version === undefined
      ? await first(db, named?.gateAdmitAccess ?? q.gateAdmitAccess, [
          ctx.tenant_id,
          ctx.principal_id,
          ctx.role,
          tool.name,
        ])
      : await first(db, named?.gateAdmit ?? q.gateAdmit, budgetParams(tool, ctx, args, caps));
  const taken = new Set(row.cap_scopes ?? []);
  const replay = row.replay === true;
  const short = replay ? undefined : caps.find((c) => !taken.has(c.scope));
  return {
    access: accessRefusal(tool, row),
    caps:
      short === undefined
        ? null
        : refuse('limit_exceeded', `the ${short.scope.replace('_', ' per ')} cap for ${tool.name} would be exceeded`, {
            details: {
              scope: short.scope,
              max_count: short.cap?.maxCount ?? null,
              max_value: short.cap?.maxValue ?? null,
              currency: tool.value?.limitsCurrency ?? null,
            },
          }),
    replay,
    counters: row.counter_ids ?? [],
    invalidated: row.invalidated ?? [],
  };
}

/** The parameters of `gateAdmit`, in its order (gate/queries.ts). */
function budgetParams(tool: GateTool, ctx: GateContext, args: AdmissionArgs | null, caps: readonly Cap[]): unknown[] {
  const value = args?.value ?? null;
  return [
    ctx.tenant_id,
    ctx.principal_id,
    ctx.role,
    tool.name,
    tool.rate?.windowS ?? null,
    tool.rate?.limit ?? null,
    // The replay lookup matters only where there is a cap to spare.
    args !== null && args.replayFree && caps.length > 0,
    ctx.task_id,
    ctx.workflow_step_id,
    args?.sha256 ?? null,
    caps.map((c) => c.scope),
    caps.map((c) => c.key),
    caps.map((c) => (c.cap === null ? null : c.cap.maxCount)),
    caps.map((c) => (value === null || c.cap === null || c.cap.maxValue === null ? null : String(c.cap.maxValue))),
    // One counter per cap, whatever the call's currency: the caps' currency, or '-' for a count-only tool.
    tool.value?.limitsCurrency ?? '-',
    value?.amount ?? '0',
    ctx.plan_version ?? null,
  ];
}

/** The statement's one row; the columns `gateAdmitAccess` has not are absent (read as nothing taken). */
async function first(
  db: Queryable,
  statement: string | { name: string; text: string },
  values: unknown[],
): Promise<AdmitRow> {
  const { rows } =
    typeof statement === 'string'
      ? await db.query<AdmitRow>(statement, values)
      : await db.query<AdmitRow>({ ...statement, values });
  const row = rows[0];
  if (row === undefined) throw new Error('the admission statement returned no row');
  return row;
}

/** permission_denied, tool_disabled or rate_limited, the first that applies, or null. */
function accessRefusal(tool: GateTool, row: AdmitRow): Refused | null {
  if (row.revoked) return refuse('permission_denied', `your role may not call ${tool.name}`);
  if (row.kill_reason !== null) return refuse('tool_disabled', `${tool.name} is disabled for now (${row.kill_reason})`);
  if (tool.rate === null || (row.rate_used ?? null) !== null) return null;
  const retry = row.retry_after_s ?? tool.rate.windowS;
  return refuse(
    'rate_limited',
    `rate limit of ${tool.rate.limit} calls per ${tool.rate.windowS} s reached for ${tool.name}; try again in ${retry} s`,
    { retry_after_s: retry, details: { limit: tool.rate.limit, window_s: tool.rate.windowS } },
  );
}

function capOf(
  tool: GateTool,
  scope: (typeof CAP_SCOPES)[number],
): { maxCount: number | null; maxValue: number | null } | null {
  if (scope === 'principal_day') return tool.limits.perPrincipalDay;
  if (scope === 'account_day') return tool.limits.perAccountDay;
  return tool.limits.perConversation;
}

function keyOf(ctx: GateContext, scope: (typeof CAP_SCOPES)[number]): string {
  if (scope === 'principal_day') return ctx.principal_id;
  if (scope === 'account_day') return ctx.account_id;
  return ctx.conversation_id;
}
