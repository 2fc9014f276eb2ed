/**
 * The API on every worker, with a real fleet: `actionledger start --workers 2` against the test's database, and
 * every request below on a fresh TCP connection (node:cluster deals connections out to the workers, so fresh
 * connections reach both):
 *
 *   - both workers serve: `actionledger_http_requests_served_total` grows under both worker labels;
 *   - the request window is the fleet's: a principal's limit holds over requests that reach both processes;
 *   - an MCP session opened on one connection keeps working over many more, whichever worker each reaches
 *     (a request for the other worker's session is forwarded to it);
 *   - a worker killed with SIGKILL is replaced, and the API answers meanwhile and after;
 *   - SIGTERM drains: a request in flight when the stop begins (its body still arriving) is answered, then the
 *     service exits 0.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDispatchKit } from '../../sandbox/kit.js';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { PROVIDER_TOKEN, spawnService } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';

const LIMIT = 30;

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** One request on a connection of its own (closed after it); status 0 when the connection failed. */
function once(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string,
): Promise<Answer> {
  return new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
      res.on('error', () => resolve({ status: 0, headers: {}, body: text }));
    });
    req.on('error', () => resolve({ status: 0, headers: {}, body: '' }));
    req.end(body);
  });
}

/** The served counter of each worker slot in a scrape. */
function served(metrics: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of metrics.matchAll(/^actionledger_http_requests_served_total\{[^}]*worker="(\d+)"[^}]*\} (\d+)$/gm))
    out.set(m[1] ?? '', Number(m[2]));
  return out;
}

/** The JSON-RPC message of an MCP answer: the body itself, or the event stream's `data:` line naming `id`. */
function rpc(answer: Answer, id: number): Record<string, unknown> | undefined {
  if (!(answer.headers['content-type'] ?? '').startsWith('text/event-stream'))
    return JSON.parse(answer.body) as Record<string, unknown>;
  for (const line of answer.body.split('\n'))
    if (line.startsWith('data: ')) {
      const m = JSON.parse(line.slice(6)) as Record<string, unknown>;
      if (m.id === id) return m;
    }
  return undefined;
}

