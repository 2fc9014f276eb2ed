import t, { type Test } from 'tap';
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getJson, postJson, type HttpOutcome, type HttpResponse } from '../../transport/http-client.js';
import { SandboxProvider } from '../../sandbox/provider.js';
import { startProvider, testAgent, testPki } from '../helpers/sandbox.js';

const TOKEN = 'sandbox-token';
const auth = { authorization: `Bearer ${TOKEN}` };
const opts = (headers: Record<string, string> = auth) => ({ headers, timeoutMs: 2_000, maxBytes: 64 * 1024 });
const refund = (
  key: string,
  body: unknown = { order_id: 'o-1', amount: 500 },
  headers: Record<string, string> = auth,
) => ({
  ...opts({ ...headers, 'idempotency-key': key }),
  body: JSON.stringify(body),
});

function response(t: Test, out: HttpOutcome): HttpResponse {
  t.equal(out.kind, 'response', `a response (${out.kind}/${'code' in out ? out.code : ''})`);
  if (out.kind !== 'response') throw new Error(`expected a response, got ${out.kind}/${out.code}`);
  return out;
}

t.test('Stripe-like idempotency: one effect per key, replays return the same receipt', async (t) => {
  const provider = await startProvider(t, { token: TOKEN });
  const agent = await testAgent(t);
  const first = response(t, await postJson(agent, provider.endpoint, refund('key-a')));
  t.equal(first.status, 201);
  t.match(first.json, { operation_id: /^op_/, status: 'applied' });
  const replay = response(t, await postJson(agent, provider.endpoint, refund('key-a')));
  t.same(replay.json, first.json);
  t.equal(replay.headers['x-request-id'], first.headers['x-request-id'], 'the receipt header is stable too');
  t.equal(replay.headers['idempotent-replayed'], 'true');

  const reused = response(
    t,
    await postJson(agent, provider.endpoint, refund('key-a', { order_id: 'o-1', amount: 9999 })),
  );
  t.match(reused, { status: 422, json: { error: 'idempotency_key_reused' } }, 'same key, other body: refused');
  t.equal(provider.requestsFor('key-a'), 3);
  t.equal(provider.effectsFor('key-a'), 1);
  t.match(provider.allEffects(), [
    { key: 'key-a', body: { order_id: 'o-1', amount: 500 }, operationId: first.json?.operation_id },
  ]);

  const noKey = response(t, await postJson(agent, provider.endpoint, { ...opts(), body: '{}' }));
  t.match(noKey, { status: 400, json: { error: 'missing_idempotency_key' } });
  const badJson = response(t, await postJson(agent, provider.endpoint, { ...refund('key-b'), body: '{"a":1,"a":2}' }));
  t.match(badJson, { status: 400, json: { error: 'invalid_json' } });
  t.equal(provider.allEffects().length, 1);
});

t.test('bearer token: missing or wrong is 401 and records no effect; headers are remembered', async (t) => {
  const provider = await startProvider(t, { token: TOKEN });
  const agent = await testAgent(t);
  for (const headers of [{}, { authorization: 'Bearer wrong' }, { authorization: TOKEN }] as Record<string, string>[]) {
    const out = response(t, await postJson(agent, provider.endpoint, refund('key-x', undefined, headers)));
    t.match(out, { status: 401, json: { error: 'unauthorized' } });
  }
  t.equal(provider.effectsFor('key-x'), 0);
  t.equal(provider.requestsFor('key-x'), 3, 'refused requests are still counted');
  t.same(
    provider.requests().map((r) => r.headers.authorization),
    [undefined, 'Bearer wrong', TOKEN],
  );
  t.equal(provider.requests()[0]?.clientCommonName, 'test-dispatcher');
  const readback = response(t, await getJson(agent, provider.readbackUrl('key-x'), opts({})));
  t.equal(readback.status, 401, 'readback needs the token too');
});

t.test('readback and listing are authoritative; readback faults for the next N calls', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  const receipt = response(t, await postJson(agent, provider.endpoint, refund('key/with?odd chars')));
  const applied = response(t, await getJson(agent, provider.readbackUrl('key/with?odd chars'), opts()));
  t.match(applied, { status: 200, json: { state: 'applied', operation_id: receipt.json?.operation_id } });
  t.match(response(t, await getJson(agent, provider.readbackUrl('never'), opts())), {
    status: 404,
    json: { state: 'no_effect' },
  });

  provider.inject({ kind: 'readbackFailing' }, { times: 2 });
  for (let i = 0; i < 2; i++) {
    t.equal(response(t, await getJson(agent, provider.readbackUrl('key/with?odd chars'), opts())).status, 503);
  }
  t.equal(
    response(t, await getJson(agent, provider.readbackUrl('key/with?odd chars'), opts())).status,
    200,
    'then healthy',
  );
  provider.inject({ kind: 'readbackInconclusive' });
  t.match(response(t, await getJson(agent, provider.readbackUrl('never'), opts())), {
    status: 200,
    json: { state: 'pending' },
  });

  const listing = response(t, await getJson(agent, `${provider.url}/v1/effects`, opts()));
  t.match(listing.json, { effects: { 'key/with?odd chars': [{ operation_id: receipt.json?.operation_id }] } });
  t.equal(provider.requestsFor('key/with?odd chars'), 1, 'readbacks are not counted as effect requests');
});

