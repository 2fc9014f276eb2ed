/**
 * `actionledger review list` and `review retry --all` through the real command, on a real database: operations
 * are put in review through the ledger's own fenced transitions (claimed, then sent to review with the reason
 * and provider contact a dispatcher or reconciler records), the way they get there in production.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  baseToolConfig,
  createTestDatabase,
  ctx,
  ledgerFixture,
  TEST_SECRET,
  type LedgerFixture,
} from '../helpers/db.js';
import { runCli, type CliResult } from '../helpers/cli.js';
import pg from 'pg';
import { quoteSchemaName } from '../../config/index.js';
import { checkMigrated, migrate, readMigrations } from '../../db/migrate.js';
import { createLogger } from '../../core/log.js';
import { Compensator } from '../../compensator/index.js';
import type { ProviderContact } from '../../ledger/index.js';
import { listInReview, Review } from '../../reconciler/index.js';
import { formatAge } from '../../bin/commands/review-list.js';
import { PrincipalStore } from '../../principals/index.js';
import { putOut } from '../helpers/review-state.js';

interface Env {
  env: NodeJS.ProcessEnv;
  fx: LedgerFixture;
  cli(args: string[], extraEnv?: NodeJS.ProcessEnv): Promise<CliResult>;
  /** Reserves a step of `tool` for `tenant`, claims it and sends it to review as a worker or reconciler would. */
  inReview(spec: Spec): Promise<string>;
  /** Claims an operation in review again (after a retry) and sends it back to review. */
  backToReview(id: string, reason: string, contact: ProviderContact): Promise<void>;
}

interface Spec {
  step: string;
  reason: string;
  contact: ProviderContact;
  tool?: string;
  tenant?: string;
  /** Seconds since it entered review (its history row is dated back). */
  ago?: number;
}

async function reviewEnv(t: Test): Promise<Env> {
  const fx = await ledgerFixture(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-review-cli-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig, api: { permissions: { review: ['operator'] } } }));
  const env = { DATABASE_URL: fx.url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const send = (id: string, reason: string, contact: ProviderContact, ago?: number): Promise<void> =>
    putOut(fx, id, { reason, contact, ...(ago === undefined ? {} : { agoS: ago }) });
  return {
    env,
    fx,
    cli: (args, extraEnv = {}) => runCli(args, { ...env, LOG_LEVEL: 'warn', ...extraEnv }, { timeoutMs: 150_000 }),
    async inReview(s) {
      const r = await fx.ledger.reserve(
        ctx({ workflow_step_id: s.step, tenant_id: s.tenant ?? 'tenant-a' }),
        s.tool ?? 'issue_refund',
        s.tool === 'send_email' ? { to: 'a@example.com', subject: s.step } : { order_id: s.step, amount: 1 },
      );
      await send(r.operation_id, s.reason, s.contact, s.ago);
      return r.operation_id;
    },
    async backToReview(id, reason, contact) {
      const { rows } = await fx.pool.query<{ status: string }>(
        `SELECT status FROM actionledger.operations WHERE operation_id = $1`,
        [id],
      );
      if (rows[0]?.status !== 'pending') throw new Error(`${id} is ${rows[0]?.status}, not pending`);
      await send(id, reason, contact);
    },
  };
}

/** The operations the fixture puts in review, by name; `pending` is reserved and never leaves pending. */
async function populate(e: Env): Promise<Record<string, string>> {
  const ids: Record<string, string> = {};
  const specs: [string, Spec][] = [
    ['denied_old', { step: 'a', reason: 'authorization:authorization_denied', contact: 'not_called', ago: 3 * 3600 }],
    ['no_receipt', { step: 'e', reason: 'provider:provider_no_receipt', contact: 'maybe_called', ago: 3600 }],
    [
      'disabled',
      { step: 'c', reason: 'final_check:tool_disabled', contact: 'not_called', tool: 'send_email', ago: 20 * 60 },
    ],
    ['unavailable', { step: 'b', reason: 'authorization:authorization_unavailable', contact: 'not_called' }],
    ['unreachable', { step: 'd', reason: 'provider:provider_unreachable:ECONNREFUSED', contact: 'not_called' }],
    ['no_effect', { step: 'f', reason: 'no_effect_confirmed', contact: 'no_effect_confirmed' }],
    [
      'denied_b',
      { step: 'h', reason: 'authorization:authorization_denied', contact: 'not_called', tenant: 'tenant-b' },
    ],
  ];
  for (const [name, spec] of specs) ids[name] = await e.inReview(spec);
  ids.pending = (
    await e.fx.ledger.reserve(ctx({ workflow_step_id: 'p' }), 'issue_refund', { order_id: 'p', amount: 1 })
  ).operation_id;
  return ids;
}

