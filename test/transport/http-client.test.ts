import { createHash } from 'node:crypto';
import { createServer, type Socket } from 'node:net';
import { inspect } from 'node:util';
import t, { type Test } from 'tap';
import {
  assertTlsVerificationEnabled,
  createMtlsAgent,
  getJson,
  postJson,
  type HttpOutcome,
} from '../../transport/http-client.js';
import { SandboxProvider } from '../../sandbox/provider.js';
import { startProvider, testAgent, testPki } from '../helpers/sandbox.js';

const TOKEN = 'provider-token';
const body = JSON.stringify({ order_id: 'ord-1', amount: 1000, currency: 'EUR' });
const call = (key: string, extra: Record<string, string> = {}) => ({
  headers: { authorization: `Bearer ${TOKEN}`, 'idempotency-key': key, ...extra },
  body,
  timeoutMs: 2_000,
  maxBytes: 64 * 1024,
});

function expectKind<K extends HttpOutcome['kind']>(
  t: Test,
  out: HttpOutcome,
  kind: K,
): Extract<HttpOutcome, { kind: K }> {
  t.equal(out.kind, kind, `outcome kind (${out.kind}/${'code' in out ? out.code : ''})`);
  if (out.kind !== kind) {
    const cause: unknown = ('cause' in out && out.cause) || '';
    throw new Error(
      `expected ${kind}, got ${JSON.stringify({ ...out, cause: typeof cause === 'string' ? cause : inspect(cause) })}`,
    );
  }
  return out as Extract<HttpOutcome, { kind: K }>;
}

t.test('happy path over mTLS: 201 receipt, headers and body hash; the provider saw the token and key', async (t) => {
  const provider = await startProvider(t, { token: TOKEN });
  const agent = await testAgent(t);
  const res = expectKind(t, await postJson(agent, provider.endpoint, call('key-1')), 'response');
  t.equal(res.status, 201);
  t.match(res.json, { operation_id: /^op_/, status: 'applied' });
  t.match(res.headers['x-request-id'], /^req_/);
  t.equal(res.bodySha256, createHash('sha256').update(JSON.stringify(res.json)).digest('hex'));
  const [seen] = provider.requests();
  t.equal(seen?.headers.authorization, `Bearer ${TOKEN}`);
  t.equal(seen?.headers['idempotency-key'], 'key-1');
  t.equal(seen?.body, body, 'the body went byte for byte');
  t.equal(seen?.clientCommonName, 'test-dispatcher');

  const again = expectKind(t, await postJson(agent, provider.endpoint, call('key-1')), 'response');
  t.same(again.json, res.json, 'a replay returns the same receipt');
  t.equal(provider.requestsFor('key-1'), 2);
  t.equal(provider.effectsFor('key-1'), 1);
});

t.test('the URL host is verified against the SANs: localhost and 127.0.0.1 both work', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  const byIp = await postJson(agent, `https://127.0.0.1:${provider.port}${provider.path}`, call('ip'));
  t.equal(expectKind(t, byIp, 'response').status, 201);
});

t.test('the server refuses a client without a certificate or with one from another CA: not sent', async (t) => {
  const provider = await startProvider(t);
  const p = await testPki();
  for (const [name, overrides] of [
    ['no client certificate', { cert: undefined, key: undefined }],
    ['client certificate from another CA', p.otherClient],
    ['expired client certificate', p.expiredClient],
  ] as const) {
    const agent = await testAgent(t, overrides);
    const out = expectKind(t, await postJson(agent, provider.endpoint, call(`k-${name}`)), 'not_sent');
    t.equal(out.code, 'tls', name);
  }
  t.equal(provider.requests().length, 0, 'no request reached the provider');
  t.equal(provider.allEffects().length, 0);
});

t.test('the client refuses a server certificate it cannot trust for the host: not sent', async (t) => {
  const p = await testPki();
  const cases = [
    [
      'server certificate from another CA',
      p.otherServer,
      ['SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY'],
    ],
    ['wrong host name', p.wrongHostServer, ['ERR_TLS_CERT_ALTNAME_INVALID']],
    ['expired server certificate', p.expiredServer, ['CERT_HAS_EXPIRED']],
  ] as const;
  for (const [name, serverCert, codes] of cases) {
    const provider = await startProvider(t, { serverCert });
    const agent = await testAgent(t);
    const out = expectKind(t, await postJson(agent, provider.endpoint, call('k')), 'not_sent');
    t.equal(out.code, 'tls', name);
    t.ok((codes as readonly string[]).includes(out.errorCode ?? ''), `${name}: ${out.errorCode}`);
    t.equal(provider.requests().length, 0, `${name}: nothing reached the provider`);
  }
});

t.test('connection refused: not sent', async (t) => {
  const p = await testPki();
  const gone = new SandboxProvider({ tls: { ...p.server, ca: p.ca.cert } });
  await gone.start();
  const url = gone.endpoint;
  await gone.stop();
  const agent = await testAgent(t);
  const out = expectKind(t, await postJson(agent, url, call('k')), 'not_sent');
  t.equal(out.code, 'refused');
  t.equal(out.errorCode, 'ECONNREFUSED');
});

