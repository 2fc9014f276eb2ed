/**
 * One trace from the agent's call to the provider's request, with a real fleet: `actionledger start --workers 2`
 * on the shipped configuration (its sandbox on: the built-in authorization service and the sandbox provider run
 * in the fleet's parent process), exporting OTLP/HTTP to a receiver this test runs.
 *
 *   - a gate call over HTTP carrying a sampled `traceparent`: its trace holds the API's server span (a child of
 *     the caller's span), the gate's decision, the reservation, the dispatcher's process span (child of the
 *     reservation and linked to it) with the claim, the authorization request and the provider request as its
 *     children, and the authorization service's and the provider's server spans, children of those requests
 *     (so both received the `traceparent`), from at least two processes;
 *   - `actionledger show` prints the operation's trace id;
 *   - a call whose `traceparent` says not sampled (flags 00) under the default parentbased sampler leaves no span,
 *     in its trace or any other;
 *   - no span carries the caller's `tracestate` (dropped at the API), an effect key, or the arguments;
 *   - `/metrics` shows the same series in OpenMetrics as in the text format, counters with one `_total`.
 */
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { spawnService } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';
import { OtlpReceiver, type ReceivedSpan } from '../helpers/otlp.js';

const ROOT = join(import.meta.dirname, '..', '..', '..');