interface Listed {
  ok: boolean;
  operations: Record<string, unknown>[];
  total: number;
  truncated: boolean;
}

function parse<T>(t: Test, r: CliResult, what: string): T {
  t.equal(r.stdout.split('\n').filter((l) => l !== '').length, 1, `${what}: one JSON line (${r.stdout}${r.stderr})`);
  return JSON.parse(r.stdout) as T;
}

async function state(e: Env, id: string): Promise<{ status: string; attempt: number; review_reason: string | null }> {
  const { rows } = await e.fx.pool.query<{ status: string; attempt: number; review_reason: string | null }>(
    'SELECT status, attempt, review_reason FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  if (rows[0] === undefined) throw new Error(`no operation ${id}`);
  return rows[0];
}

async function retryAudits(e: Env): Promise<Record<string, unknown>[]> {
  return (
    await e.fx.pool.query(
      "SELECT subject_id, outcome, principal_id, detail FROM actionledger.gate_audit WHERE action = 'review:retry' ORDER BY id",
    )
  ).rows as Record<string, unknown>[];
}

t.test('review list: filters, order, JSON shape, text table, counts, bad values', async (t) => {
  const e = await reviewEnv(t);
  const ids = await populate(e);
  const name = Object.fromEntries(Object.entries(ids).map(([k, v]) => [v, k]));
  const list = async (...args: string[]): Promise<Listed> => {
    const r = await e.cli(['review', 'list', ...args, '--json']);
    t.equal(r.code, 0, `review list ${args.join(' ')}: exit 0 (${r.stderr})`);
    return parse<Listed>(t, r, `review list ${args.join(' ')}`);
  };
  const names = (l: Listed): string[] => l.operations.map((o) => name[String(o.operation_id)] ?? '?');

  const all = await list();
  t.equal(all.ok, true);
  t.equal(all.total, 7, 'every operation in review, and only those (the pending one is not)');
  t.equal(all.truncated, false);
  t.same(names(all).slice(0, 3), ['denied_old', 'no_receipt', 'disabled'], 'oldest entry into review first');
  t.same(names(all).slice(3).sort(), ['denied_b', 'no_effect', 'unavailable', 'unreachable']);
  const old = all.operations[0] ?? {};
  t.match(old, {
    operation_id: ids.denied_old,
    tenant_id: 'tenant-a',
    tool_name: 'issue_refund',
    review_reason: 'authorization:authorization_denied',
    provider_contact: 'not_called',
    retry_safe: true,
    attempt: 1,
    reconcile_attempts: 0,
    entered_review_at: String,
  });
  t.ok(
    Number(old.age_s) >= 3 * 3600 && Number(old.age_s) < 4 * 3600,
    `age since it entered review: ${Number(old.age_s)}`,
  );
  t.match(all.operations[1], { provider_contact: 'maybe_called', retry_safe: false }, 'maybe called: not safe');
  t.match(
    all.operations.find((o) => o.operation_id === ids.no_effect),
    { provider_contact: 'no_effect_confirmed', retry_safe: true },
  );

  t.same(names(await list('--reason', 'authorization:')).sort(), ['denied_b', 'denied_old', 'unavailable']);
  t.same(names(await list('--reason', 'authorization:authorization_denied')), ['denied_old', 'denied_b']);
  t.equal((await list('--reason', 'authorization')).total, 0, 'without the colon the reason matches exactly');
  t.equal((await list('--reason', 'authorization:authorization')).total, 0, 'no prefix match without the colon');
  t.same(names(await list('--tool', 'send_email')), ['disabled']);
  t.same(names(await list('--tenant', 'tenant-b')), ['denied_b']);
  t.same(names(await list('--older-than', '30m')), ['denied_old', 'no_receipt']);
  t.same(names(await list('--older-than', '2h')), ['denied_old']);
  t.same(names(await list('--older-than', '1d')), []);
  t.same(names(await list('--reason', 'provider:', '--older-than', '10m')), ['no_receipt']);
  const two = await list('--limit', '2');
  t.same(names(two), ['denied_old', 'no_receipt']);
  t.match(two, { total: 7, truncated: true }, 'the total and that more exist, beyond the limit');

  const text = await e.cli(['review', 'list', '--limit', '2']);
  t.equal(text.code, 0, text.stderr);
  const lines = text.stdout.split('\n');
  t.match(lines[0], /^operation +tenant +tool +reason +provider contact +retry +in review +attempt$/);
  t.match(
    lines[1],
    new RegExp(
      `^${ids.denied_old} +tenant-a +issue_refund +authorization:authorization_denied +not_called +safe +3h( \\d+m)? +1$`,
    ),
  );
  t.match(lines[2], new RegExp(`^${ids.no_receipt} .* maybe_called +not safe +1h( \\d+m)? +1$`));
  t.match(
    text.stdout,
    /\n7 in review; 2 listed, oldest first \(1 of them safe to retry\)\n5 more beyond --limit 2 not listed\n$/,
  );

  const by = await e.cli(['review', 'list', '--by', 'reason', '--json']);
  t.equal(by.code, 0, by.stderr);
  const groups = parse<{ groups: Record<string, unknown>[]; total: number }>(t, by, 'review list --by reason');
  t.equal(groups.total, 7);
  t.match(groups.groups[0], { reason: 'authorization:authorization_denied', count: 2, retry_safe: 2 });
  t.match(
    groups.groups.find((g) => g.reason === 'provider:provider_no_receipt'),
    { count: 1, retry_safe: 0 },
  );

  for (const bad of [
    ['--older-than', '90'],
    ['--older-than', '2weeks'],
    ['--limit', '0'],
    ['--limit', '10001'],
  ]) {
    const r = await e.cli(['review', 'list', ...bad]);
    t.equal(r.code, 2, `review list ${bad.join(' ')}: usage error`);
    t.match(r.stderr.split('\n')[0], new RegExp(bad[0] ?? ''), 'the message names the option');
    t.equal(r.stdout, '', 'nothing on stdout');
  }
});

t.test('review list on a database that was never migrated: a structured refusal, and nothing created', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const e = await reviewEnv(t);
  const r = await runCli(
    ['review', 'list', '--json'],
    { ...e.env, DATABASE_URL: url, LOG_LEVEL: 'warn' },
    {
      timeoutMs: 150_000,
    },
  );
  t.equal(r.code, 1, r.stderr);
  t.match(parse(t, r, 'review list on an empty database'), {
    ok: false,
    error: 'schema_not_migrated',
    details: { applied: 0 },
  });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const { rows } = await client.query<{ schema: string | null }>(
    "SELECT to_regnamespace('actionledger')::text AS schema",
  );
  await client.end();
  t.equal(rows[0]?.schema, null, 'it did not migrate: the schema still does not exist');
});

