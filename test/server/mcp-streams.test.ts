/**
 * The MCP endpoint's event streams, read by a plain HTTP client (fetch) against the API's real listener and a
 * real PostgreSQL: a `tools/call` answered as an event stream ends once its result is sent, and the session's
 * GET stream of a token that is revoked (as the CLI does, in another process: a row in the database) or that
 * expires is ended within the recheck interval, while another token's stream stays open; a request id still in
 * flight in the session cannot be sent again.
 */
import t, { type Test } from 'tap';
import { STREAM_RECHECK_MS } from '../../server/mcp/http.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { count } from '../helpers/gate.js';
import { meta } from '../helpers/mcp.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };
const VERSION = '2025-06-18';

interface Read {
  text: string;
  ended: boolean;
}

/** Reads a response body until it ends (`ended`), or until `ms` pass (then the read is cancelled). */
async function readUntilEnd(res: Response, ms: number): Promise<Read> {
  const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = res.body?.getReader();
  if (reader === undefined) return { text: '', ended: true };
  const decoder = new TextDecoder();
  let text = '';
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  try {
    for (;;) {
      const next = await Promise.race([reader.read(), timeout]);
      if (next === 'timeout') {
        await reader.cancel().catch(() => undefined);
        return { text, ended: false };
      }
      if (next.done) return { text, ended: true };
      text += decoder.decode(next.value, { stream: true });
    }
  } catch {
    // the server cut the connection: the stream ended too
    return { text, ended: true };
  } finally {
    clearTimeout(timer);
  }
}

