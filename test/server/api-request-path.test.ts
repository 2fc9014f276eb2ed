/**
 * A gate call's path through the API, as it was made cheaper, answers as before: the strict body parse (its
 * JSON.parse path and the momoa path that names a problem), header names checked in any case in one pass, a
 * charset parameter however it is spaced, the context built from the token in its fields' order, and the api
 * audit row written for every refused state-changing request but not for a gate call the gate audited.
 */
import { connect } from 'node:net';
import t from 'tap';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { auditRows } from '../helpers/gate.js';

const TRANSFER = { to_account: 'ACC0000000002', amount: 25 };

/** Writes `bytes` on a new connection and reads until the server closes it: the status and the body's JSON. */
function exchange(base: string, bytes: string): Promise<{ status: number; json: Record<string, unknown> }> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => socket.write(bytes));
    const chunks: Buffer[] = [];
    socket.setTimeout(10_000, () => {
      socket.destroy();
      reject(new Error('no close within 10 s'));
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      const end = text.indexOf('\r\n\r\n');
      let json: Record<string, unknown> = {};
      try {
        json = JSON.parse(text.slice(end + 4)) as Record<string, unknown>;
      } catch {
        // not JSON: the assertions say so
      }
      resolve({ status: Number(text.split(' ')[1]), json });
    });
  });
}

const rawCall = (f: ApiFixture, token: string, body: string, contentType = 'application/json') =>
  f.call('POST', '/v1/calls', { token, raw: body, headers: { 'content-type': contentType } });

/** The api audit rows of the request, waiting up to 5 s for `want` of them (they are written after the answer). */
async function apiRows(f: ApiFixture, requestId: string, want: number): Promise<Record<string, unknown>[]> {
  const where = "action = 'api' AND trace_id = $1";
  let rows = await auditRows(f.pool, where, [requestId]);
  for (const deadline = Date.now() + 5_000; rows.length < want && Date.now() < deadline;) {
    await new Promise((r) => setTimeout(r, 20));
    rows = await auditRows(f.pool, where, [requestId]);
  }
  return rows;
}

t.test('the body: strict JSON over HTTP, the problem named with its path', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const identity = '"task_id":"task-1","workflow_step_id":"s-1"';
  const refused: [string, string, string][] = [
    [
      'a duplicate key in the arguments',
      `{"tool":"transfer_funds","arguments":{"amount":1,"amount":2},${identity}}`,
      '$.arguments.amount',
    ],
    ['a duplicate key at the root', `{"tool":"transfer_funds","tool":"x","arguments":{},${identity}}`, '$.tool'],
    [
      '__proto__',
      `{"tool":"transfer_funds","arguments":{"__proto__":{"amount":1}},${identity}}`,
      '$.arguments.__proto__',
    ],
    [
      'an integer beyond 2^53 - 1',
      `{"tool":"transfer_funds","arguments":{"amount":9007199254740993},${identity}}`,
      '$.arguments.amount',
    ],
    [
      'a lone surrogate',
      `{"tool":"transfer_funds","arguments":{"to_account":"\\ud800"},${identity}}`,
      '$.arguments.to_account',
    ],
    ['a NUL', `{"tool":"transfer_funds","arguments":{"to_account":"a\\u0000"},${identity}}`, '$.arguments.to_account'],
  ];
  for (const [label, body, path] of refused) {
    const r = await rawCall(f, agent, body);
    t.match(r, { status: 400, body: { ok: false, error: 'invalid_json', details: { path } } }, label);
  }
  const malformed = await rawCall(f, agent, `{"tool":"transfer_funds",${identity},}`);
  t.match(malformed, { status: 400, body: { error: 'invalid_json', message: /^malformed JSON: / } }, 'malformed');
  t.equal(f.undeclared.length, 0, 'every refusal is declared');

  // Taken: the arguments the gate reserved are exactly those sent, number spelling and key order aside.
  const ok = await rawCall(
    f,
    agent,
    ` {"tool":"transfer_funds","arguments":{"amount":25.0,"to_account":"ACC0000000002"},${identity}} `,
  );
  t.match(ok, { status: 200, body: { ok: true, status: 'reserved' } });
  const stored = await f.pool.query<{ arguments_json: unknown }>('SELECT arguments_json FROM actionledger.operations');
  t.same(stored.rows, [{ arguments_json: TRANSFER }]);
});

