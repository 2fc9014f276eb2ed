/**
 * Malformed requests over a real socket to the API's real listener (and a real PostgreSQL): every answer is the
 * one error body with an `x-request-id`, including those Node's HTTP parser refuses before fastify sees the
 * request; JSON nested 100,000 deep is refused by its depth limit, not by a stack overflow; bodies are UTF-8
 * only; a repeated Authorization header authenticates nobody. The bytes are written by hand (node:net), since
 * an HTTP client would not send most of them.
 */
import { connect } from 'node:net';
import t, { type Test } from 'tap';
import { parseForm } from '../../server/console/form.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';

interface RawAnswer {
  status: number;
  headers: Map<string, string[]>;
  body: string;
  json: Record<string, unknown>;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Writes `bytes` on a new connection and reads until the server closes it (or 10 s pass). */
function exchange(base: string, bytes: string | Buffer): Promise<string> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => socket.write(bytes));
    const chunks: Buffer[] = [];
    socket.setTimeout(10_000, () => {
      socket.destroy();
      reject(new Error(`no close within 10 s; got ${Buffer.concat(chunks).toString('latin1').slice(0, 300)}`));
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => undefined); // a reset after the answer: what was read stands
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
  });
}

/** The first answer in `text` (status line, headers, a Content-Length body). */
function parseAnswer(text: string): RawAnswer {
  const end = text.indexOf('\r\n\r\n');
  const [statusLine = '', ...lines] = text.slice(0, end === -1 ? text.length : end).split('\r\n');
  const headers = new Map<string, string[]>();
  for (const line of lines) {
    const i = line.indexOf(':');
    const name = line.slice(0, i).trim().toLowerCase();
    headers.set(name, [...(headers.get(name) ?? []), line.slice(i + 1).trim()]);
  }
  const length = Number(headers.get('content-length')?.[0] ?? NaN);
  const rest = end === -1 ? '' : text.slice(end + 4);
  const body = Number.isNaN(length) ? rest : rest.slice(0, length);
  let json: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(body) as unknown;
    if (parsed !== null && typeof parsed === 'object') json = parsed as Record<string, unknown>;
  } catch {
    // not JSON: the assertions say so
  }
  return { status: Number(statusLine.split(' ')[1]), headers, body, json };
}

async function raw(f: ApiFixture, bytes: string | Buffer): Promise<RawAnswer> {
  return parseAnswer(await exchange(f.base, bytes));
}

/** The documented shape: the one error body with a code and a message, a request id, nothing of the framework's. */
function documented(t: Test, r: RawAnswer, status: number, code: string, label: string): void {
  t.equal(r.status, status, `${label}: status`);
  t.match(r.json, { ok: false, error: code, message: String }, `${label}: the error body (${r.body.slice(0, 200)})`);
  t.notOk('statusCode' in r.json || 'code' in r.json, `${label}: no framework fields`);
  t.match(r.headers.get('x-request-id')?.[0] ?? '', UUID, `${label}: a request id`);
  t.match(r.headers.get('content-type')?.[0] ?? '', /^application\/json/, `${label}: JSON`);
}