t.test('a peer that accepts TCP but never completes TLS: not sent / connect_timeout', async (t) => {
  const sockets = new Set<Socket>();
  const silent = createServer((s) => void sockets.add(s.on('error', () => undefined)));
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    silent.close();
  });
  const port = (silent.address() as { port: number }).port;
  const agent = await testAgent(t, { connectTimeoutMs: 100 });
  const out = expectKind(
    t,
    await postJson(agent, `https://localhost:${port}/v1/refunds`, { ...call('k'), timeoutMs: 1_000 }),
    'not_sent',
  );
  t.equal(out.code, 'connect_timeout');
  t.equal(out.errorCode, 'UND_ERR_CONNECT_TIMEOUT');
});

t.test('proxy environment variables are ignored: the agent connects directly', async (t) => {
  const saved = { HTTPS_PROXY: process.env.HTTPS_PROXY, https_proxy: process.env.https_proxy };
  process.env.HTTPS_PROXY = process.env.https_proxy = 'http://127.0.0.1:1';
  t.teardown(() => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  t.equal(expectKind(t, await postJson(agent, provider.endpoint, call('k')), 'response').status, 201);
});

t.test('no answer, half headers, slow drip: unknown / timeout within the bound', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  for (const [fault, commits] of [
    [{ kind: 'timeout' }, false],
    [{ kind: 'hangHeaders' }, false],
    [{ kind: 'slowDrip', intervalMs: 100 }, true],
  ] as const) {
    const key = `k-${fault.kind}`;
    provider.inject(fault, { when: (k) => k === key }); // a request that never arrived leaves its fault unused
    const started = Date.now();
    const out = expectKind(t, await postJson(agent, provider.endpoint, { ...call(key), timeoutMs: 300 }), 'unknown');
    t.equal(out.code, 'timeout', fault.kind);
    t.ok(Date.now() - started < 3_000, `${fault.kind}: returned promptly`);
    // On a loaded machine the request may not even have arrived in time; when it did, the fault decided the effect.
    t.equal(
      provider.effectsFor(key),
      commits ? provider.requestsFor(key) : 0,
      `${fault.kind}: effects as the fault says`,
    );
  }
});

t.test('resets: unknown / reset; commitThenReset leaves exactly one effect that readback finds', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  provider.inject({ kind: 'resetBeforeCommit' });
  const before = expectKind(t, await postJson(agent, provider.endpoint, call('k-before')), 'unknown');
  t.equal(before.code, 'reset');
  t.equal(provider.effectsFor('k-before'), 0);

  provider.inject({ kind: 'commitThenReset' });
  const after = expectKind(t, await postJson(agent, provider.endpoint, call('k-after')), 'unknown');
  t.equal(after.code, 'reset');
  t.equal(provider.effectsFor('k-after'), 1, 'exactly one effect');
  const rb = expectKind(t, await getJson(agent, provider.readbackUrl('k-after'), call('k-after')), 'response');
  t.match(rb, { status: 200, json: { state: 'applied', operation_id: /^op_/ } });
  const none = expectKind(t, await getJson(agent, provider.readbackUrl('k-before'), call('k-before')), 'response');
  t.match(none, { status: 404, json: { state: 'no_effect' } });
});

t.test('oversized bodies: unknown / oversized, by Content-Length and by counting a chunked stream', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  for (const chunked of [false, true]) {
    provider.inject({ kind: 'oversized', bytes: 2 * 1024 * 1024, chunked });
    const out = expectKind(
      t,
      await postJson(agent, provider.endpoint, { ...call(`k-${chunked}`), maxBytes: 4096 }),
      'unknown',
    );
    t.equal(out.code, 'oversized', chunked ? 'chunked' : 'content-length');
    t.equal(out.status, 201);
  }
  provider.inject({ kind: 'oversized', bytes: 4000 });
  const fits = expectKind(
    t,
    await postJson(agent, provider.endpoint, { ...call('k-fits'), maxBytes: 4096 }),
    'response',
  );
  t.equal(fits.status, 201, 'a body under the cap is read');
});

t.test('duplicate keys and a non-object body: unknown / malformed_json', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  provider.inject({ kind: 'duplicateKeyJson' });
  const dup = expectKind(t, await postJson(agent, provider.endpoint, call('k-dup')), 'unknown');
  t.equal(dup.code, 'malformed_json');
  t.equal(dup.status, 201);
  provider.inject({ kind: 'status', status: 200, body: ['not', 'an', 'object'] });
  const arr = expectKind(t, await postJson(agent, provider.endpoint, call('k-arr')), 'unknown');
  t.equal(arr.code, 'malformed_json');
});

t.test('a redirect is reported, never followed', async (t) => {
  const provider = await startProvider(t);
  const elsewhere = await startProvider(t);
  const agent = await testAgent(t);
  provider.inject({ kind: 'redirect', location: elsewhere.endpoint });
  const out = expectKind(t, await postJson(agent, provider.endpoint, call('k')), 'unknown');
  t.equal(out.code, 'redirect');
  t.equal(out.status, 302);
  t.equal(out.location, elsewhere.endpoint);
  t.equal(elsewhere.requests().length, 0, 'the redirect target received nothing');
});