t.test('review retry --all: only the safe ones are retried, each audited; dry runs change nothing', async (t) => {
  const e = await reviewEnv(t);
  const ids = await populate(e);
  const who = ['--reason', 'network fixed', '--break-glass', 'carol'];

  const dry = await e.cli(['review', 'retry', '--all', '--where-reason', 'provider:', '--dry-run', '--json']);
  t.equal(dry.code, 1, 'exit 1: one of the selection would be skipped');
  const plan = parse<Record<string, unknown>>(t, dry, 'dry run');
  t.match(plan, { ok: false, dry_run: true, selected: 2, would_retry: 1, skipped: 1 });
  t.same(
    (plan.operations as Record<string, unknown>[]).map((o) => [o.operation_id, o.outcome, o.code]),
    [
      [ids.no_receipt, 'skipped', 'retry_not_safe'],
      [ids.unreachable, 'would_retry', undefined],
    ],
  );
  for (const id of [ids.no_receipt, ids.unreachable])
    t.match(await state(e, id ?? ''), { status: 'needs_review', attempt: 1 }, 'the dry run changed nothing');
  t.same(await retryAudits(e), [], 'and audited no retry');

  const run = await e.cli(['review', 'retry', '--all', '--where-reason', 'provider:', ...who, '--json']);
  t.equal(run.code, 1, 'exit 1: one was skipped');
  const report = parse<Record<string, unknown>>(t, run, 'retry --all');
  t.match(report, { ok: false, dry_run: false, selected: 2, retried: 1, skipped: 1, refused: 0, failed: 0 });
  t.same(
    (report.operations as Record<string, unknown>[]).map((o) => [o.operation_id, o.outcome, o.code ?? o.attempt]),
    [
      [ids.no_receipt, 'skipped', 'retry_not_safe'],
      [ids.unreachable, 'retried', 2],
    ],
  );
  t.match(await state(e, ids.unreachable ?? ''), { status: 'pending', attempt: 2, review_reason: null });
  t.match(
    await state(e, ids.no_receipt ?? ''),
    { status: 'needs_review', attempt: 1, review_reason: 'provider:provider_no_receipt' },
    'the maybe-called one is still in review, never forced',
  );
  const outbox = await e.fx.pool.query('SELECT attempt FROM actionledger.outbox WHERE operation_id = $1', [
    ids.unreachable,
  ]);
  t.same(outbox.rows, [{ attempt: 2 }], 'the retried one waits for a dispatcher with its new attempt');
  t.match(await retryAudits(e), [
    {
      subject_id: ids.unreachable,
      outcome: 'ok',
      principal_id: 'break-glass:carol',
      detail: { why: 'network fixed' },
    },
  ]);
  t.equal((await retryAudits(e)).length, 1, 'one review:retry audit row: the skipped one was not tried');

  // With a token the selection is the token's tenant: no --tenant needed, and another one refused.
  const store = new PrincipalStore(e.fx.config, e.fx.pool);
  await store.add('dana', 'person', '', 'test');
  await store.grant('dana', 'tenant-a', 'operator', 'test');
  const token = { ACTIONLEDGER_TOKEN: (await store.createToken('dana', 'tenant-a', '', 1, 'test')).token };
  const denied = ['--where-reason', 'authorization:authorization_denied', '--reason', 'network fixed'];
  const otherTenant = await e.cli(['review', 'retry', '--all', ...denied, '--tenant', 'tenant-b'], token);
  t.equal(otherTenant.code, 1);
  t.match(JSON.parse(otherTenant.stdout), { ok: false, error: 'invalid_request', message: /--tenant/ });
  const text = await e.cli(['review', 'retry', '--all', ...denied], token);
  t.equal(text.code, 0, `every selected one retried: exit 0 (${text.stderr})`);
  t.match(
    text.stdout,
    new RegExp(
      `\\n${ids.denied_old} +tenant-a +issue_refund +authorization:authorization_denied +not_called +retried +attempt 2\\n`,
    ),
  );
  t.match(text.stdout, /\n1 selected: 1 retried, 0 skipped, 0 refused, 0 failed\n$/);
  t.match(await state(e, ids.denied_b ?? ''), { status: 'needs_review' }, 'the other tenant was not selected');
  t.match(await state(e, ids.unavailable ?? ''), { status: 'needs_review' }, 'nor the other authorization reason');
  const history = await e.fx.pool.query(
    "SELECT actor, reason FROM actionledger.operation_history WHERE operation_id = $1 AND reason = 'review:retry'",
    [ids.denied_old],
  );
  t.same(
    history.rows,
    [{ actor: 'dana', reason: 'review:retry' }],
    "the operation's history names the token's principal",
  );

  const again = await e.cli(['review', 'retry', '--all', ...denied, '--json'], token);
  t.equal(again.code, 0);
  t.match(parse(t, again, 'retry --all again'), { ok: true, selected: 0, retried: 0 }, 'nothing left to retry');
  t.equal((await retryAudits(e)).length, 2, 'two retries, two audit rows');

  const nobody = await e.cli(['review', 'retry', '--all', '--where-reason', 'authorization:', '--reason', 'x']);
  t.equal(nobody.code, 1, 'neither a token nor --break-glass: refused');
  t.match(JSON.parse(nobody.stdout), { ok: false, error: 'unauthenticated' });
  t.match(await state(e, ids.unavailable ?? ''), { status: 'needs_review' }, 'and nothing was retried');
});