t.test('faults: next N requests, or only keys a predicate accepts; commit flags', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  provider.inject({ kind: 'status', status: 500 }, { when: (k) => k.startsWith('bad-'), times: Infinity });
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('good-1'))).status, 201);
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('bad-1'))).status, 500);
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('bad-2'))).status, 500);
  t.equal(provider.effectsFor('bad-1') + provider.effectsFor('bad-2'), 0, 'a status fault records nothing by default');
  provider.clearFaults();
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('bad-1'))).status, 201, 'cleared');

  provider.inject({ kind: 'status', status: 503, commit: true }, { times: 2 });
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('c-1'))).status, 503);
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('c-1'))).status, 503);
  t.equal(provider.effectsFor('c-1'), 1, 'committed once, answered 503 twice');
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('c-1'))).status, 201, 'the replay finds it');

  provider.inject({ kind: 'status', status: 422, body: { error: 'card_declined' } });
  t.match(response(t, await postJson(agent, provider.endpoint, refund('d-1'))), {
    status: 422,
    json: { error: 'card_declined' },
  });
  provider.inject({ kind: 'noReceipt', commit: false });
  t.equal(response(t, await postJson(agent, provider.endpoint, refund('n-1'))).status, 201);
  t.equal(provider.effectsFor('n-1'), 0, 'commit: false overrides the default');
});

t.test('without idempotency support every committed request is a new effect', async (t) => {
  const provider = await startProvider(t, { honorIdempotencyKey: false });
  const agent = await testAgent(t);
  const a = response(t, await postJson(agent, provider.endpoint, refund('same')));
  const b = response(t, await postJson(agent, provider.endpoint, refund('same')));
  t.not(a.json?.operation_id, b.json?.operation_id);
  t.equal(provider.effectsFor('same'), 2, 'the duplicate is visible');
});

t.test('stop is safe before start, repeatable, and ends hanging requests at once', async (t) => {
  const p = await testPki();
  const idle = new SandboxProvider({ tls: { ...p.server, ca: p.ca.cert } });
  await idle.stop();
  await idle.stop();
  t.throws(() => idle.url, 'no url before start');

  const provider = await startProvider(t);
  const agent = await testAgent(t);
  provider.inject({ kind: 'timeout' });
  const pending = postJson(agent, provider.endpoint, { ...refund('hang'), timeoutMs: 10_000 });
  while (provider.requestsFor('hang') === 0) await new Promise((r) => setTimeout(r, 10));
  const started = Date.now();
  await provider.stop();
  await provider.stop();
  t.ok(Date.now() - started < 1_000, 'stop did not wait for the hanging request');
  t.match(await pending, { kind: 'unknown', code: 'reset' });
});

t.test('with a journal, applied effects survive a restart; a cut-off last line is dropped', async (t) => {
  const journal = join(mkdtempSync(join(tmpdir(), 'al-journal-')), 'effects.jsonl');
  const agent = await testAgent(t);
  const first = await startProvider(t, { token: TOKEN, journal });
  const receipt = response(t, await postJson(agent, first.endpoint, refund('key-a')));
  t.equal(receipt.status, 201);
  await first.stop();

  // A crash mid-append leaves half a line: that effect's receipt was never sent.
  appendFileSync(journal, '{"key":"key-half","bodySha');
  const second = await startProvider(t, { token: TOKEN, journal });
  t.match(second.allEffects(), [{ key: 'key-a', body: { order_id: 'o-1', amount: 500 } }], 'one effect, reloaded');
  t.equal(second.allEffects()[0]?.at instanceof Date, true);
  const replay = response(t, await postJson(agent, second.endpoint, refund('key-a')));
  t.same(replay.json, receipt.json, 'a replay after the restart answers with the same receipt');
  t.equal(replay.headers['idempotent-replayed'], 'true');
  t.equal(second.effectsFor('key-a'), 1, 'and applies nothing new');
  t.match(response(t, await getJson(agent, second.readbackUrl('key-a'), opts())), {
    status: 200,
    json: { operation_id: receipt.json?.operation_id },
  });
  t.equal(response(t, await postJson(agent, second.endpoint, refund('key-b'))).status, 201);
  await second.stop();

  const lines = readFileSync(journal, 'utf8').split('\n');
  t.equal(lines.length, 3, 'two whole lines and the final newline: the half line was cut away');
  const third = await startProvider(t, { token: TOKEN, journal });
  t.same(
    third.allEffects().map((e) => e.key),
    ['key-a', 'key-b'],
  );

  await third.stop();

  // A whole effect that lost only its newline is kept (its receipt may have gone out), and the newline added.
  const [a = '', b = ''] = readFileSync(journal, 'utf8').split('\n');
  writeFileSync(journal, `${a}\n${b}`);
  const fourth = await startProvider(t, { token: TOKEN, journal });
  t.same(
    fourth.allEffects().map((e) => e.key),
    ['key-a', 'key-b'],
  );
  await fourth.stop();
  t.equal(readFileSync(journal, 'utf8'), `${a}\n${b}\n`);

  const pki = await testPki();
  const load = () => new SandboxProvider({ tls: { ...pki.server, ca: pki.ca.cert }, journal });
  writeFileSync(journal, `${a}\n${b.replace(/"at":"[^"]+"/, '"at":"yesterday"')}\n`);
  t.throws(load, { message: /effects\.jsonl:2: not a provider effect/ }, 'a date that is not one');
  writeFileSync(journal, `${a}\n{"key":\n${b}\n`);
  t.throws(load, { message: /effects\.jsonl:2: not a provider effect/ }, 'a broken line in the middle, with its line');
  writeFileSync(journal, '{"not":"an effect"}\n');
  t.throws(load, {
    message: /effects\.jsonl:1: not a provider effect/,
  });
});