function call(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: string,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function until<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const hex = (bytes: number) => randomBytes(bytes).toString('hex');

t.test('start --workers 2 with OTLP export: one trace from the call to the provider', async (t) => {
  const receiver = new OtlpReceiver();
  const otlpPort = await receiver.start();
  t.teardown(() => receiver.stop());
  const dir = mkdtempSync(join(tmpdir(), 'al-tracing-'));
  chmodSync(dir, 0o711);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const [http, provider, authorizer] = [await freePort(), await freePort(), await freePort()];
  const cfg = JSON.parse(readFileSync(join(ROOT, 'actionledger.config.json'), 'utf8')) as Record<
    string,
    Record<string, unknown>
  >;
  cfg.http = { ...cfg.http, port: http };
  cfg.sandbox = { ...cfg.sandbox, provider_port: provider, authorizer_port: authorizer };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  const env = {
    HOME: process.env.HOME,
    ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    DATABASE_URL: await createTestDatabase(t),
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
  };
  const traced = {
    ...env,
    OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${otlpPort}`,
    OTEL_SERVICE_NAME: 'actionledger-under-test',
    OTEL_BSP_SCHEDULE_DELAY: '100',
  };
  const service = spawnService(BIN, ['--workers', '2'], traced);
  t.teardown(() => service.killGroup());
  await service.waitFor(/dispatcher running[\s\S]*dispatcher running/);

  // The principal and its token, by commands run without the OTLP variables (they export nothing).
  for (const args of [
    ['principal', 'add', 'agent-7', '--kind', 'service'],
    ['principal', 'grant', 'agent-7', '--tenant', 'tenant-a', '--role', 'agent'],
  ]) {
    const r = await runCli([...args, '--break-glass', 'admin'], env);
    t.equal(r.code, 0, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
  }
  const created = await runCli(
    ['token', 'create', 'agent-7', '--tenant', 'tenant-a', '--json', '--break-glass', 'admin'],
    env,
  );
  const token = String(lastJson(created.stdout).token);
  const auth = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };

  const effectKeys: string[] = [];
  const refund = async (step: string, traceparent: string): Promise<string> => {
    const r = await call(
      http,
      'POST',
      '/v1/calls',
      { ...auth, traceparent, tracestate: 'vendor=opaque' },
      JSON.stringify({
        tool: 'issue_refund',
        arguments: { order_id: `o-${step}`, amount: 1250, currency: 'EUR' },
        task_id: 'refund-trace',
        workflow_step_id: step,
      }),
    );
    t.equal(r.status, 200, r.body);
    const answer = JSON.parse(r.body) as { ok: boolean; operation_id: string; effect_key: string };
    t.equal(answer.ok, true, r.body);
    effectKeys.push(answer.effect_key);
    await until(`operation ${answer.operation_id} succeeded`, async () => {
      const s = await call(http, 'GET', `/v1/operations/${answer.operation_id}`, auth);
      return (JSON.parse(s.body) as { operation?: { status?: string } }).operation?.status === 'succeeded'
        ? true
        : undefined;
    });
    return answer.operation_id;
  };

  const traceId = hex(16);
  const callerSpan = hex(8);
  const operationId = await refund('1', `00-${traceId}-${callerSpan}-01`);

  const one = (spans: ReceivedSpan[], name: string): ReceivedSpan | undefined => spans.find((s) => s.name === name);
  const wanted = [
    'POST /v1/calls',
    'gate issue_refund',
    'reserve',
    'process outbox',
    'receive outbox',
    'POST authorize',
    'POST provider',
    'POST AuthorizationService',
    'POST SandboxProvider',
  ];
  const spans = await until('the whole trace', () => {
    const s = receiver.trace(traceId);
    return wanted.every((n) => one(s, n) !== undefined) ? s : undefined;
  });
  const byName = Object.fromEntries(wanted.map((n) => [n, one(spans, n) as ReceivedSpan]));
  const api = byName['POST /v1/calls'] as ReceivedSpan;
  const gate = byName['gate issue_refund'] as ReceivedSpan;
  const reserve = byName.reserve as ReceivedSpan;
  const processSpan = byName['process outbox'] as ReceivedSpan;
  const claim = byName['receive outbox'] as ReceivedSpan;
  const authorize = byName['POST authorize'] as ReceivedSpan;
  const providerCall = byName['POST provider'] as ReceivedSpan;
  const authorizeServer = byName['POST AuthorizationService'] as ReceivedSpan;
  const providerServer = byName['POST SandboxProvider'] as ReceivedSpan;

  t.equal(api.parentSpanId, callerSpan, "the API's span continues the caller's traceparent");
  t.match(api.attributes, {
    'http.request.method': 'POST',
    'http.route': '/v1/calls',
    'http.response.status_code': 200,
  });
  t.equal(gate.parentSpanId, api.spanId, "the gate's decision is the API span's child");
  t.match(gate.attributes, { 'actionledger.decision': 'allowed', 'actionledger.operation_id': operationId });
  t.equal(reserve.parentSpanId, gate.spanId, 'the reservation is the decision’s child');
  t.match(reserve.attributes, { 'db.system.name': 'postgresql', 'actionledger.operation_id': operationId });
  t.equal(processSpan.parentSpanId, reserve.spanId, 'the dispatch continues the stored context');
  t.same(processSpan.links, [{ traceId, spanId: reserve.spanId }], '… and links to it');
  t.match(processSpan.attributes, { 'messaging.operation.type': 'process', 'messaging.message.id': operationId });
  t.equal(claim.parentSpanId, processSpan.spanId, 'the claim is the dispatch’s child');
  t.equal(authorize.parentSpanId, processSpan.spanId, 'the authorization request is the dispatch’s child');
  t.equal(providerCall.parentSpanId, processSpan.spanId, 'the provider request is the dispatch’s child');
  t.match(providerCall.attributes, { 'http.request.method': 'POST', 'http.response.status_code': 201 });
  t.equal(authorizeServer.parentSpanId, authorize.spanId, 'the authorization service received the traceparent');
  t.equal(providerServer.parentSpanId, providerCall.spanId, 'the provider received the traceparent');

  const instances = new Set(spans.map((s) => s.resource['service.instance.id']));
  const pids = new Set(spans.map((s) => s.resource['process.pid']));
  t.ok(instances.size >= 2 && pids.size >= 2, `spans from ${instances.size} processes`);
  t.not(api.resource['service.instance.id'], authorizeServer.resource['service.instance.id'], 'another process');
  t.equal(api.resource['service.name'], 'actionledger-under-test', 'OTEL_SERVICE_NAME names the service');
  for (const s of spans)
    t.notMatch(JSON.stringify(s.attributes), /o-1|1250|Bearer|provider-token|Idempotency/i, `${s.name}: no arguments`);
  t.same(
    receiver.requests.filter((r) => !r.decoded || r.path !== '/v1/traces'),
    [],
    'every export was OTLP JSON on /v1/traces',
  );

  const shown = await runCli(['show', operationId, '--json'], env);
  t.equal((lastJson(shown.stdout).operation as Record<string, unknown>).trace_id, traceId, 'show: the trace id');
  const shownText = await runCli(['show', operationId], env);
  t.match(shownText.stdout, new RegExp(`trace_id\\s+"?${traceId}`), 'show prints it');

  // Not sampled by the caller: the parentbased sampler records nothing of it, in any process. A sampled call
  // made after it, once its spans have all arrived, shows that the exports after the unsampled one came in.
  const quiet = hex(16);
  const quietOp = await refund('2', `00-${quiet}-${hex(8)}-00`);
  const after = hex(16);
  await refund('3', `00-${after}-${hex(8)}-01`);
  await until('the later trace', () =>
    ['POST SandboxProvider', 'process outbox', 'POST /v1/calls'].every((n) => one(receiver.trace(after), n))
      ? true
      : undefined,
  );
  t.same(receiver.trace(quiet), [], 'a call sampled out leaves no span');
  t.same(
    receiver.spans.filter(
      (s) => s.attributes['messaging.message.id'] === quietOp || s.attributes['actionledger.operation_id'] === quietOp,
    ),
    [],
    '… in any trace: its dispatch started no trace of its own',
  );
  // What the spans say, names and links included: never an effect key (a readback URL holds one in its path),
  // never the caller's tracestate (dropped at the API, so neither stored nor sent to the provider).
  const exported = JSON.stringify(
    receiver.spans.map((s) => ({ name: s.name, attributes: s.attributes, links: s.links, traceState: s.traceState })),
  );
  t.equal(effectKeys.length, 3);
  for (const key of effectKeys) {
    t.notOk(exported.includes(key), 'no span carries an effect key');
    t.notOk(exported.includes(encodeURIComponent(key)), '… nor its URL-encoded form');
  }
  t.notOk(exported.includes('vendor=opaque'), 'no span carries the caller’s tracestate');
  const quietShown = await runCli(['show', quietOp, '--json'], env);
  t.equal(
    (lastJson(quietShown.stdout).operation as Record<string, unknown>).trace_id,
    quiet,
    'its context is still stored (the dispatcher follows the caller’s decision)',
  );

  // Exemplars: the dispatch latency histograms name sampled traces, in the OpenMetrics exposition only.
  const open = await call(http, 'GET', '/metrics', { accept: 'application/openmetrics-text; version=1.0.0' });
  t.match(open.body, /# EOF\n$/, 'OpenMetrics when asked for');
  t.notMatch(open.body, /_total_total/, 'no counter renamed');
  t.match(open.body, /^actionledger_dispatch_outcomes_total\{[^}]*\} \d/m, 'counters keep their one _total');
  const exemplars = [
    ...open.body.matchAll(
      /^actionledger_dispatch_enqueue_to_outcome_seconds_bucket\{[^}]*\} \d+ # \{trace_id="([0-9a-f]{32})"\}/gm,
    ),
  ].map((m) => m[1]);
  t.ok(exemplars.length > 0, 'the enqueue-to-outcome buckets carry exemplars');
  t.ok(
    exemplars.every((id) => id === traceId || id === after),
    'each the trace id of a sampled call, never the unsampled one',
  );
  t.match(open.body, /^actionledger_provider_request_duration_seconds_bucket\{[^}]*\} \d+ # \{trace_id="/m);
  const text = await call(http, 'GET', '/metrics', {});
  t.notMatch(text.body, /# \{trace_id=|# EOF/, 'the default text format is unchanged: no exemplars');
  t.match(text.body, /^actionledger_dispatch_enqueue_to_outcome_seconds_bucket\{/m);
  const names = (body: string) =>
    [...new Set([...body.matchAll(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/gm)].map((m) => m[1]))]
      .filter((n) => !n?.endsWith('_created'))
      .sort();
  t.same(names(open.body), names(text.body), 'the same series names in both formats');

  process.kill(service.pid, 'SIGTERM');
  t.match(await service.exited, { code: 0 }, 'SIGTERM: exit 0');
});
