/**
 * `review list`: what waits for a person, oldest first, and whether each may be retried. Read-only: it opens the
 * database without migrating (a reader's role need not create tables) and refuses `schema_not_migrated` when
 * the schema is missing or behind. Also the selection `review retry --all` acts on (same filters, same rule).
 */
import type { Runtime } from '../../runtime/index.js';
import type { InReview, ReviewFilter, ReviewListing } from '../../reconciler/index.js';
import { load } from './load.js';
import {
  durationOption,
  EXIT,
  intOption,
  JSON_OPTION,
  parseCommand,
  printJson,
  printRefusal,
  readOnlyRuntime,
  table,
  usageError,
  type Command,
  type OptionSpec,
  type Parsed,
} from '../cli-util.js';

export const LIST_DEFAULT_LIMIT = 100;
const LIST_MAX_LIMIT = 10_000;

/** The selection options `review list` and `review retry --all` share (the reason's flag aside). */
export const SELECTION_OPTIONS = {
  tool: { type: 'string', value: 'T', description: 'only operations of this tool', default: 'every tool' },
  tenant: { type: 'string', value: 'T', description: 'only operations of this tenant', default: 'every tenant' },
  'older-than': {
    type: 'string',
    value: 'D',
    description: 'only operations in review for at least D: 30s, 15m, 2h, 7d',
    default: 'any age',
  },
} as const satisfies Record<string, OptionSpec>;

/** The reason filter's option; `lead` starts its description (`only the review reason`). */
export function reasonOption(lead: string): OptionSpec {
  return {
    type: 'string',
    value: 'R',
    description: `${lead} R exactly, or every reason starting with R when R ends with ':' (authorization:)`,
    default: 'every reason',
  };
}

/** The filter the selection options describe (`reasonKey` names the reason's flag), or a usage error's exit code. */
export function selection(cmd: Command, values: Parsed['values'], reasonKey: string): ReviewFilter | number {
  const filter: ReviewFilter = {};
  for (const [flag, key] of [
    [reasonKey, 'reason'],
    ['tool', 'tool'],
    ['tenant', 'tenant'],
  ] as const) {
    const v = values[flag];
    if (v === undefined) continue;
    if (typeof v !== 'string' || v.trim() === '') return usageError(cmd, `--${flag} must not be empty`);
    filter[key] = v;
  }
  const older = durationOption(values, 'older-than');
  if ('problem' in older) return usageError(cmd, older.problem);
  if (older.value !== undefined) filter.olderThanS = older.value;
  return filter;
}

/** Opens the configured database read-only (no migrations, no effect-key secrets) and runs `fn` on it. */
export async function withReadRuntime<T>(fn: (rt: Runtime) => Promise<T>): Promise<T> {
  const { openRuntime } = await load.runtime();
  const rt = await openRuntime({ name: 'review-list', ...readOnlyRuntime(), ledgerMetrics: false });
  try {
    return await fn(rt);
  } finally {
    await rt.close();
  }
}

/** `2d 3h`, `15m 4s`, `9s`: the two largest units of a non-negative number of seconds. */
export function formatAge(seconds: number): string {
  const s = Math.floor(seconds);
  const parts: [number, string][] = [
    [Math.floor(s / 86_400), 'd'],
    [Math.floor((s % 86_400) / 3600), 'h'],
    [Math.floor((s % 3600) / 60), 'm'],
    [s % 60, 's'],
  ];
  const first = parts.findIndex(([n]) => n > 0);
  if (first === -1) return '0s';
  return parts
    .slice(first, first + 2)
    .filter(([n]) => n > 0)
    .map(([n, u]) => `${n}${u}`)
    .join(' ');
}

function printListing(l: ReviewListing): void {
  if (l.total === 0) {
    process.stdout.write('no operations in review match\n');
    return;
  }
  const rows = l.operations.map((o: InReview) => [
    o.operation_id,
    o.tenant_id,
    o.tool_name,
    o.review_reason,
    o.provider_contact,
    o.retry_safe ? 'safe' : 'not safe',
    formatAge(o.age_s),
    o.attempt,
  ]);
  const head = ['operation', 'tenant', 'tool', 'reason', 'provider contact', 'retry', 'in review', 'attempt'];
  process.stdout.write(`${table([head, ...rows])}\n\n`);
  const safe = l.operations.filter((o) => o.retry_safe).length;
  process.stdout.write(
    `${l.total} in review; ${l.operations.length} listed, oldest first (${safe} of them safe to retry)\n`,
  );
  if (l.truncated)
    process.stdout.write(`${l.total - l.operations.length} more beyond --limit ${l.operations.length} not listed\n`);
  printPolicies(l.operations);
}

