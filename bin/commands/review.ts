/**
 * `review`: what a person does with the operations the system could not finish on its own. `list` shows them;
 * `retry`, `resolve-succeeded`, `resolve-failed` and `compensate` act on one, and `retry --all` on a selection,
 * one at a time through the review actions (each locked, checked and audited).
 */
import { ActionLedgerError, asActionLedgerError } from '../../core/errors.js';
import type { Runtime } from '../../runtime/index.js';
import type { InReview, ReviewKit, ReviewResult } from '../../reconciler/index.js';
import { load } from './load.js';
import {
  EXIT,
  JSON_ALWAYS,
  JSON_OPTION,
  parseCommand,
  printJson,
  printRefusal,
  runSubcommand,
  stderrLog,
  stringValues,
  table,
  usageError,
  type Command,
  type OptionSpecs,
  type Parsed,
} from '../cli-util.js';
import { listCommand, reasonOption, selection, SELECTION_OPTIONS, withReadRuntime } from './review-list.js';
import {
  actingActor,
  actingRequest,
  actingTenant,
  authenticateActing,
  BREAK_GLASS,
  requireCapability,
  type Acting,
  type ActingRequest,
} from './acting.js';

const ID_EXAMPLE = '6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e';
const REVIEW_EXITS = [EXIT.ok, EXIT.refused, EXIT.usage];

const WHO_WHY = {
  actor: {
    type: 'string',
    value: 'WHO',
    description: "a check: who acts, which must be the token's principal (or break-glass:NAME)",
    default: 'who acts',
  },
  reason: { type: 'string', value: 'WHY', required: true, description: 'why (audited)' },
  'break-glass': BREAK_GLASS,
} as const satisfies OptionSpecs;

const AUDITED_NOTE = `Who acts is the principal of the token in ACTIONLEDGER_TOKEN (its roles need the review capability;
it acts on its own tenant's operations only), or without a token the operator named by --break-glass NAME
(recorded as break-glass:NAME). Every action, done or refused, is in the audit log (gate_audit, action
review:<name>): a missing --reason is refused there (invalid_review, exit 1), not here.`;

/**
 * Opens the configured database and the review actions, establishes who acts (a token needs the `review`
 * capability), runs `fn`; a failure is printed as a refusal.
 */