t.test('start --workers 2: every worker serves the API, MCP and the probes', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-fleet-http-'));
  chmodSync(dir, 0o711);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const kit = await startDispatchKit({ dir, token: PROVIDER_TOKEN, profile: { profile_id: 'test' } });
  t.teardown(() => kit.stop());
  const url = await createTestDatabase(t);
  const port = await freePort();
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({
      http: { host: '127.0.0.1', port },
      // A day's window: the test never straddles two windows unless it runs across midnight UTC (checked below).
      api: { rate_limit: { requests: LIMIT, window_s: 86_400 } },
      dispatcher: { ...kit.dispatcherConfig, poll_interval_ms: 200, heartbeat_interval_ms: 500 },
      tools: {
        issue_refund: {
          provider_id: 'billing-test',
          endpoint: kit.provider.endpoint,
          allowed_tenants: ['tenant-a'],
          credential_env: 'TEST_BILLING_TOKEN',
          idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
          readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
        },
      },
    }),
  );
  const env = {
    ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    DATABASE_URL: url,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: PROVIDER_TOKEN,
    LOG_LEVEL: 'info',
  };
  const service = spawnService(BIN, ['--workers', '2'], env);
  t.teardown(() => service.killGroup());
  await service.waitFor(/actionledger listening/);
  const running = () => (service.stdout().match(/dispatcher running/g) ?? []).length;

  const tokens: Record<string, string> = {};
  for (const who of ['spread', 'limited', 'mcp', 'crash']) {
    for (const args of [
      ['principal', 'add', who, '--kind', 'service'],
      ['principal', 'grant', who, '--tenant', 'tenant-a', '--role', 'agent'],
    ]) {
      const r = await runCli([...args, '--break-glass', 'admin'], env);
      t.equal(r.code, 0, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
    }
    const r = await runCli(['token', 'create', who, '--tenant', 'tenant-a', '--json', '--break-glass', 'admin'], env);
    tokens[who] = String(lastJson(r.stdout).token);
  }
  const auth = (who: string) => ({ authorization: `Bearer ${tokens[who] ?? ''}` });
  const scrape = async () => served((await once(port, 'GET', '/metrics')).body);

  await t.test('requests over fresh connections are served by both workers', async (t) => {
    const before = await scrape();
    const answers = [];
    for (let i = 0; i < 20; i++) answers.push(await once(port, 'GET', '/v1/status', auth('spread')));
    t.same(
      answers.filter((a) => a.status !== 200),
      [],
      'every request answered 200',
    );
    const after = await scrape();
    for (const slot of ['1', '2'])
      t.ok((after.get(slot) ?? 0) > (before.get(slot) ?? 0), `worker ${slot} served some of them`);
    for (const probe of ['/healthz', '/readyz'])
      t.same(
        (await Promise.all([0, 1, 2, 3].map(() => once(port, 'GET', probe)))).map((a) => a.status),
        [200, 200, 200, 200],
        `${probe} answers 200 on every worker`,
      );
  });

  await t.test("a principal's request window holds across the workers", async (t) => {
    const untilMidnight = 86_400_000 - (Date.now() % 86_400_000);
    if (untilMidnight < 120_000) await new Promise((r) => setTimeout(r, untilMidnight + 1000));
    const before = await scrape();
    const statuses: number[] = [];
    for (let i = 0; i < LIMIT + 10; i++) statuses.push((await once(port, 'GET', '/v1/status', auth('limited'))).status);
    const after = await scrape();
    for (const slot of ['1', '2'])
      t.ok((after.get(slot) ?? 0) > (before.get(slot) ?? 0), `worker ${slot} took some of them`);
    t.equal(statuses.filter((s) => s === 200).length, LIMIT, `exactly ${LIMIT} answered`);
    t.equal(statuses.filter((s) => s === 429).length, 10, 'the rest refused rate_limited');
    t.same(statuses.slice(LIMIT), Array<number>(10).fill(429), 'every one past the limit, whichever worker');
  });

  await t.test('an MCP session works over many fresh connections, whichever worker each reaches', async (t) => {
    const headers = (session?: string, json = true) => ({
      ...auth('mcp'),
      ...(json ? { 'content-type': 'application/json' } : {}),
      accept: 'application/json, text/event-stream',
      ...(session === undefined ? {} : { 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }),
    });
    const init = await once(
      port,
      'POST',
      '/mcp',
      headers(),
      JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'fleet-test', version: '1' } },
      }),
    );
    t.equal(init.status, 200, init.body);
    const session = init.headers['mcp-session-id'];
    t.match(session, /^w[12]\.[0-9a-f-]{36}$/, 'the session id names the worker that owns it');
    if (typeof session !== 'string') return;
    const initialized = await once(
      port,
      'POST',
      '/mcp',
      headers(session),
      JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
    );
    t.equal(initialized.status, 202, initialized.body);
    const before = await scrape();
    for (let id = 2; id < 10; id++) {
      const message =
        id % 2 === 0
          ? { jsonrpc: '2.0', id, method: 'tools/list' }
          : {
              jsonrpc: '2.0',
              id,
              method: 'tools/call',
              params: { name: 'actionledger_operation', arguments: { operation_id: crypto.randomUUID() } },
            };
      const a = await once(port, 'POST', '/mcp', headers(session), JSON.stringify(message));
      t.equal(a.status, 200, `request ${id}: ${a.body}`);
      const answer = rpc(a, id);
      if (id % 2 === 0) t.match(answer, { result: { tools: Array } }, `request ${id}: the tools, in the session`);
      else t.match(answer, { result: { isError: true } }, `request ${id}: the tool answered (not found)`);
    }
    const after = await scrape();
    for (const slot of ['1', '2'])
      t.ok((after.get(slot) ?? 0) > (before.get(slot) ?? 0), `worker ${slot} took some of the session's requests`);
    const ended = await once(port, 'DELETE', '/mcp', headers(session, false));
    t.equal(ended.status, 200, 'ended, from whichever worker');
    const gone = await once(
      port,
      'POST',
      '/mcp',
      headers(session),
      JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'tools/list' }),
    );
    t.equal(gone.status, 404, 'then gone');
  });

  await t.test('a worker killed with SIGKILL is replaced; the API answers meanwhile and after', async (t) => {
    const pids = service
      .lines()
      .filter((l) => l.msg === 'dispatcher running')
      .map((l) => Number(l.pid));
    t.equal(pids.length, 2, 'two workers run');
    process.kill(pids[0] ?? 0, 'SIGKILL');
    await service.waitFor(/dispatcher worker exited; starting another/);
    const meanwhile = [];
    for (let i = 0; i < 10; i++) meanwhile.push((await once(port, 'GET', '/v1/status', auth('crash'))).status);
    t.same(meanwhile, Array<number>(10).fill(200), 'the other worker answers every request');
    const deadline = Date.now() + 60_000;
    while (running() < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    t.equal(running(), 3, 'a replacement started');
    // Until the replacement has served some of them: fresh connections reach it too.
    let both = false;
    while (!both && Date.now() < deadline) {
      const before = await scrape();
      for (let i = 0; i < 4; i++) t.equal((await once(port, 'GET', '/healthz')).status, 200);
      const after = await scrape();
      both = ['1', '2'].every((slot) => (after.get(slot) ?? 0) > (before.get(slot) ?? 0));
    }
    t.ok(both, 'both slots serve again');
  });

  await t.test('SIGTERM: a request in flight when the stop begins is answered, then exit 0', async (t) => {
    const body = JSON.stringify({ tool: 'no_such_tool', arguments: {}, task_id: 'drain-1', workflow_step_id: '1' });
    const socket = connect(port, '127.0.0.1');
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    let answer = '';
    socket.on('data', (c: Buffer) => (answer += c.toString()));
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    // The head and half the body: the request is in flight at a worker, waiting for the rest.
    socket.write(
      `POST /v1/calls HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${tokens.crash ?? ''}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body.slice(0, 10)}`,
    );
    await new Promise((r) => setTimeout(r, 200));
    process.kill(service.pid, 'SIGTERM');
    await service.waitFor(/"http_in_flight":1[^\n]*dispatcher stopping|dispatcher stopping[^\n]*"http_in_flight":1/);
    // The rest, without closing our side: a half-closed connection aborts the request it carries.
    socket.write(body.slice(10));
    await closed;
    t.match(answer, /^HTTP\/1\.1 200 /, 'answered 200');
    t.match(answer, /connection: close/i, 'and told to close the connection');
    t.match(answer, /"error":"unknown_tool"/, "the gate's answer");
    t.match(await service.exited, { code: 0 }, 'then the service exited 0');
  });
});