t.test('a retry selected under one attempt is refused once the operation has moved on', async (t) => {
  const e = await reviewEnv(t);
  const id = await e.inReview({ step: 's', reason: 'authorization:authorization_denied', contact: 'not_called' });
  const { config, pool, ledger } = e.fx;
  const log = createLogger({ level: 'silent', name: 'test' });
  const review = new Review(config, pool, new Compensator({ config, pool, ledger, log, actor: 'test' }));
  const [selected] = (await listInReview(config, pool, { reason: 'authorization:' })).operations;
  if (selected === undefined) throw new Error('not listed');
  const expect = { attempt: selected.attempt, reviewReason: selected.review_reason };
  // Someone else retries it; it is refused again for the same reason, in review under its next attempt.
  await review.retry(id, { actor: 'bob', reason: 'first' });
  await e.backToReview(id, 'authorization:authorization_denied', 'not_called');
  await t.rejects(review.retry(id, { actor: 'carol', reason: 'stale listing', expect }), {
    code: 'invalid_state_transition',
    details: { attempt: 2, expected_attempt: 1 },
  });
  t.match(await state(e, id), { status: 'needs_review', attempt: 2 }, 'not retried on a state nobody selected');
  t.match(
    (await retryAudits(e)).map((a) => a.outcome),
    ['ok', 'invalid_state_transition'],
    'the refusal is audited',
  );
  const fresh = await review.retry(id, { actor: 'carol', reason: 'current', expect: { ...expect, attempt: 2 } });
  t.match(fresh, { ok: true, attempt: 3 }, 'with the current attempt it goes through');
});

