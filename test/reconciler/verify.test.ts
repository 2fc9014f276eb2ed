import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { lastJson, runCli } from '../helpers/cli.js';
import { ctx, dispatchEnv, PROVIDER_TOKEN, settled } from '../helpers/fleet.js';
import { createMtlsAgent, postJson } from '../../transport/http-client.js';
import { canonicalJson, type JsonValue } from '../../core/json.js';
import { historyProblems } from '../../reconciler/index.js';
import { bindQueries } from '../../db/db.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';

const dq = bindQueries(dispatcherQueries, '"actionledger"');

t.test('history paths: legal, broken, illegal', (t) => {
  t.same(
    historyProblems(
      [
        { from_status: null, to_status: 'pending' },
        { from_status: 'pending', to_status: 'executing' },
        { from_status: 'executing', to_status: 'succeeded' },
      ],
      'succeeded',
    ),
    [],
  );
  t.match(
    historyProblems(
      [
        { from_status: null, to_status: 'pending' },
        { from_status: 'pending', to_status: 'succeeded' },
      ],
      'succeeded',
    ),
    [{ kind: 'illegal_transition' }],
  );
  t.match(historyProblems([{ from_status: null, to_status: 'pending' }], 'succeeded'), [{ kind: 'history_broken' }]);
  t.match(historyProblems([], 'pending'), [{ kind: 'history_broken' }]);
  t.end();
});

t.test(
  'the verifier finds a corrupted args hash, a duplicated provider effect and an illegal transition',
  async (t) => {
    const e = await dispatchEnv(t, {}, { honorIdempotencyKey: false });
    const ops = [];
    for (let i = 0; i < 4; i++)
      ops.push(
        await e.ledger.reserve(ctx(`v-${i}`), 'issue_refund', { order_id: `v${i}`, amount: 10 + i, currency: 'EUR' }),
      );
    const dispatcher = await e.dispatcher(2);
    for (const o of ops) t.equal((await settled(e.pool, o.operation_id)).status, 'succeeded');
    await dispatcher.stop();

    const clean = await runCli(['verify', '--json'], e.env);
    t.equal(clean.code, 0, clean.stdout + clean.stderr);
    t.match(lastJson(clean.stdout), { ok: true, operations: 4, listings: 1, provider_effects: 4, discrepancies: [] });

    const [a, b, c, d] = ops as [(typeof ops)[0], (typeof ops)[0], (typeof ops)[0], (typeof ops)[0]];
    // 1. Hand-corrupted arguments (the immutability trigger must be bypassed to do it).
    await e.pool.query('ALTER TABLE actionledger.operations DISABLE TRIGGER operations_immutable');
    await e.pool.query(
      `UPDATE actionledger.operations SET arguments_json = jsonb_set(arguments_json, '{amount}', '99999') WHERE operation_id = $1`,
      [a.operation_id],
    );
    await e.pool.query('ALTER TABLE actionledger.operations ENABLE TRIGGER operations_immutable');
    // 2. The same request sent to the provider again outside the dispatcher: a second effect for one key.
    const agent = createMtlsAgent({
      ca: readFileSync(join(e.dir, 'ca.crt'), 'utf8'),
      cert: readFileSync(join(e.dir, 'client.crt'), 'utf8'),
      key: readFileSync(join(e.dir, 'client.key')),
      connectTimeoutMs: 2000,
    });
    const { rows } = await e.pool.query<{ arguments_json: JsonValue }>(
      'SELECT arguments_json FROM actionledger.operations WHERE operation_id = $1',
      [b.operation_id],
    );
    const again = await postJson(agent, e.provider.endpoint, {
      headers: { 'Idempotency-Key': b.effect_key, authorization: `Bearer ${PROVIDER_TOKEN}` },
      body: canonicalJson(rows[0]?.arguments_json as JsonValue),
      timeoutMs: 5000,
      maxBytes: 4096,
    });
    await agent.close();
    t.match(again, { kind: 'response', status: 201 });
    t.equal(e.provider.effectsFor(b.effect_key), 2);
    // 3. An illegal transition appended to a history (the table is append-only, so that is how it would look).
    await e.pool.query(
      `INSERT INTO actionledger.operation_history (operation_id, from_status, to_status, actor, reason) VALUES ($1, 'succeeded', 'pending', 'mallory', 'hand-edit')`,
      [c.operation_id],
    );

    // 4. The claim listing out of step with the ledger, as a restore without operation_claims would leave it: a
    // claimed operation missing from it, and a listing left for an operation that ended.
    const late = await e.ledger.reserve(ctx('v-late'), 'issue_refund', { order_id: 'vl', amount: 5, currency: 'EUR' });
    const taken = await e.pool.query<{ operation_id: string }>(dq.outboxClaimBatch, [1, 'w-restored']);
    t.same(
      taken.rows.map((r) => r.operation_id),
      [late.operation_id],
    );
    await e.pool.query('DELETE FROM actionledger.operation_claims WHERE operation_id = $1', [late.operation_id]);
    await e.pool.query("INSERT INTO actionledger.operation_claims (operation_id, claimed_by) VALUES ($1, 'w-gone')", [
      b.operation_id,
    ]);

    const dirty = await runCli(['verify', '--json'], e.env);
    t.equal(dirty.code, 1, 'exit 1: discrepancies');
    const report = lastJson(dirty.stdout) as { ok: boolean; discrepancies: { kind: string; operation_id?: string }[] };
    t.equal(report.ok, false);
    const found = report.discrepancies.map((x) => `${x.kind}:${x.operation_id ?? '-'}`).sort();
    t.same(
      found,
      [
        `args_hash_mismatch:${a.operation_id}`,
        `history_broken:${c.operation_id}`,
        `illegal_transition:${c.operation_id}`,
        `provider_effect_duplicated:${b.operation_id}`,
        `claim_listing_mismatch:${late.operation_id}`,
        `claim_listing_mismatch:${b.operation_id}`,
      ].sort(),
      'exactly these, and nothing about the untouched operation',
    );
    t.notOk(found.some((f) => f.endsWith(d.operation_id)));
    const text = await runCli(['verify'], e.env);
    t.equal(text.code, 1);
    t.match(text.stdout, /provider_effect_duplicated/);
    t.match(text.stdout, /args_hash_mismatch/);
  },
);