t.test('statuses and missing receipts are responses for the caller to judge', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  for (const status of [400, 422, 429, 500]) {
    provider.inject({ kind: 'status', status, body: { error: 'nope' } });
    const out = expectKind(t, await postJson(agent, provider.endpoint, call(`k-${status}`)), 'response');
    t.match(out, { status, json: { error: 'nope' } });
  }
  provider.inject({ kind: 'noReceipt' });
  const bare = expectKind(t, await postJson(agent, provider.endpoint, call('k-bare')), 'response');
  t.equal(bare.status, 201);
  t.notOk(bare.json !== null && 'operation_id' in bare.json, 'no operation_id');
  t.equal(bare.headers['x-request-id'], undefined, 'no x-request-id');
});

t.test('caller abort: before the call nothing is sent; during it the outcome is unknown', async (t) => {
  const provider = await startProvider(t);
  const agent = await testAgent(t);
  const pre = new AbortController();
  pre.abort();
  const out = expectKind(
    t,
    await postJson(agent, provider.endpoint, { ...call('k-pre'), signal: pre.signal }),
    'not_sent',
  );
  t.equal(out.code, 'aborted');
  t.equal(provider.requestsFor('k-pre'), 0);

  provider.inject({ kind: 'timeout' });
  const during = new AbortController();
  setTimeout(() => during.abort(), 100);
  const mid = expectKind(
    t,
    await postJson(agent, provider.endpoint, { ...call('k-mid'), signal: during.signal }),
    'unknown',
  );
  t.equal(mid.code, 'aborted');
});

t.test('requests that cannot be made are refused before any connection', async (t) => {
  const agent = await testAgent(t);
  for (const url of ['http://127.0.0.1:1/x', 'not a url']) {
    const out = expectKind(t, await postJson(agent, url, call('k')), 'not_sent');
    t.equal(out.code, 'invalid_request', url);
  }
  t.throws(() => createMtlsAgent({ cert: 'x', connectTimeoutMs: 100 }), { code: 'config_invalid' });
});

t.test('NODE_TLS_REJECT_UNAUTHORIZED=0 is refused at start-up', (t) => {
  t.throws(() => assertTlsVerificationEnabled({ NODE_TLS_REJECT_UNAUTHORIZED: '0' }), {
    code: 'tls_verification_disabled',
  });
  t.doesNotThrow(() => assertTlsVerificationEnabled({}));
  t.doesNotThrow(() => assertTlsVerificationEnabled({ NODE_TLS_REJECT_UNAUTHORIZED: '1' }));
  t.end();
});

t.test('tracing on: the trace context never replaces a header the caller set, in any case', async (t) => {
  const { W3CTraceContextPropagator } = await import('@opentelemetry/core');
  const { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } =
    await import('@opentelemetry/sdk-trace-node');
  const { disableTracing, enableTracing, inSpan, SpanKind } = await import('../../core/tracing.js');
  const exporter = new InMemorySpanExporter();
  const tracer = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  tracer.register({ propagator: new W3CTraceContextPropagator() });
  enableTracing();
  t.teardown(async () => {
    disableTracing();
    await tracer.shutdown();
  });
  const provider = await startProvider(t, { token: TOKEN });
  const agent = await testAgent(t);
  await inSpan('caller', SpanKind.SERVER, undefined, async () => {
    expectKind(t, await postJson(agent, provider.endpoint, call('key-t1', { Traceparent: 'key-t1' })), 'response');
    expectKind(t, await postJson(agent, provider.endpoint, call('key-t2')), 'response');
  });
  const [kept, injected] = provider.requests();
  t.equal(kept?.headers.traceparent, 'key-t1', "the caller's header, sent once and unchanged");
  t.match(injected?.headers.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/, 'else the span’s context');

  // The span records the scheme, host and port, and the path only from a configured template: a webhook's or a
  // readback's path may hold a capability token or an effect key.
  exporter.reset();
  const endpoint = new URL(provider.endpoint);
  const secretPath = `${endpoint.origin}/hooks/T0123/capability-token-xyz`;
  await inSpan('caller', SpanKind.SERVER, undefined, async () => {
    await postJson(agent, secretPath, { ...call('key-t3'), spanName: 'notification' });
    await postJson(agent, provider.endpoint, {
      ...call('key-t4'),
      spanName: 'provider',
      urlTemplate: `${endpoint.origin}/v1/refunds/{effect_key}?q=1`,
    });
  });
  const client = (name: string) => exporter.getFinishedSpans().find((s) => s.name === name);
  const notification = client('POST notification');
  t.equal(notification?.attributes['url.full'], endpoint.origin, 'no path without a template');
  t.equal(notification?.attributes['url.template'], undefined);
  t.notMatch(JSON.stringify(notification?.attributes), /capability-token|hooks/, 'the token is not recorded');
  const templated = client('POST provider');
  t.equal(templated?.attributes['url.template'], '/v1/refunds/{effect_key}', 'the template’s path, no query');
  t.notMatch(JSON.stringify(templated?.attributes), /key-t4/);
});