t.test('ages in the text listing: the two largest units', (t) => {
  const cases: [number, string][] = [
    [0, '0s'],
    [0.9, '0s'],
    [59, '59s'],
    [61, '1m 1s'],
    [3600, '1h'],
    [3 * 3600 + 125, '3h 2m'],
    [86_400 + 3600 + 61, '1d 1h'],
    [8 * 86_400 + 59, '8d'],
  ];
  for (const [s, text] of cases) t.equal(formatAge(s), text, `${s} s`);
  t.end();
});

t.test(
  'checkMigrated: a schema behind this release is refused, a current one passes, nothing is written',
  async (t) => {
    const url = await createTestDatabase(t, { empty: true });
    const client = new pg.Client({ connectionString: url });
    // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
    client.on('error', () => undefined);
    await client.connect();
    t.teardown(() => client.end());
    const all = readMigrations();
    const quoted = quoteSchemaName('actionledger');
    await migrate(client, 'actionledger', quoted, all.slice(0, 3));
    await t.rejects(checkMigrated(client, quoted), {
      code: 'schema_not_migrated',
      message: new RegExp(`has 3 of ${all.length} migrations`),
      details: { applied: 3, expected: all.length },
    });
    const versions = await client.query('SELECT version FROM actionledger.schema_migrations');
    t.equal(versions.rowCount, 3, 'the check applied nothing');
    await migrate(client, 'actionledger', quoted, all);
    await t.resolves(checkMigrated(client, quoted), 'current: passes');
  },
);