t.test(
  'the verifier reports a provider effect no operation owns and a succeeded operation without an effect',
  async (t) => {
    const e = await dispatchEnv(t);
    const o = await e.ledger.reserve(ctx('ghost'), 'issue_refund', { order_id: 'g1', amount: 1, currency: 'EUR' });
    // Reserved before any dispatcher runs, and taken out of the outbox: it is never sent.
    const r = await e.ledger.reserve(ctx('never-sent'), 'issue_refund', { order_id: 'g2', amount: 2, currency: 'EUR' });
    await e.pool.query(`DELETE FROM actionledger.outbox WHERE operation_id = $1`, [r.operation_id]);
    await e.dispatcher(1);
    t.equal((await settled(e.pool, o.operation_id)).status, 'succeeded');
    const agent = createMtlsAgent({
      ca: readFileSync(join(e.dir, 'ca.crt'), 'utf8'),
      cert: readFileSync(join(e.dir, 'client.crt'), 'utf8'),
      key: readFileSync(join(e.dir, 'client.key')),
      connectTimeoutMs: 2000,
    });
    await postJson(agent, e.provider.endpoint, {
      headers: { 'Idempotency-Key': 'not-a-ledger-key', authorization: `Bearer ${PROVIDER_TOKEN}` },
      body: '{"amount":1}',
      timeoutMs: 5000,
      maxBytes: 4096,
    });
    await agent.close();
    // Forge a succeeded row the provider never saw, with a legal-looking history.
    await e.pool.query(
      `UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid() WHERE operation_id = $1`,
      [r.operation_id],
    );
    await e.pool.query(
      `UPDATE actionledger.operations SET status = 'succeeded', provider_receipt = 'forged' WHERE operation_id = $1`,
      [r.operation_id],
    );
    await e.pool.query(
      `INSERT INTO actionledger.operation_history (operation_id, from_status, to_status, actor, reason) VALUES ($1, 'pending', 'executing', 'x', 'claimed'), ($1, 'executing', 'succeeded', 'x', 'provider_receipt')`,
      [r.operation_id],
    );
    const out = await runCli(['verify', '--json'], e.env);
    t.equal(out.code, 1);
    const kinds = (lastJson(out.stdout) as { discrepancies: { kind: string }[] }).discrepancies
      .map((x) => x.kind)
      .sort();
    t.same(kinds, ['evidence_missing', 'provider_effect_missing', 'provider_effect_unknown']);
  },
);