t.test('headers: repeated names in any case, a charset however spaced', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const cases: [string, string][] = [
    ['Host twice, in two cases', 'GET /v1/status HTTP/1.1\r\nhost: a\r\nHOST: b\r\nConnection: close\r\n\r\n'],
    [
      'Content-Type twice, in two cases',
      'POST /v1/calls HTTP/1.1\r\nHost: a\r\ncontent-type: application/json\r\nCONTENT-TYPE: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}',
    ],
  ];
  for (const [label, bytes] of cases)
    t.match(
      await exchange(f.base, bytes),
      { status: 400, json: { error: 'invalid_request', details: { problem: 'malformed_headers' } } },
      label,
    );
  const once = await exchange(
    f.base,
    `GET /v1/status HTTP/1.1\r\nHOST: a\r\nAuthorization: Bearer ${agent}\r\nConnection: close\r\n\r\n`,
  );
  t.match(once, { status: 200, json: { ok: true, principal_id: 'agent-1' } }, 'one Host, upper case');

  const body = JSON.stringify({
    tool: 'transfer_funds',
    arguments: TRANSFER,
    task_id: 'task-2',
    workflow_step_id: 's',
  });
  for (const type of ['application/json;charset=latin1', 'application/json ;charset="utf-16"'])
    t.match(await rawCall(f, agent, body, type), { status: 415, body: { error: 'unsupported_media_type' } }, type);
  for (const type of ['application/json', 'APPLICATION/JSON', 'application/json;charset=UTF-8'])
    t.match(await rawCall(f, agent, body, type), { status: 200, body: { ok: true } }, type);
});

t.test(
  'the context: the token’s, in its fields’ order; the api audit row only where the gate wrote none',
  async (t) => {
    const f = await apiFixture(t);
    const agent = await f.token('agent-1', ['agent']);
    const r = await f.call('POST', '/v1/calls', {
      token: agent,
      body: {
        tool: 'transfer_funds',
        arguments: TRANSFER,
        task_id: 'task-1',
        workflow_step_id: 's-1',
        plan_version: 'p1',
      },
    });
    t.equal(r.status, 200);
    const requestId = r.headers.get('x-request-id') ?? '';
    const [call] = await auditRows(f.pool, "action = 'call' AND trace_id = $1", [requestId]);
    t.match(call, {
      tenant_id: 'tenant-a',
      principal_id: 'agent-1',
      role: 'agent',
      account_id: 'agent-1',
      conversation_id: 'task-1',
      turn_id: requestId,
    });

    // A refused call (no such role) is audited by the api row; the gate's 200 above is not audited twice.
    const refused = await f.call('POST', '/v1/calls', {
      token: agent,
      body: { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-1', workflow_step_id: 's-2', role: 'nope' },
    });
    t.equal(refused.status, 403);
    const refusedRows = await apiRows(f, refused.headers.get('x-request-id') ?? '', 1);
    t.match(refusedRows, [{ outcome: '403', principal_id: 'agent-1', detail: { method: 'POST', route: '/v1/calls' } }]);
    t.same(await apiRows(f, requestId, 0), [], 'no api row for the gate call the gate audited');
    const read = await f.call('GET', '/v1/status', { token: agent });
    t.equal(read.status, 200);
    await new Promise((r) => setTimeout(r, 100));
    t.same(await apiRows(f, read.headers.get('x-request-id') ?? '', 0), [], 'no api row for a read');
  },
);