/** The listed operations a review policy covers, and what it does with each (nothing when none is covered). */
function printPolicies(ops: readonly InReview[]): void {
  const covered = ops.filter((o) => o.policy !== undefined);
  if (covered.length === 0) return;
  const rows = covered.map((o) => [
    o.operation_id,
    `${o.policy?.name} (authorized_by ${o.policy?.authorized_by})`,
    `${o.policy?.retries} of ${o.policy?.max_retries}`,
    o.policy?.why ?? '',
  ]);
  process.stdout.write(`\nreview policies:\n${table([['operation', 'policy', 'retries', 'what next'], ...rows])}\n`);
}

/** Counts per reason, tool or tenant over everything that matched (the limit does not apply). */
function groups(ops: readonly InReview[], by: 'reason' | 'tool' | 'tenant'): Record<string, unknown>[] {
  const key = (o: InReview): string => (by === 'reason' ? o.review_reason : by === 'tool' ? o.tool_name : o.tenant_id);
  const out = new Map<string, { count: number; retry_safe: number; oldest_age_s: number }>();
  for (const o of ops) {
    const g = out.get(key(o)) ?? { count: 0, retry_safe: 0, oldest_age_s: 0 };
    g.count++;
    if (o.retry_safe) g.retry_safe++;
    g.oldest_age_s = Math.max(g.oldest_age_s, o.age_s);
    out.set(key(o), g);
  }
  return [...out].map(([k, g]) => ({ [by]: k, ...g })).sort((a, b) => Number(b.count) - Number(a.count));
}

function printGroups(by: string, gs: Record<string, unknown>[], total: number): void {
  if (gs.length === 0) {
    process.stdout.write('no operations in review match\n');
    return;
  }
  const rows = gs.map((g) => [String(g[by]), Number(g.count), Number(g.retry_safe), formatAge(Number(g.oldest_age_s))]);
  process.stdout.write(`${table([[by, 'operations', 'safe to retry', 'oldest'], ...rows])}\n\n${total} in review\n`);
}

const BY = ['reason', 'tool', 'tenant'] as const;

export const listCommand: Command = {
  name: 'review list',
  summary: 'operations waiting in review, oldest first, and whether each may be retried (read-only)',
  notes:
    "Age is the time since the operation last entered review. 'retry' says whether a reviewed retry is allowed:\nonly when the recorded provider contact proves no effect (not_called, no_effect_confirmed). Operations a\nreview policy covers are listed again under 'review policies': retried by the next pass, or its retries spent\nand waiting for a person. Read-only: it does not migrate; a missing or older schema is refused\n(schema_not_migrated).",
  options: {
    reason: reasonOption('only the review reason'),
    ...SELECTION_OPTIONS,
    limit: {
      type: 'string',
      value: 'N',
      description: `list at most N, oldest first (1 to ${LIST_MAX_LIMIT}); the count line says how many more exist`,
      default: String(LIST_DEFAULT_LIMIT),
    },
    by: {
      type: 'string',
      value: BY.join('|'),
      description: 'instead of the operations, count them per reason, tool or tenant (no limit applies)',
      default: 'off: list the operations',
    },
    json: JSON_OPTION,
  },
  examples: [
    'actionledger review list',
    'actionledger review list --reason authorization: --older-than 15m',
    'actionledger review list --reason final_check:tool_disabled --tenant tenant-a --json',
    'actionledger review list --by reason',
  ],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const filter = selection(this, parsed.values, 'reason');
    if (typeof filter === 'number') return filter;
    const limit = intOption(parsed.values, 'limit', 1, LIST_MAX_LIMIT);
    if ('problem' in limit) return usageError(this, limit.problem);
    const by = parsed.values.by;
    if (by !== undefined && !BY.includes(by as (typeof BY)[number]))
      return usageError(this, `--by must be one of ${BY.join(', ')}, not ${JSON.stringify(by)}`);
    if (by !== undefined && limit.value !== undefined) return usageError(this, '--limit does not go with --by');
    const json = parsed.values.json === true;
    try {
      return await withReadRuntime(async (rt) => {
        if (by !== undefined) {
          const all = await (await load.reconciler()).listInReview(rt.config, rt.pool, filter);
          const gs = groups(all.operations, by as (typeof BY)[number]);
          if (json) printJson({ ok: true, by, groups: gs, total: all.total });
          else printGroups(String(by), gs, all.total);
          return EXIT.ok;
        }
        const l = await (
          await load.reconciler()
        ).listInReview(rt.config, rt.pool, { ...filter, limit: limit.value ?? LIST_DEFAULT_LIMIT });
        if (json) printJson({ ok: true, ...l });
        else printListing(l);
        return EXIT.ok;
      });
    } catch (err) {
      return printRefusal(err);
    }
  },
};