async function withReview(
  req: ActingRequest,
  fn: (kit: ReviewKit, rt: Runtime, acting: Acting) => Promise<number>,
): Promise<number> {
  try {
    const [{ openRuntime }, { openReview }] = await Promise.all([load.runtime(), load.reconciler()]);
    const rt = await openRuntime({ name: 'review', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
    const kit = openReview(rt);
    try {
      const acting = await authenticateActing(rt, req);
      requireCapability(rt.config, acting, 'review');
      return await fn(kit, rt, acting);
    } finally {
      kit.close();
      await rt.close();
    }
  } catch (err) {
    return printRefusal(err);
  }
}

type Act = (kit: ReviewKit, id: string, who: Who, v: Record<string, string | undefined>) => Promise<ReviewResult>;
type Who = { actor: string; reason: string };

/**
 * A token acts on its own tenant's operations only: another tenant's is refused as one that does not exist,
 * and the refusal audited like the review's own.
 */
async function ownOperation(rt: Runtime, acting: Acting, action: string, id: string, why: string): Promise<void> {
  if (acting.tenant === null) return;
  const { LedgerView } = await load.ledger();
  const found = await new LedgerView(rt.pool, rt.config.schemaQuoted).show(id).catch(() => null);
  const tenant = found?.operation.tenant_id;
  if (tenant === undefined || tenant === acting.tenant) return;
  const { AuditWriter } = await load.gate();
  await new AuditWriter({ config: rt.config, pool: rt.pool }).after({
    action: `review:${action}`,
    outcome: 'not_found',
    context: { tenant_id: acting.tenant, principal_id: acting.actor },
    subjectId: id,
    detail: { why },
  });
  throw new ActionLedgerError('not_found', 'no such operation');
}

/** One OPERATION_ID, one action, its result printed as JSON. A missing --reason goes to the audited refusal. */
async function actOnOne(cmd: Command, parsed: Parsed, action: string, act: Act): Promise<number> {
  const [id, ...extra] = parsed.positionals;
  if (id === undefined || extra.length > 0) return usageError(cmd, 'expected one OPERATION_ID');
  const v = stringValues(parsed.values);
  const req = actingRequest(cmd, parsed.values);
  if (typeof req === 'number') return req;
  return withReview(req, async (kit, rt, acting) => {
    const who = { actor: actingActor(acting, 'actor', v.actor), reason: v.reason ?? '' };
    await ownOperation(rt, acting, action, id, who.reason);
    printJson(await act(kit, id, who, v));
    return EXIT.ok;
  });
}

function singleAction(name: string, summary: string, act: Act, extra: OptionSpecs, exampleTail: string): Command {
  return {
    name: `review ${name}`,
    summary,
    args: 'OPERATION_ID',
    notes: AUDITED_NOTE,
    options: { ...WHO_WHY, ...extra, json: JSON_ALWAYS },
    examples: [`actionledger review ${name} ${ID_EXAMPLE} ${exampleTail}`],
    exits: REVIEW_EXITS,
    async run(argv) {
      const parsed = parseCommand(this, argv, { positionals: true, checkRequired: false });
      if (typeof parsed === 'number') return parsed;
      return actOnOne(this, parsed, name.replace('-', '_'), act);
    },
  };
}

const resolveSucceeded = singleAction(
  'resolve-succeeded',
  "the provider applied it: record that, with the provider's receipt (audited)",
  (kit, id, who, v) => kit.review.resolveSucceeded(id, { ...who, receipt: v.receipt ?? '' }),
  {
    receipt: {
      type: 'string',
      value: 'R',
      description: "the provider's receipt for the effect (refused without one: invalid_review)",
      default: 'none',
    },
  },
  "--reason 'seen in the provider console' --receipt re_123",
);

const resolveFailed = singleAction(
  'resolve-failed',
  'it was not applied and will not be: record it failed (a later pass compensates earlier steps) (audited)',
  (kit, id, who) => kit.review.resolveFailed(id, who),
  {},
  "--reason 'the customer cancelled'",
);

const compensate = singleAction(
  'compensate',
  'undo it with the configured compensation (audited)',
  (kit, id, who) => kit.review.compensate(id, who),
  {},
  "--reason 'refund issued twice by hand'",
);

/** One operation's line in a bulk retry's report. */
interface BulkItem {
  operation_id: string;
  tenant_id: string;
  tool_name: string;
  review_reason: string;
  provider_contact: string;
  outcome: 'retried' | 'would_retry' | 'skipped' | 'refused' | 'failed' | 'not_attempted';
  code?: string;
  attempt?: number;
}

function item(o: InReview, outcome: BulkItem['outcome'], extra: Partial<BulkItem> = {}): BulkItem {
  const { operation_id, tenant_id, tool_name, review_reason, provider_contact } = o;
  return { operation_id, tenant_id, tool_name, review_reason, provider_contact, outcome, ...extra };
}

/**
 * Retries the selected operations one by one through the review action, each fenced on the attempt and reason it
 * was selected with. Those whose retry is not safe are skipped, never tried. A refusal moves on to the next; any
 * other failure (the database gone) stops the run and reports the rest as not attempted.
 */
async function retrySelected(kit: ReviewKit, ops: readonly InReview[], who: Who) {
  const out: BulkItem[] = [];
  let stopped = false;
  for (const o of ops) {
    if (stopped) out.push(item(o, 'not_attempted'));
    else if (!o.retry_safe) out.push(item(o, 'skipped', { code: 'retry_not_safe' }));
    else {
      try {
        const expect = { attempt: o.attempt, reviewReason: o.review_reason };
        const r = await kit.review.retry(o.operation_id, { ...who, expect });
        out.push(item(o, 'retried', r.attempt === undefined ? {} : { attempt: r.attempt }));
      } catch (err) {
        const coded = asActionLedgerError(err);
        stopped = coded.group !== 'refused';
        out.push(item(o, stopped ? 'failed' : 'refused', { code: coded.code }));
      }
    }
  }
  return out;
}

function printBulk(items: readonly BulkItem[], dryRun: boolean, json: boolean): number {
  const n = (outcome: BulkItem['outcome']): number => items.filter((i) => i.outcome === outcome).length;
  const ok = items.every((i) => i.outcome === (dryRun ? 'would_retry' : 'retried'));
  const counts = dryRun
    ? { would_retry: n('would_retry'), skipped: n('skipped') }
    : { retried: n('retried'), skipped: n('skipped'), refused: n('refused'), failed: n('failed') };
  const notAttempted = n('not_attempted');
  if (json) {
    printJson({
      ok,
      dry_run: dryRun,
      selected: items.length,
      ...counts,
      not_attempted: notAttempted,
      operations: items,
    });
  } else {
    if (items.length > 0) {
      const head = ['operation', 'tenant', 'tool', 'reason', 'provider contact', 'outcome', 'code / new attempt'];
      const rows = items.map((i) => [
        i.operation_id,
        i.tenant_id,
        i.tool_name,
        i.review_reason,
        i.provider_contact,
        i.outcome,
        i.code ?? (i.attempt === undefined ? '' : `attempt ${i.attempt}`),
      ]);
      process.stdout.write(`${table([head, ...rows])}\n\n`);
    }
    const summary = Object.entries(counts).map(([k, v]) => `${v} ${k.replace('_', ' ')}`);
    if (notAttempted > 0) summary.push(`${notAttempted} not attempted`);
    process.stdout.write(
      `${dryRun ? 'dry run, nothing changed: ' : ''}${items.length} selected: ${summary.join(', ')}\n`,
    );
  }
  return ok ? EXIT.ok : EXIT.refused;
}

/** `review retry --all`: checks the invocation, selects, and retries (or, with --dry-run, only says what it would). */
async function retryAll(cmd: Command, parsed: Parsed): Promise<number> {
  const v = stringValues(parsed.values);
  if (parsed.positionals.length > 0) return usageError(cmd, '--all retries a selection: give no OPERATION_ID with it');
  if (v.approval !== undefined || v.policy !== undefined)
    return usageError(cmd, '--approval and --policy go with one OPERATION_ID, not with --all');
  if (v['where-reason'] === undefined)
    return usageError(cmd, '--all needs --where-reason R (a review reason, or a prefix ending in :)');
  const filter = selection(cmd, parsed.values, 'where-reason');
  if (typeof filter === 'number') return filter;
  const dryRun = parsed.values['dry-run'] === true;
  const json = parsed.values.json === true;
  if (dryRun)
    return withReadRuntime(async (rt) => {
      const { operations } = await (await load.reconciler()).listInReview(rt.config, rt.pool, filter);
      const items = operations.map((o) =>
        o.retry_safe ? item(o, 'would_retry') : item(o, 'skipped', { code: 'retry_not_safe' }),
      );
      return printBulk(items, true, json);
    }).catch(printRefusal);
  // Checked before anything is selected: a bulk run without it would only write one refusal per operation.
  if (v.reason === undefined || v.reason === '') return usageError(cmd, 'missing --reason');
  const req = actingRequest(cmd, parsed.values);
  if (typeof req === 'number') return req;
  return withReview(req, async (kit, rt, acting) => {
    // A token selects in its own tenant only.
    const scoped = { ...filter, ...(acting.tenant === null ? {} : { tenant: actingTenant(acting, filter.tenant) }) };
    const who = { actor: actingActor(acting, 'actor', v.actor), reason: v.reason ?? '' };
    const { operations } = await (await load.reconciler()).listInReview(rt.config, rt.pool, scoped);
    return printBulk(await retrySelected(kit, operations, who), false, json);
  });
}

const BULK_ONLY = ['where-reason', 'tool', 'tenant', 'older-than', 'dry-run'] as const;

const retry: Command = {
  name: 'review retry',
  summary: 'send it again: a new attempt, same effect key, freshly authorized; or --all of a selection (audited)',
  args: 'OPERATION_ID',
  notes: `Allowed only when the recorded provider contact proves no effect (not_called, no_effect_confirmed);
otherwise refused (retry_not_safe).
${AUDITED_NOTE}

--all, instead of OPERATION_ID, retries every operation in review that --where-reason (and --tool, --tenant,
--older-than) select, one at a time, each audited as its own review:retry. Those whose retry is not safe are
skipped, never tried; one that changed since it was selected is refused. With --all, --reason is checked
here (usage error) before anything is selected, and a token selects in its own tenant only. Exit 0 when
every selected one was retried (or, with --dry-run, would be), 1 when any was skipped, refused or failed.`,
  options: {
    ...WHO_WHY,
    approval: {
      type: 'string',
      value: 'A',
      description: 'a fresh approval id for the new attempt (one OPERATION_ID only)',
      default: "the operation's approval",
    },
    policy: {
      type: 'string',
      value: 'V',
      description: 'the policy version of that approval (one OPERATION_ID only)',
      default: "the operation's policy version",
    },
    all: { type: 'boolean', description: 'retry the operations the selection options match', default: 'off' },
    'where-reason': {
      ...reasonOption('with --all, required: select the review reason'),
      default: 'none: --all refuses to run without it',
    },
    ...SELECTION_OPTIONS,
    'dry-run': {
      type: 'boolean',
      description:
        'with --all: say what would be retried and what skipped; change nothing (no one acts: no token or --reason needed)',
      default: 'off',
    },
    json: {
      ...JSON_OPTION,
      description: 'with --all: print the report as one JSON document (a single retry always prints JSON)',
    },
  },
  examples: [
    `actionledger review retry ${ID_EXAMPLE} --reason 'readback says nothing was applied'`,
    'actionledger review retry --all --where-reason authorization:authorization_denied --tenant tenant-a --dry-run',
    "actionledger review retry --all --where-reason authorization: --reason 'kill switch lifted after incident 7'",
    `actionledger review retry ${ID_EXAMPLE} --reason 'the API is down' --break-glass carol`,
  ],
  exits: REVIEW_EXITS,
  async run(argv) {
    // A single retry records a missing reason as an audited refusal: not checked here.
    const parsed = parseCommand(this, argv, { positionals: true, checkRequired: false });
    if (typeof parsed === 'number') return parsed;
    if (parsed.values.all === true) return retryAll(this, parsed);
    const bulk = BULK_ONLY.filter((k) => parsed.values[k] !== undefined);
    if (bulk.length > 0) return usageError(this, `${bulk.map((k) => `--${k}`).join(', ')} go with --all only`);
    return actOnOne(this, parsed, 'retry', (kit, id, who, v) =>
      kit.review.retry(id, {
        ...who,
        ...(v.approval === undefined ? {} : { approvalId: v.approval }),
        ...(v.policy === undefined ? {} : { policyVersion: v.policy }),
      }),
    );
  },
};

export const reviewCommand: Command = {
  name: 'review',
  summary: 'operations in review: list them; retry, resolve-succeeded, resolve-failed, compensate (audited)',
  notes:
    "What the system cannot decide waits in review with a reason (authorization:authorization_denied,\nfinal_check:tool_disabled, provider:..., no_effect_confirmed, ...). 'review list' shows them; the actions\nname who and why, and each one, done or refused, is in the audit log.",
  options: {},
  examples: [...listCommand.examples.slice(0, 2), ...retry.examples.slice(1, 3)],
  exits: REVIEW_EXITS,
  subcommands: new Map([
    ['list', listCommand],
    ['retry', retry],
    ['resolve-succeeded', resolveSucceeded],
    ['resolve-failed', resolveFailed],
    ['compensate', compensate],
  ]),
  run(argv) {
    return runSubcommand(this, argv);
  },
};