/** The JSON of each `data:` line in an event stream's text. */
const dataEvents = (text: string): Record<string, unknown>[] =>
  text
    .split('\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);

/** An initialized MCP session of `token`, by hand: its id. */
async function session(
  t: Test,
  f: ApiFixture,
  token: string,
  capabilities: Record<string, unknown> = {},
): Promise<string> {
  const headers = {
    authorization: `Bearer ${token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
  };
  const init = await fetch(`${f.base}/mcp`, {
    method: 'POST',
    headers,
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: VERSION, capabilities, clientInfo: { name: 'stream-test', version: '1' } },
    }),
  });
  const id = init.headers.get('mcp-session-id') ?? '';
  t.equal(init.status, 200, 'initialized');
  t.ok((await readUntilEnd(init, 5_000)).ended, 'the initialize answer ends');
  const initialized = await fetch(`${f.base}/mcp`, {
    method: 'POST',
    headers: { ...headers, 'mcp-session-id': id, 'mcp-protocol-version': VERSION },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  });
  t.equal(initialized.status, 202);
  await initialized.arrayBuffer();
  return id;
}

function openStream(f: ApiFixture, token: string, id: string, signal?: AbortSignal): Promise<Response> {
  return fetch(`${f.base}/mcp`, {
    method: 'GET',
    headers: {
      authorization: `Bearer ${token}`,
      accept: 'text/event-stream',
      'mcp-session-id': id,
      'mcp-protocol-version': VERSION,
    },
    ...(signal === undefined ? {} : { signal }),
  });
}

t.test('a tools/call answered as an event stream ends once its result is sent', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const id = await session(t, f, token);
  const res = await fetch(`${f.base}/mcp`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': id,
      'mcp-protocol-version': VERSION,
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 7,
      method: 'tools/call',
      params: { name: 'send_email', arguments: EMAIL, _meta: meta('stream-1') },
    }),
  });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /text\/event-stream/, 'answered as an event stream');
  const read = await readUntilEnd(res, 10_000);
  t.ok(read.ended, 'the stream ends by itself');
  const last = dataEvents(read.text).at(-1);
  t.match(last, { jsonrpc: '2.0', id: 7, result: { isError: true } }, 'its last event is the call’s result');
  t.match(JSON.stringify(last), /confirmation_required/);
});

t.test(
  'a tools/call that asks the user first: its stream carries the question, then the result, then ends',
  async (t) => {
    const f = await apiFixture(t);
    const token = await f.token('agent-1', ['agent']);
    const id = await session(t, f, token, { elicitation: { form: {} } });
    const headers = {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': id,
      'mcp-protocol-version': VERSION,
    };
    const res = await fetch(`${f.base}/mcp`, {
      method: 'POST',
      headers,
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 8,
        method: 'tools/call',
        params: { name: 'send_email', arguments: EMAIL, _meta: meta('stream-2') },
      }),
    });
    t.match(res.headers.get('content-type'), /text\/event-stream/);
    const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = res.body?.getReader();
    if (reader === undefined) throw new Error('no body');
    const decoder = new TextDecoder();
    let text = '';
    // Read until the server's question (an elicitation request on this same stream) arrives.
    let question: Record<string, unknown> | undefined;
    while (question === undefined) {
      const next = await reader.read();
      if (next.done) throw new Error(`the stream ended before the question: ${text}`);
      text += decoder.decode(next.value, { stream: true });
      question = dataEvents(text).find((e) => e.method === 'elicitation/create');
    }
    const answered = await fetch(`${f.base}/mcp`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: question.id, result: { action: 'decline' } }),
    });
    t.equal(answered.status, 202, 'the answer is taken');
    await answered.arrayBuffer();
    const rest = await readUntilEnd(
      new Response(
        new ReadableStream({
          pull: async (c) => {
            const next = await reader.read();
            if (next.done) c.close();
            else c.enqueue(next.value);
          },
        }),
      ),
      10_000,
    );
    t.ok(rest.ended, 'the stream ends once the result is sent');
    const last = dataEvents(text + rest.text).at(-1);
    t.match(last, { jsonrpc: '2.0', id: 8, result: { isError: true } }, 'its last event is the call’s result');
    t.match(JSON.stringify(last), /confirmation_declined/);
  },
);

t.test(
  'a request id still in flight in the session is refused; the first call’s stream still ends with its result',
  async (t) => {
    const f = await apiFixture(t);
    const token = await f.token('agent-1', ['agent']);
    const id = await session(t, f, token, { elicitation: { form: {} } });
    const headers = {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': id,
      'mcp-protocol-version': VERSION,
    };
    const rpc = (body: unknown) => fetch(`${f.base}/mcp`, { method: 'POST', headers, body: JSON.stringify(body) });
    const call = { name: 'send_email', arguments: EMAIL, _meta: meta('same-id-1') };
    const first = await rpc({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: call });
    const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = first.body?.getReader();
    if (reader === undefined) throw new Error('no body');
    const decoder = new TextDecoder();
    let text = '';
    let question: Record<string, unknown> | undefined;
    while (question === undefined) {
      const next = await reader.read();
      if (next.done) throw new Error(`the stream ended before the question: ${text}`);
      text += decoder.decode(next.value, { stream: true });
      question = dataEvents(text).find((e) => e.method === 'elicitation/create');
    }
    // While the call waits on the user, id 5 is in flight: another request with it is refused, as is a batch
    // naming one id twice; the same number as a string is another id.
    const again = await rpc({ jsonrpc: '2.0', id: 5, method: 'tools/list' });
    t.equal(again.status, 409);
    t.match(await again.json(), {
      jsonrpc: '2.0',
      id: 5,
      error: {
        code: -32600,
        message: /already in flight/,
        data: { error: 'invalid_request', problem: 'request_id_in_flight' },
      },
    });
    t.ok(again.headers.get('x-request-id'), 'with a request id');
    const twice = await rpc([
      { jsonrpc: '2.0', id: 9, method: 'tools/list' },
      { jsonrpc: '2.0', id: 9, method: 'tools/list' },
    ]);
    t.equal(twice.status, 409, 'one id twice in a batch');
    await twice.arrayBuffer();
    const other = await rpc({ jsonrpc: '2.0', id: '5', method: 'tools/list' });
    t.equal(other.status, 200, '"5" is not 5');
    t.ok((await readUntilEnd(other, 5_000)).ended);

    const answered = await rpc({ jsonrpc: '2.0', id: question.id, result: { action: 'decline' } });
    t.equal(answered.status, 202);
    await answered.arrayBuffer();
    const rest = await readUntilEnd(
      new Response(
        new ReadableStream({
          pull: async (c) => {
            const next = await reader.read();
            if (next.done) c.close();
            else c.enqueue(next.value);
          },
        }),
      ),
      10_000,
    );
    t.ok(rest.ended, 'the first call’s stream ends once its result is sent');
    t.match(dataEvents(text + rest.text).at(-1), { id: 5, result: { isError: true } }, 'its result, to id 5');
    // Answered, id 5 is free again.
    const reused = await rpc({ jsonrpc: '2.0', id: 5, method: 'tools/list' });
    t.equal(reused.status, 200, 'an id whose answer was sent may be used again');
    t.ok((await readUntilEnd(reused, 5_000)).ended);
  },
);

t.test('revoking or expiring a token ends its open MCP event streams; another token’s stays open', async (t) => {
  const f = await apiFixture(t);
  const revoked = await f.token('agent-1', ['agent']);
  const expiring = await f.token('agent-2', ['agent']);
  const kept = await f.token('agent-3', ['agent']);
  const ids = await Promise.all([session(t, f, revoked), session(t, f, expiring), session(t, f, kept)]);
  const keptAbort = new AbortController();
  const [r1, r2, r3] = await Promise.all([
    openStream(f, revoked, ids[0] ?? ''),
    openStream(f, expiring, ids[1] ?? ''),
    openStream(f, kept, ids[2] ?? '', keptAbort.signal),
  ]);
  for (const r of [r1, r2, r3]) t.equal(r.status, 200, 'the GET stream is open');
  const wait = STREAM_RECHECK_MS + 5_000;
  const reads = [readUntilEnd(r1, wait), readUntilEnd(r2, wait)];
  const keptRead = readUntilEnd(r3, 2 * wait);

  const tokenOf = async (principal: string) =>
    (
      await f.pool.query<{ token_id: string }>('SELECT token_id FROM actionledger.api_tokens WHERE principal_id = $1', [
        principal,
      ])
    ).rows[0]?.token_id ?? '';
  const started = Date.now();
  t.ok(await f.store.revokeToken(await tokenOf('agent-1'), 'test'), 'agent-1’s token revoked');
  await f.pool.query(
    `UPDATE actionledger.api_tokens SET created_at = now() - interval '2 days', expires_at = now() - interval '1 second'
     WHERE token_id = $1`,
    [await tokenOf('agent-2')],
  );
  const [a, b] = await Promise.all(reads);
  const took = Date.now() - started;
  t.ok(a?.ended, `the revoked token’s stream ended (${took} ms)`);
  t.ok(b?.ended, 'the expired token’s stream ended');
  t.ok(took <= STREAM_RECHECK_MS + 3_000, `within the recheck interval and a look-up (${took} ms)`);

  const stillOpen = await Promise.race([keptRead.then(() => 'ended'), new Promise((r) => setTimeout(r, 200, 'open'))]);
  t.equal(stillOpen, 'open', 'a token still valid keeps its stream');
  keptAbort.abort();
  await keptRead;

  // What the client's reconnect gets: refused.
  const again = await openStream(f, revoked, ids[0] ?? '');
  t.equal(again.status, 401, 'the revoked token cannot open it again');
  t.match(await again.json(), { ok: false, error: 'unauthenticated' });
});

t.test('a tools/call stream waiting on the user ends when its token is revoked', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const id = await session(t, f, token, { elicitation: { form: {} } });
  const res = await fetch(`${f.base}/mcp`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': id,
      'mcp-protocol-version': VERSION,
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 9,
      method: 'tools/call',
      params: { name: 'send_email', arguments: EMAIL, _meta: meta('stream-3') },
    }),
  });
  t.match(res.headers.get('content-type'), /text\/event-stream/);
  const reading = readUntilEnd(res, STREAM_RECHECK_MS + 5_000);
  const { rows } = await f.pool.query<{ token_id: string }>(
    "SELECT token_id FROM actionledger.api_tokens WHERE principal_id = 'agent-1'",
  );
  // Revoked while the question is open (the user has not answered).
  await new Promise((r) => setTimeout(r, 200));
  t.ok(await f.store.revokeToken(rows[0]?.token_id ?? '', 'test'));
  const read = await reading;
  t.ok(read.ended, 'the stream ended');
  t.match(read.text, /elicitation\/create/, 'it had carried the question');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved');
});