t.test('requests Node’s parser refuses get the documented body, a request id, and a closed connection', async (t) => {
  const f = await apiFixture(t);
  const post = (headers: string, body: string) =>
    `POST /v1/calls HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n${headers}\r\n${body}`;
  const cases: [string, string, number, string][] = [
    ['duplicate Content-Length', post('Content-Length: 2\r\nContent-Length: 2\r\n', '{}'), 400, 'HPE_'],
    ['conflicting Content-Length', post('Content-Length: 2\r\nContent-Length: 3\r\n', '{} '), 400, 'HPE_'],
    [
      'Content-Length and Transfer-Encoding',
      post('Content-Length: 2\r\nTransfer-Encoding: chunked\r\n', '2\r\n{}\r\n0\r\n\r\n'),
      400,
      'HPE_',
    ],
    ['Transfer-Encoding gzip', post('Transfer-Encoding: gzip\r\n', '{}'), 400, 'HPE_'],
    [
      'Transfer-Encoding chunked, identity',
      post('Transfer-Encoding: chunked, identity\r\n', '2\r\n{}\r\n0\r\n\r\n'),
      400,
      'HPE_',
    ],
    [
      'Transfer-Encoding twice',
      post('Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n', '2\r\n{}\r\n0\r\n\r\n'),
      400,
      'HPE_',
    ],
    ['a malformed chunk', post('Transfer-Encoding: chunked\r\n', 'zz\r\n{}\r\n0\r\n\r\n'), 400, 'HPE_'],
    ['not HTTP', 'HELLO\r\n\r\n', 400, 'HPE_'],
    [
      'headers over the limit',
      `GET /v1/operations HTTP/1.1\r\nHost: a\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
      431,
      'HPE_',
    ],
    ['no Host', 'GET /v1/operations HTTP/1.1\r\nConnection: close\r\n\r\n', 400, 'malformed_headers'],
    ['no Host in HTTP/1.0', 'GET /v1/operations HTTP/1.0\r\n\r\n', 400, 'malformed_headers'],
    [
      'Host twice',
      'GET /v1/operations HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n',
      400,
      'malformed_headers',
    ],
    [
      'Content-Type twice',
      'POST /v1/calls HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}',
      400,
      'malformed_headers',
    ],
  ];
  for (const [label, bytes, status, problem] of cases) {
    const r = await raw(f, bytes);
    documented(t, r, status, 'invalid_request', label);
    t.match(String((r.json.details as Record<string, unknown> | undefined)?.problem), problem, `${label}: the problem`);
    t.same(r.headers.get('connection'), ['close'], `${label}: the connection is closed`);
  }
  // The router's own refusal (a path it cannot decode) was already in the shape; it stays so.
  documented(
    t,
    await raw(f, 'GET /v1/operations/%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'),
    400,
    'invalid_request',
    'bad path',
  );
  // A well-formed request on the same listener is still answered normally, in HTTP/1.0 with a Host too.
  const ok = await raw(f, 'GET /v1/openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n');
  t.equal(ok.status, 200, 'a well-formed request still works');
  t.equal((await raw(f, 'GET /v1/openapi.json HTTP/1.0\r\nHost: a\r\n\r\n')).status, 200, 'HTTP/1.0 with Host');
});

t.test('an Expect other than 100-continue: 417 expectation_failed in the documented shape', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  for (const expect of ['foo', '200-ok']) {
    const r = await raw(
      f,
      `GET /v1/status HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${token}\r\nExpect: ${expect}\r\n\r\n`,
    );
    documented(t, r, 417, 'expectation_failed', `Expect: ${expect}`);
    t.match(r.json.details, { field: 'expect' });
    t.same(r.headers.get('connection'), ['close'], 'the connection is closed');
  }
  // 100-continue is met: the interim answer, then the request's own.
  const body = '{}';
  const text = await exchange(
    f.base,
    `POST /v1/calls HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n${body}`,
  );
  t.match(text, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 422 /, '100 Continue, then the answer');
});

t.test('JSON nested 100,000 deep is refused by the depth limit, before any parser recurses', async (t) => {
  const f = await apiFixture(t, { api: { max_body_bytes: 1024 * 1024 } });
  const token = await f.token('agent-1', ['agent']);
  const headers = { 'content-type': 'application/json' };
  const n = 100_000;
  for (const [label, text] of [
    ['arrays', '['.repeat(n) + ']'.repeat(n)],
    ['objects', '{"a":'.repeat(n) + '1' + '}'.repeat(n)],
    ['arrays inside a call', `{"tool":"send_email","arguments":${'['.repeat(n)}${']'.repeat(n)}}`],
  ] as const) {
    const r = await f.call('POST', '/v1/calls', { token, headers, raw: text });
    t.match(r, { status: 400, body: { ok: false, error: 'invalid_json', details: { max_depth: 64 } } }, label);
    t.match(r.body.message, /more than 64 deep/, `${label}: the message names the limit`);
    t.notMatch(r.text, /call stack/i, `${label}: not a stack overflow`);
    t.ok(r.headers.get('x-request-id'), `${label}: a request id`);
  }
  const mcp = await f.call('POST', '/mcp', {
    token,
    headers: { ...headers, accept: 'application/json, text/event-stream' },
    raw: '['.repeat(n) + ']'.repeat(n),
  });
  t.match(mcp, { status: 400, body: { error: 'invalid_json', details: { max_depth: 64 } } }, '/mcp: the same limit');
  // 64 deep is within the limit (the route then refuses the body's shape); 65 is not.
  const at = await f.call('POST', '/v1/calls', { token, headers, raw: '['.repeat(64) + ']'.repeat(64) });
  t.not(at.body.error, 'invalid_json', '64 deep: parsed');
  const over = await f.call('POST', '/v1/calls', { token, headers, raw: '['.repeat(65) + ']'.repeat(65) });
  t.match(over, { status: 400, body: { error: 'invalid_json' } }, '65 deep: refused');
  // Brackets inside a string are text, not nesting; an escaped quote does not end the string.
  const subject = `\\"${'[{'.repeat(n / 2)}`;
  const inString = await f.call('POST', '/v1/calls', {
    token,
    headers,
    raw: `{"tool":"send_email","arguments":{"to":"a@example.com","subject":"${subject}","body":"x"},"task_id":"t","workflow_step_id":"s"}`,
  });
  t.not(
    inString.body.error,
    'invalid_json',
    `a deep value inside a string is not nesting: ${inString.text.slice(0, 200)}`,
  );
  t.not(inString.status, 400);
});

t.test('bodies are UTF-8 only: another charset is 415, bytes that are not UTF-8 are refused', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const body = JSON.stringify({ tool: 'send_email', arguments: {}, task_id: 't', workflow_step_id: 's' });
  for (const charset of ['utf-16', 'UTF-16LE', 'latin1', '"iso-8859-1"', 'utf-8; charset=utf-16']) {
    const r = await f.call('POST', '/v1/calls', {
      token,
      headers: { 'content-type': `application/json; charset=${charset}` },
      raw: Buffer.from(body, charset.startsWith('utf-8') ? 'utf8' : 'utf16le'),
    });
    t.match(r, { status: 415, body: { ok: false, error: 'unsupported_media_type' } }, charset);
    t.match(r.body.message, /only UTF-8/, `${charset}: the message says UTF-8 only`);
    t.ok(r.headers.get('x-request-id'), `${charset}: a request id`);
  }
  for (const charset of ['utf-8', 'UTF-8', '"utf-8"', 'Utf-8']) {
    const r = await f.call('POST', '/v1/calls', {
      token,
      headers: { 'content-type': `application/json; charset=${charset}` },
      raw: body,
    });
    t.not(r.status, 415, `charset=${charset} is UTF-8`);
    t.not(r.body.error, 'invalid_json', `charset=${charset}: parsed`);
  }
  const bad = Buffer.concat([Buffer.from('{"tool":"send_email","x":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
  const invalid = await f.call('POST', '/v1/calls', {
    token,
    headers: { 'content-type': 'application/json' },
    raw: bad,
  });
  t.match(invalid, { status: 400, body: { error: 'invalid_json' } }, 'invalid UTF-8 bytes: refused, not replaced');
  t.match(invalid.body.message, /UTF-8/);

  // /mcp is on the same app: the same refusals.
  const mcpHeaders = { accept: 'application/json, text/event-stream' };
  const init = {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
  };
  const utf16 = await f.call('POST', '/mcp', {
    token,
    headers: { ...mcpHeaders, 'content-type': 'application/json; charset=utf-16' },
    raw: Buffer.from(JSON.stringify(init), 'utf16le'),
  });
  t.match(utf16, { status: 415, body: { error: 'unsupported_media_type' } }, '/mcp: UTF-16 refused');
  const mcpBad = await f.call('POST', '/mcp', {
    token,
    headers: { ...mcpHeaders, 'content-type': 'application/json' },
    raw: Buffer.concat([
      Buffer.from(JSON.stringify(init).slice(0, -1) + ',"x":"'),
      Buffer.from([0xc3]),
      Buffer.from('"}'),
    ]),
  });
  t.match(mcpBad, { status: 400, body: { error: 'invalid_json' } }, '/mcp: invalid UTF-8 refused');

  // The console's forms: another charset, or bytes that are not UTF-8, are refused before its parser reads them.
  const form = { 'content-type': 'application/x-www-form-urlencoded; charset=utf-16', origin: f.base };
  const console16 = await f.call('POST', '/console/login', { headers: form, raw: Buffer.from('link=x', 'utf16le') });
  t.equal(console16.status, 415, 'console form: UTF-16 refused');
  const consoleBad = await f.call('POST', '/console/login', {
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin: f.base },
    raw: Buffer.concat([Buffer.from('link='), Buffer.from([0xff]), Buffer.from('x')]),
  });
  t.equal(consoleBad.status, 422, 'console form: invalid UTF-8 refused (invalid_request)');
  t.match(consoleBad.text, /not valid UTF-8/);
  t.ok(consoleBad.headers.get('x-request-id'));
  // The same bytes percent-escaped: refused the same way, not read as U+FFFD.
  const escaped = await f.call('POST', '/console/login', {
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin: f.base },
    raw: Buffer.from('link=%FF%FEok'),
  });
  t.equal(escaped.status, 422, 'console form: a percent-escape that is not UTF-8 refused (invalid_request)');
  t.match(escaped.text, /not valid UTF-8/);
  t.ok(escaped.headers.get('x-request-id'));
});

t.test('console forms are decoded strictly: no byte replaced, no field taken twice', (t) => {
  const refused = (body: string, problem: string) =>
    t.throws(() => parseForm(body), { code: 'invalid_request', details: { problem } }, body);
  refused('csrf=x&reason=%FF%FEok', 'not_utf8');
  refused('reason=%C3', 'not_utf8');
  refused('reason=%ED%A0%80', 'not_utf8'); // an encoded surrogate
  refused('reason%FF=x', 'not_utf8');
  refused('reason=100%', 'malformed_escape');
  refused('reason=%G0', 'malformed_escape');
  t.throws(() => parseForm('a=1&a=2'), { code: 'invalid_request', details: { field: 'a' } }, 'a field sent twice');
  t.same(parseForm('a=b+c%20d&e=%C3%A9%E2%80%AE&&f&g=&h=x=y'), {
    a: 'b c d',
    e: '\u00e9\u202e',
    f: '',
    g: '',
    h: 'x=y',
  });
  t.same(parseForm(''), {});
  t.end();
});

t.test('a repeated Authorization header authenticates nobody, on the API and on /mcp', async (t) => {
  const f = await apiFixture(t);
  const op = await f.token('op-1', ['operator']);
  const agent = await f.token('agent-1', ['agent']);
  const get = (auth: string[]) =>
    `GET /v1/operations HTTP/1.1\r\nHost: a\r\n${auth.map((a) => `Authorization: Bearer ${a}\r\n`).join('')}Connection: close\r\n\r\n`;
  t.equal((await raw(f, get([op]))).status, 200, 'one Authorization: authenticated');
  for (const [label, tokens] of [
    ['the same token twice', [op, op]],
    ['two tokens', [op, agent]],
    ['a bad one first', ['alt_nope', op]],
  ] as const) {
    const r = await raw(f, get([...tokens]));
    documented(t, r, 401, 'unauthenticated', label);
    t.match(r.json.message, /repeated Authorization header/, `${label}: says why`);
    t.match(r.json.details, { reason: 'repeated' });
  }
  const init = JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
  });
  const mcp = await raw(
    f,
    `POST /mcp HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${agent}\r\nAuthorization: Bearer ${agent}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: ${Buffer.byteLength(init)}\r\nConnection: close\r\n\r\n${init}`,
  );
  documented(t, mcp, 401, 'unauthenticated', '/mcp');
  t.match(mcp.json.message, /repeated Authorization header/);
});
